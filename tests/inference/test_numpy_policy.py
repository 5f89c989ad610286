"""The inference workers' numpy policy is the torch model's policy: the same means, values and log-probs, the same
distribution of draws, and it follows weights pulled into the model."""

from __future__ import annotations

import json
import subprocess
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

from helpers import run_train, train_command
from sfengine.config import ConfigError, ModelConfig, parse_config
from sfengine.engine.buffers import SharedWeights
from sfengine.env.spaces import action_spec_from_space, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.policy import NumpyPolicy, choose_inference_backend
from sfengine.numpy_backend.step import choose_learner_backend

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
TWO_KEYS = gym.spaces.Dict(
    {"proprio": gym.spaces.Box(-5.0, 5.0, (5,), np.float32), "task": gym.spaces.Box(0.0, 1.0, (2,), np.float32)}
)
MODELS = {
    "tanh-separate-gaussian": (BOX, dict(actor_critic="separate"), True),
    "relu-shared-state-dependent-std": (BOX, dict(activation="relu", continuous_log_std="state_dependent"), True),
    "elu-discrete": (gym.spaces.Discrete(4), dict(activation="elu"), True),
    "critic-free": (BOX, dict(), False),
    "two-keys-unnormalised": (BOX, dict(normalize_input=False, normalize_returns=False), True),
}


def trained_looking_model(action_space: gym.Space, obs_space: gym.Space, options: dict, critic: bool) -> ActorCritic:
    """A model whose every part matters: O(1) weights, moved observation and return statistics."""
    torch.manual_seed(0)
    obs_spec, action_spec = obs_spec_from_space(obs_space), action_spec_from_space(action_space)
    model = ActorCritic(obs_spec, action_spec, ModelConfig(**options), critic=critic)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    observations = random_obs(model, 256, scale=3.0, shift=1.0)
    model.update_normalizers({k: torch.from_numpy(v) for k, v in observations.items()})
    for _ in range(2):  # the second update rescales the value head (the first one only sets the units)
        model.update_return_normalizer(torch.randn(256) * 40.0 + 7.0)
    return model


def random_obs(model: ActorCritic, rows: int, scale: float = 1.0, shift: float = 0.0) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(rows)
    return {
        key: (generator.standard_normal((rows, *model.obs_spec.shapes[key])) * scale + shift).astype(np.float32)
        for key in model.vector_keys
    }


def model_for(name: str) -> ActorCritic:
    action_space, options, critic = MODELS[name]
    return trained_looking_model(action_space, TWO_KEYS if name.startswith("two-keys") else BOX, options, critic)


def torch_outputs(model: ActorCritic, obs: dict[str, np.ndarray]):
    with torch.inference_mode():
        params, values = model({key: torch.from_numpy(v) for key, v in obs.items()})
        actions, log_probs = model.mode(params)
    return params, actions.numpy(), log_probs.numpy(), values.numpy()


