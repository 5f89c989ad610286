"""The numpy learner step (``--learner_backend=numpy``) against the torch step it stands in for: the same batch,
the same shuffles, and after each update the same weights, Adam state and statistics, within float32 rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import run_train
from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import Config, ConfigError
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.trainer import TorchStep
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.step import NumpyStep, choose_learner_backend

NUM_TRAJECTORIES, HORIZON = 8, 16
OBS_SPEC = ObsSpec({"joints": (5,), "target": (3,)}, {"joints": torch.float32, "target": torch.float32})
GAUSSIAN = ActionSpec(discrete=False, dim=2, low=(-1.0, -1.0), high=(1.0, 1.0))
CATEGORICAL = ActionSpec(discrete=True, num_actions=3)


def make_config(backend: str, **options) -> Config:
    cfg = Config()
    cfg.learner.learner_backend = backend
    cfg.learner.batch_size, cfg.learner.num_batches_per_epoch, cfg.learner.num_epochs = 32, 4, 3
    cfg.learner.learning_rate, cfg.learner.entropy_coeff, cfg.learner.max_grad_norm = 3e-3, 0.01, 0.5
    cfg.model.hidden_sizes = [16, 16]
    cfg.run.train_for_env_steps = 1000
    for name, value in options.items():
        cfg.set(name, value)
    return cfg


def make_batch(action_spec: ActionSpec, seed: int) -> TrajectoryBuffers:
    generator = torch.Generator().manual_seed(seed)
    batch = TrajectoryBuffers.allocate(NUM_TRAJECTORIES, HORIZON, OBS_SPEC, action_spec, shared=False)
    for obs in batch.obs.values():
        obs[:] = 2.0 + 3.0 * torch.randn(obs.shape, generator=generator)
    if action_spec.discrete:
        batch.actions[:] = torch.randint(0, action_spec.num_actions, batch.actions.shape, generator=generator)
        batch.log_probs[:] = torch.log(torch.tensor(1 / 3)) + 0.3 * torch.randn(
            batch.log_probs.shape, generator=generator
        )
    else:
        batch.actions[:] = torch.randn(batch.actions.shape, generator=generator)
        batch.log_probs[:] = -2.5 + 0.5 * torch.randn(batch.log_probs.shape, generator=generator)
    batch.rewards[:] = torch.randn(batch.rewards.shape, generator=generator)
    batch.values[:] = torch.randn(batch.values.shape, generator=generator)
    batch.terminated[:] = torch.rand(batch.terminated.shape, generator=generator) < 0.1
    return batch


def trainers(action_spec: ActionSpec, **options) -> tuple[PPOTrainer, PPOTrainer]:
    torch.manual_seed(0)
    cfg = make_config("torch", **options)
    model = ActorCritic(OBS_SPEC, action_spec, cfg.model)
    with torch.no_grad():  # a log-std away from its clamp and observation statistics that matter
        if hasattr(model, "log_std"):
            model.log_std.copy_(torch.tensor([-0.3, 0.2]))
    model.update_normalizers(make_batch(action_spec, 99).obs)
    numpy_trainer = PPOTrainer(copy.deepcopy(model), make_config("numpy", **options))
    torch_trainer = PPOTrainer(model, cfg)
    assert isinstance(numpy_trainer.backend, NumpyStep) and isinstance(torch_trainer.backend, TorchStep)
    return torch_trainer, numpy_trainer


def train_both(torch_trainer: PPOTrainer, numpy_trainer: PPOTrainer, batch_seed: int, version: int = 1):
    results = []
    for trainer in (torch_trainer, numpy_trainer):
        torch.manual_seed(batch_seed)  # the same shuffles
        results.append(trainer.train(make_batch(trainer.model.action_spec, batch_seed), version, 100 * version))
    return results


def assert_same_state(torch_trainer: PPOTrainer, numpy_trainer: PPOTrainer) -> None:
    for (name, expected), actual in zip(
        torch_trainer.model.state_dict().items(), numpy_trainer.model.state_dict().values()
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=2e-5, msg=lambda m, name=name: f"{name}: {m}")
    expected_state = torch_trainer.optimizer.state_dict()["state"]
    actual_state = numpy_trainer.optimizer.state_dict()["state"]
    assert actual_state.keys() == expected_state.keys()
    for index, expected in expected_state.items():
        assert float(actual_state[index]["step"]) == float(expected["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(actual_state[index][key], expected[key], rtol=1e-3, atol=1e-7)


CASES = {
    "gaussian_separate_tanh": (GAUSSIAN, {"actor_critic": "separate"}),
    "gaussian_shared_relu_value_clip": (
        GAUSSIAN,
        {"actor_critic": "shared", "activation": "relu", "ppo_clip_value": 0.2, "normalize_returns": False},
    ),
    "categorical_separate_elu": (CATEGORICAL, {"actor_critic": "separate", "activation": "elu"}),
    "gaussian_vtrace": (GAUSSIAN, {"advantage": "vtrace"}),
    "gaussian_recomputed_advantages": (GAUSSIAN, {"recompute_advantages": True, "ppo_clip_value": 0.5}),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_numpy_step_updates_the_model_as_the_torch_step_does(case):
    action_spec, options = CASES[case]
    torch_trainer, numpy_trainer = trainers(action_spec, **options)
    for version, batch_seed in enumerate((1, 2), start=1):  # the second update starts from Adam's saved moments
        torch_stats, numpy_stats = train_both(torch_trainer, numpy_trainer, batch_seed, version)
        assert_same_state(torch_trainer, numpy_trainer)
        assert numpy_stats.keys() == torch_stats.keys()
        for name, expected in torch_stats.items():
            assert numpy_stats[name] == pytest.approx(expected, rel=2e-3, abs=1e-5), name
    moved = [
        not torch.equal(a, b)
        for a, b in zip(torch_trainer.model.parameters(), trainers(action_spec, **options)[0].model.parameters())
    ]
    assert all(moved)  # every parameter trained, so every gradient was compared


def test_numpy_step_in_a_critic_warm_up_leaves_the_policy_bit_identical():
    torch_trainer, numpy_trainer = trainers(GAUSSIAN, critic_warmup_batches=1)
    policy_before = [p.clone() for p in numpy_trainer.model.policy_parameters()]
    train_both(torch_trainer, numpy_trainer, batch_seed=1, version=0)  # version 0 < 1: warming up
    for before, after in zip(policy_before, numpy_trainer.model.policy_parameters()):
        assert torch.equal(before, after)
    assert_same_state(torch_trainer, numpy_trainer)
    train_both(torch_trainer, numpy_trainer, batch_seed=2, version=1)  # the policy trains from here on
    assert not torch.equal(policy_before[0], numpy_trainer.model.policy_parameters()[0])
    assert_same_state(torch_trainer, numpy_trainer)


def test_numpy_step_skips_a_non_finite_step_as_the_torch_step_does():
    torch_trainer, numpy_trainer = trainers(GAUSSIAN)
    before = copy.deepcopy(numpy_trainer.model.state_dict())
    batch = make_batch(GAUSSIAN, 1)
    batch.rewards[0, 3] = float("nan")
    stats = numpy_trainer.train(batch, 1, 100)
    assert stats["nonfinite_steps"] > 0
    for name, value in numpy_trainer.model.state_dict().items():
        assert torch.isfinite(value).all(), name
    assert any(not torch.equal(before[name], value) for name, value in numpy_trainer.model.state_dict().items())


def test_auto_picks_numpy_for_mlp_policies_and_torch_where_numpy_cannot_train():
    model = ActorCritic(OBS_SPEC, GAUSSIAN, make_config("auto").model)
    assert choose_learner_backend(make_config("auto"), model) == "numpy"
    assert choose_learner_backend(make_config("auto", clip_mode="sapo"), model) == "torch"
    image_spec = ObsSpec({"camera": (16, 16, 3)}, {"camera": torch.uint8})
    image_model = ActorCritic(image_spec, GAUSSIAN, make_config("auto").model)
    assert choose_learner_backend(make_config("auto"), image_model) == "torch"
    with pytest.raises(ConfigError, match="--learner_backend=numpy cannot train this policy: image observations"):
        choose_learner_backend(make_config("numpy"), image_model)
    dependent = make_config("numpy", continuous_log_std="state_dependent")
    with pytest.raises(ConfigError, match="state-dependent log-std"):
        choose_learner_backend(dependent, ActorCritic(OBS_SPEC, GAUSSIAN, dependent.model))


def test_numpy_learner_on_a_policy_it_cannot_train_is_a_one_line_error_that_touches_nothing(train_dir):
    result = run_train(train_dir, "sapo", "--env=CartPole-v1", "--learner_backend=numpy", "--clip_mode=sapo")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: --learner_backend=numpy cannot train this policy: --clip_mode=sapo runs in torch "
        "(numpy has ppo_clip); use --learner_backend=auto"
    ]
    assert not (train_dir / "sapo").exists()