@pytest.mark.parametrize("name", list(MODELS))
def test_mode_log_probs_and_values_equal_the_torch_model(name):
    model = model_for(name)
    obs = random_obs(model, 16, scale=4.0)
    _, actions, log_probs, values = torch_outputs(model, obs)
    out = NumpyPolicy(model, seed=0).act(obs, deterministic=True)
    if model.value_head is not None:
        assert np.abs(values).max() > 1.0  # the comparison is about values with the return statistics applied
    np.testing.assert_allclose(out.actions, actions, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.log_probs, log_probs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.values, values, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(NumpyPolicy(model, seed=0).values(obs), values, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["tanh-separate-gaussian", "relu-shared-state-dependent-std"])
def test_gaussian_draws_have_the_torch_policys_mean_and_std_and_its_log_probs(name):
    model, draws = model_for(name), 100_000
    one = random_obs(model, 1)
    params, mean, _, _ = torch_outputs(model, one)
    with torch.no_grad():
        std = model._mean_log_std(params)[1].exp().numpy()[0]
    obs = {key: np.repeat(v, draws, axis=0) for key, v in one.items()}
    out = NumpyPolicy(model, seed=1).act(obs)
    # Standard error of the mean: std / sqrt(100k), about 0.3% of std: 2% of std is over 6 sigma.
    np.testing.assert_allclose(out.actions.mean(0), mean[0], atol=0.02 * std.max())
    np.testing.assert_allclose(out.actions.std(0), std, rtol=0.02)
    with torch.inference_mode():
        recomputed, _ = model.log_prob_entropy(params.expand(64, -1), torch.from_numpy(out.actions[:64]))
    np.testing.assert_allclose(out.log_probs[:64], recomputed.numpy(), rtol=1e-5, atol=1e-4)


def test_discrete_draws_follow_the_torch_policys_probabilities():
    model, draws = model_for("elu-discrete"), 100_000
    with torch.no_grad():
        model.policy_head.weight.mul_(0.1)  # logits of O(1): no action is nearly certain
    one = random_obs(model, 1)
    params, _, _, _ = torch_outputs(model, one)
    probs = torch.softmax(params[0], -1).numpy()
    assert probs.min() > 0.02 and probs.max() < 0.9  # every action is drawn often enough to be counted
    obs = {key: np.repeat(v, draws, axis=0) for key, v in one.items()}
    out = NumpyPolicy(model, seed=2).act(obs)
    frequencies = np.bincount(out.actions, minlength=4) / draws
    # Binomial standard error at 100k draws is at most 0.0016: 0.008 is 5 sigma.
    np.testing.assert_allclose(frequencies, probs, atol=0.008)
    np.testing.assert_allclose(out.log_probs, np.log(probs)[out.actions], rtol=1e-5, atol=1e-5)


def test_it_follows_weights_and_statistics_pulled_into_the_model():
    learner = model_for("tanh-separate-gaussian")
    weights = SharedWeights.allocate(learner)
    actor = trained_looking_model(BOX, BOX, dict(actor_critic="separate"), True)
    weights.publish(learner, version=0)
    weights.pull(actor)
    policy = NumpyPolicy(actor, seed=0)
    obs = random_obs(learner, 8, scale=4.0)
    before = policy.act(obs, deterministic=True)
    # The learner moves on: new weights, log-std, observation and return statistics.
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    learner.update_normalizers({"obs": torch.randn(512, 3) * 7.0 - 2.0})
    learner.update_return_normalizer(torch.randn(512) * 300.0)
    weights.publish(learner, version=1)
    assert weights.pull(actor) == 1
    policy.refresh()
    after = policy.act(obs, deterministic=True)
    _, actions, log_probs, values = torch_outputs(learner, obs)
    assert not np.allclose(after.actions, before.actions, atol=1e-3)
    np.testing.assert_allclose(after.actions, actions, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after.log_probs, log_probs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after.values, values, rtol=1e-5, atol=1e-3)


def test_auto_takes_numpy_for_mlps_on_cpu_and_torch_for_images_or_a_gpu():
    mlp = model_for("tanh-separate-gaussian")
    image_obs = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    cnn = ActorCritic(obs_spec_from_space(image_obs), action_spec_from_space(BOX), ModelConfig())
    assert choose_inference_backend(parse_config([]), mlp) == "numpy"
    assert choose_inference_backend(parse_config(["--inference_backend=torch"]), mlp) == "torch"
    assert choose_inference_backend(parse_config([]), cnn) == "torch"
    on_gpu = parse_config([])
    on_gpu.learner.device = "cuda"  # set after parsing, which refuses cuda on a machine without it
    assert choose_inference_backend(on_gpu, mlp) == "torch"
    with pytest.raises(ConfigError, match="--inference_backend=numpy cannot run this policy: image observations"):
        choose_inference_backend(parse_config(["--inference_backend=numpy"]), cnn)


class PushesLeft(ActorCritic):
    """A registered model's kind of change: a sample of its own over the built-in Linear and Tanh layers."""

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(params.shape[0], dtype=torch.int64), torch.log_softmax(params, dim=-1)[:, 0]


def test_a_subclass_acts_and_learns_in_torch_and_the_built_in_mlp_in_numpy():
    specs = obs_spec_from_space(BOX), action_spec_from_space(gym.spaces.Discrete(2))
    built_in, subclass = ActorCritic(*specs, ModelConfig()), PushesLeft(*specs, ModelConfig())
    cfg = parse_config([])
    # One check decides both: numpy would act with the built-in sample, not the subclass's.
    assert (choose_inference_backend(cfg, built_in), choose_learner_backend(cfg, built_in)) == ("numpy", "numpy")
    assert (choose_inference_backend(cfg, subclass), choose_learner_backend(cfg, subclass)) == ("torch", "torch")
    with pytest.raises(ConfigError, match=r"cannot run this policy: a registered model \(PushesLeft\)"):
        choose_inference_backend(parse_config(["--inference_backend=numpy"]), subclass)
    with pytest.raises(ValueError, match=r"a registered model \(PushesLeft\)"):
        NumpyPolicy(subclass, seed=0)


def test_numpy_backend_on_an_image_env_is_a_one_line_error(train_dir):
    result = run_train(train_dir, "image", "--env=image_bandit", "--inference_backend=numpy")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: --inference_backend=numpy cannot run this policy: image observations (image) need "
        "the CNN encoders, which run in torch; use --inference_backend=auto"
    ]


RATIO_RECORDING_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from sfengine.algorithms.ppo import trainer as ppo_trainer
    from sfengine.numpy_backend import step as numpy_step
    from sfengine.train import main

    real_train, real_loss, real_step, first = (
        ppo_trainer.PPOTrainer.train, ppo_trainer.ppo_loss, numpy_step.NumpyStep.__call__, []
    )


    def record(deviation):
        with open({log!r}, "a") as f:
            f.write(json.dumps(deviation) + "\\n")


    def train(self, *args, **kwargs):
        first.append(True)
        return real_train(self, *args, **kwargs)


    def loss(log_probs, old_log_probs, *args, **kwargs):  # the torch learner's first minibatch of each batch
        if first and first.pop():
            record(float((log_probs - old_log_probs).detach().exp().sub(1).abs().max()))
        return real_loss(log_probs, old_log_probs, *args, **kwargs)


    def step(self, *args, **kwargs):  # the numpy learner's: the ratio's range before the step
        stats = real_step(self, *args, **kwargs)
        if first and first.pop():
            record(max(stats.diagnostics["ratio_max"] - 1, 1 - stats.diagnostics["ratio_min"]))
        return stats


    # Top level: spawned processes import this module too, so the learner process records as well.
    ppo_trainer.PPOTrainer.train, ppo_trainer.ppo_loss, numpy_step.NumpyStep.__call__ = train, loss, step

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize(("backend", "learner_backend"), [("numpy", "numpy"), ("torch", "torch"), ("numpy", "torch")])
@pytest.mark.slow
def test_a_synchronous_run_acts_with_the_learners_policy_at_every_batch(tmp_path, train_dir, backend, learner_backend):
    # Synchronous (policy lag 0): every batch was acted by the weights and observation statistics the learner holds
    # when it starts on it, so its first minibatch's ratio is 1 up to float32 rounding. The inference worker must
    # take every published version whole, the normaliser's statistics and the action std included.
    log, script = tmp_path / "ratios.jsonl", tmp_path / "record_ratios.py"
    script.write_text(RATIO_RECORDING_SCRIPT.format(log=str(log)))
    command = train_command(
        train_dir,
        backend,
        "--cfg=mujoco",
        "--env=InvertedPendulum-v5",
        "--num_workers=2",
        "--num_envs_per_worker=4",
        "--async_rl=false",
        "--rollout=32",
        "--batch_size=256",
        "--num_batches_per_epoch=2",
        "--train_for_env_steps=4096",
        f"--inference_backend={backend}",
        f"--learner_backend={learner_backend}",
    )
    command[1:3] = [str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    deviations = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(deviations) >= 6, deviations  # 8 batches of 512 samples; the last may be cut short by the stop
    assert max(deviations) < 1e-4, deviations


class ZeroDraws:
    """An rng whose exponential draws are all exactly 0: the rare draw that float32 sampling can make."""

    def standard_exponential(self, shape, dtype):
        return np.zeros(shape, dtype)


def test_an_exponential_draw_of_zero_neither_warns_nor_overrides_the_policy():
    model = model_for("elu-discrete")
    obs = random_obs(model, 16, scale=4.0)
    _, modes, _, _ = torch_outputs(model, obs)
    assert len(set(modes.tolist())) > 1  # the mode differs between rows, so it is not the first action by chance
    policy = NumpyPolicy(model, seed=0)
    policy.rng = ZeroDraws()
    with np.errstate(all="raise"):
        out = policy.act(obs)
    # Equal noise on every action leaves the mode; an infinite one would make every action tie (argmax: action 0).
    np.testing.assert_array_equal(out.actions, modes)
