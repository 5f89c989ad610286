"""SAC and TD3 (``--algo=sac|td3``): the squashed Gaussian's density, TD3's noise and target smoothing, the replay
ratio the learner holds, a resume that goes on with the same networks, optimisers and temperature, truncations
bootstrapped from the episode's own last observation through the real engine, and learning Pendulum in
multi-process mode."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from helpers import reached_target, read_summary, run_train, train_command
from sfengine.algorithms.offpolicy import trainer as trainer_module
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.algorithms.sac.trainer import SACTrainer
from sfengine.algorithms.td3.actor import DeterministicActor
from sfengine.algorithms.td3.trainer import TD3Trainer
from sfengine.config import Config, ConfigError, parse_config
from sfengine.demos import Demo, DemoSet, write_demos
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.engine.distributed import RankInfo
from sfengine.engine.sizing import env_step_seconds
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.train import algorithm_layout, wants_layout

OBS_SPEC = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
ACTION_SPEC = ActionSpec(discrete=False, dim=2, low=(-2.0, 0.0), high=(2.0, 1.0))
ROLLOUT = 8


def sac_config(algo: str = "sac", **options) -> Config:
    cfg = parse_config([f"--algo={algo}", "--env=Pendulum-v1", f"--rollout={ROLLOUT}", "--batch_size=32"])
    cfg.set("hidden_sizes", [32, 32])
    cfg.set("critic_hidden_sizes", [32, 32])
    cfg.set("learning_starts", 0)
    for name, value in options.items():
        cfg.set(name, value)
    return cfg


def make_trainer(algo: str = "sac", **options) -> SACTrainer | TD3Trainer:
    cfg = sac_config(algo, **options)
    if algo == "td3":
        return TD3Trainer(DeterministicActor.build(cfg, OBS_SPEC, ACTION_SPEC), cfg)
    return SACTrainer(SquashedGaussianActor.build(cfg, OBS_SPEC, ACTION_SPEC), cfg)


def batch(seed: int, trajectories: int = 4) -> TrajectoryBuffers:
    generator = torch.Generator().manual_seed(seed)
    out = TrajectoryBuffers.allocate(trajectories, ROLLOUT, OBS_SPEC, ACTION_SPEC, shared=False, final_obs=True)
    out.obs["obs"][:] = torch.randn(out.obs["obs"].shape, generator=generator)
    out.final_obs["obs"][:] = torch.randn(out.final_obs["obs"].shape, generator=generator)
    out.actions[:] = torch.rand(out.actions.shape, generator=generator) * torch.tensor([4.0, 1.0]) + torch.tensor(
        [-2, 0]
    )
    out.rewards[:] = torch.randn(out.rewards.shape, generator=generator)
    out.terminated[:, 3] = True
    out.truncated[:, 5] = True
    out.chunk_steps[:] = 1
    return out


def test_the_squashed_gaussian_acts_inside_the_box_with_the_density_it_reports():
    torch.manual_seed(0)
    actor = SquashedGaussianActor.build(sac_config(), OBS_SPEC, ACTION_SPEC)
    obs = {"obs": torch.randn(500, 3) * 3}
    params = actor.policy_params(obs)
    actions, log_probs = actor.sample(params)
    assert (actions[:, 0].abs() < 2).all() and (actions[:, 1] > 0).all() and (actions[:, 1] < 1).all()
    again, entropy = actor.log_prob_entropy(params, actions)
    assert torch.allclose(again, log_probs, atol=1e-3)  # the density of the drawn action, read back through atanh
    mode, _ = actor.mode(params)
    mean, _ = actor._mean_log_std(params)
    assert torch.allclose(mode, torch.tensor([0.0, 0.5]) + torch.tensor([2.0, 0.5]) * torch.tanh(mean))
    # One dimension, numerically: the density integrates to 1 over the box.
    one = SquashedGaussianActor(
        ObsSpec({"obs": (1,)}, {"obs": torch.float32}),
        ActionSpec(False, dim=1, low=(-3.0,), high=(1.0,)),
        sac_config().model,
    )
    grid = torch.linspace(-3 + 1e-4, 1 - 1e-4, 20001)[:, None]
    params = one.policy_params({"obs": torch.zeros(len(grid), 1)})
    density = one.log_prob_entropy(params, grid)[0].exp()
    assert torch.trapezoid(density, grid.squeeze(1)).item() == pytest.approx(1.0, abs=2e-3)
    # The actor's loss reaches its weights through the sample (the reparameterisation).
    actor.sample(actor.policy_params(obs))[0].sum().backward()
    assert actor.policy_head.weight.grad.abs().sum() > 0


def test_the_learner_takes_replay_ratio_gradient_steps_per_env_step_after_learning_starts():
    trainer = make_trainer(replay_ratio=0.75, learning_starts=64)
    rounds = [trainer.train(batch(seed), 0, 0) for seed in range(5)]
    # Each batch: 4 trajectories x 8 steps = 32 env steps. Nothing before 64 are in; then 0.75 x 32 = 24 a batch.
    assert [stats["gradient_steps"] for stats in rounds] == [0, 24, 24, 24, 24]
    assert rounds[-1]["replay_ratio_achieved"] == 0.75  # 96 steps for the 128 env steps since it began
    # The new data's mean reward: its taken entries' (not the bootstrap entry, nor a step no env took).
    data = batch(7)
    data.chunk_steps[0, 2] = 0
    taken = torch.cat([data.rewards[0, :2], data.rewards[0, 3:-1], data.rewards[1:, :-1].flatten()])
    assert make_trainer().train(data, 0, 0)["reward_mean"] == pytest.approx(float(taken.mean()))
    trainer = make_trainer(replay_ratio=0.1)
    assert [trainer.train(batch(seed), 0, 0)["gradient_steps"] for seed in range(5)] == [3, 3, 3, 3, 4]  # 3.2 each


def quarter_shares(unit_actions):
    """The share of actions in each quarter of [-1, 1], per dimension: [4, dims]."""
    return torch.stack(
        [((unit_actions >= lo) & (unit_actions < lo + 0.5)).float().mean(0) for lo in (-1, -0.5, 0, 0.5)]
    )


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_agent_acts_uniformly_at_random_until_the_first_gradient_step(algo):
    trainer = make_trainer(algo, learning_starts=64)
    model, obs = trainer.model, {"obs": torch.randn(8000, 3)}
    torch.manual_seed(0)
    with torch.inference_mode():
        acted = model.act(obs)
        mode = model.act(obs, deterministic=True).actions
    assert torch.allclose(quarter_shares(model.to_unit(acted.actions)), torch.tensor(0.25), atol=0.015)
    assert torch.allclose(acted.log_probs, torch.tensor(-math.log(4.0 * 1.0)))  # the box's density: 1 / (4 x 1)
    assert torch.equal(mode, model.mode(model.policy_params(obs))[0])  # evaluation takes the policy's mode
    # The learner's first gradient step (the second batch: 64 env steps in) hands acting to the policy.
    trainer.train(batch(0), 0, 0)
    assert model.acts_uniformly == 1
    trainer.train(batch(1), 1, 0)
    torch.manual_seed(1)
    with torch.inference_mode():
        acted = model.act(obs).actions
    torch.manual_seed(1)
    with torch.inference_mode():
        sampled = model.sample(model.policy_params(obs))[0]
    assert model.acts_uniformly == 0 and torch.equal(acted, sampled)
    assert not torch.allclose(quarter_shares(model.to_unit(acted)), torch.tensor(0.25), atol=0.015)
    # Asked for, or starting from trained weights, the agent acts with its policy from the start; a checkpoint
    # written before the flag was kept loads as a policy that acts as itself.
    assert make_trainer(algo, initial_actions="policy").model.acts_uniformly == 0
    assert make_trainer(algo, init_from="run/checkpoints/latest.pt").model.acts_uniformly == 0
    fresh = make_trainer(algo).model
    old = {name: value for name, value in fresh.state_dict().items() if name != "acts_uniformly"}
    fresh.load_state_dict(old)
    assert fresh.acts_uniformly == 0


def test_a_run_that_stops_before_it_learns_says_why(caplog):
    # A fresh run whose --learning_starts lies beyond its end; then one that does learn: no warning.
    trainer = make_trainer(learning_starts=64, train_for_env_steps=48)
    with caplog.at_level("WARNING", logger="sfengine.algorithms.offpolicy.trainer"):
        trainer.train(batch(0), 0, 0)
        trainer.train(batch(1), 0, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "no gradient step before the run stops: the replay holds 0 env steps, --learning_starts=64 must be in before "
        "the first, and 48 env steps are left to --train_for_env_steps=48; raise --train_for_env_steps or lower "
        "--learning_starts"
    ]
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(learning_starts=64, train_for_env_steps=64).train(batch(0), 0, 0)
    assert not caplog.records
    # Resumed near its end without --save_replay: the replay is refilled from empty.
    state = copy.deepcopy(make_trainer(learning_starts=64).state_dict())
    state["env_steps_seen"] = 1000
    resumed = make_trainer(learning_starts=64, train_for_env_steps=1050)
    resumed.load_state_dict(state)
    with caplog.at_level("WARNING"):
        resumed.train(batch(0), 0, 0)
    assert (
        "(a resumed run refills it unless --save_replay kept it)" in caplog.text
        and "50 env steps are left" in caplog.text
    )
    # Learning starts, but the critics' warm-up takes every gradient step left: 0.5 x (100 - 64) = 18 <= 20.
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(learning_starts=64, train_for_env_steps=100, replay_ratio=0.5, critic_warmup_updates=20).train(
            batch(0), 0, 0
        )
    assert caplog.records[0].getMessage() == (
        "the actor will not move before the run stops: --critic_warmup_updates=20 gradient steps train the critics "
        "alone first, and the run takes about 18 in all by --train_for_env_steps=100 (--replay_ratio=0.5); raise "
        "--train_for_env_steps or lower --critic_warmup_updates"
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(learning_starts=64, train_for_env_steps=106, replay_ratio=0.5, critic_warmup_updates=20).train(
            batch(0), 0, 0
        )
    assert not caplog.records  # 21 steps: the actor takes one


def test_a_replay_of_failed_env_steps_only_takes_no_gradient_step_until_a_good_one_comes():
    # An env that returns NaN from its first step: the learner drew from a replay with nothing in it to learn from
    # and died with a traceback, before the run's check of non-finite steps could stop it with its own line.
    trainer = make_trainer(learning_starts=0)
    failed = batch(0)
    failed.truncated[:] = True
    failed.outcomes[:] = float("nan")  # how the rollout worker marks a failed step
    stats = trainer.train(failed, 0, 0)
    assert stats["gradient_steps"] == 0 and trainer.replay.good_steps() == 0 and trainer.owed == 0
    assert trainer.train(batch(1), 1, 0)["gradient_steps"] > 0  # learns once good steps are in


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_resumed_trainer_goes_on_with_the_same_critics_targets_optimisers_and_temperature(algo):
    trainer = make_trainer(algo, save_replay=True, actor_delay=2)
    for seed in range(3):
        trainer.train(batch(seed), seed, 0)
    state = copy.deepcopy(trainer.state_dict())
    actor_state = copy.deepcopy((trainer.model.state_dict(), trainer.optimizer.state_dict()))
    resumed = make_trainer(algo, save_replay=True, actor_delay=2)
    resumed.model.load_state_dict(actor_state[0])
    resumed.optimizer.load_state_dict(actor_state[1])
    resumed.load_state_dict(state)
    for t in (trainer, resumed):
        torch.manual_seed(7)
        t.train(batch(3), 3, 0)
    for name in ("critics", "target_critics"):
        for a, b in zip(getattr(trainer, name).parameters(), getattr(resumed, name).parameters(), strict=True):
            assert torch.equal(a, b), name
    for a, b in zip(trainer.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    if algo == "sac":
        assert torch.equal(trainer.log_alpha, resumed.log_alpha)
        moved = trainer.log_alpha.item() != math.log(trainer.options.init_temperature)
        assert moved  # the temperature moved, so its value and optimiser matter
    else:
        for a, b in zip(trainer.target_actor.parameters(), resumed.target_actor.parameters(), strict=True):
            assert torch.equal(a, b)


def test_a_resumed_run_learns_at_the_critic_rate_and_eps_its_command_gives_not_the_saved_ones():
    trainer = make_trainer("sac")
    trainer.train(batch(0), 0, 0)
    resumed = make_trainer("sac", critic_learning_rate=3e-4, adam_eps=1e-5)
    resumed.load_state_dict(copy.deepcopy(trainer.state_dict()))
    assert (trainer.critic_optimizer.param_groups[0]["lr"], trainer.critic_optimizer.param_groups[0]["eps"]) == (
        1e-3,
        1e-8,
    )
    for optimizer in (resumed.critic_optimizer, resumed.alpha_optimizer):
        assert (optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["eps"]) == (3e-4, 1e-5)
        assert optimizer.state  # the moments came with the checkpoint


def test_sac_rules_are_one_line_errors():
    with pytest.raises(ConfigError, match="--critic_subset=3 must be between 1 and --num_critics=2"):
        parse_config(["--algo=sac", "--critic_subset=3"])
    with pytest.raises(ConfigError, match="--clip_mode .* is an option of --algo=ppo, not of --algo=sac"):
        parse_config(["--algo=sac", "--clip_mode=sapo"])
    cfg = parse_config(["--algo=sac"])
    assert (cfg.learner.batch_size, cfg.learner.learning_rate, cfg.model.continuous_log_std) == (
        256,
        3e-4,
        "state_dependent",
    )
    assert parse_config(["--algo=sac", "--batch_size=64"]).learner.batch_size == 64  # a given value stays
    # SAC's critics and temperature learn at 1e-3, TD3's critics at 3e-4; a given rate stays.
    assert cfg.algorithm_options.critic_learning_rate == 1e-3
    assert parse_config(["--algo=td3"]).algorithm_options.critic_learning_rate == 3e-4
    assert parse_config(["--algo=sac", "--critic_learning_rate=3e-4"]).algorithm_options.critic_learning_rate == 3e-4


class SlowStepEnv(gym.Env):
    """A step of ``step_sec`` (a simulator slower than a gradient step) in a 2-dim box."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, step_sec: float):
        self.step_sec, self.steps = step_sec, 0

    def reset(self, seed=None, options=None):
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(self.step_sec)
        self.steps += 1
        return np.zeros(2, np.float32), 0.0, False, self.steps >= 3, {}


def test_sac_takes_few_envs_in_step_with_the_learner_on_a_cheap_env_where_nothing_gives_a_layout():
    one_rank, two_ranks = RankInfo(), RankInfo(world_size=2, local_world_size=2)
    cfg = parse_config(["--algo=sac", "--env=HalfCheetah-v5"])
    assert wants_layout(cfg, one_rank) and not wants_layout(cfg, two_ranks)
    cheetah = gym.make("HalfCheetah-v5")
    cheetah.reset(seed=0)
    line = algorithm_layout(cfg, env_step_seconds(cheetah, None))
    assert line.startswith("a cheap env (") and "give any of the layout's options for another" in line
    s = cfg.sampler
    assert (s.num_workers, s.num_envs_per_worker, s.worker_num_splits, s.async_rl, s.rollout) == (1, 4, 2, False, 16)
    assert "critic_layer_norm=False" in line and not cfg.algorithm_options.critic_layer_norm
    # So SAC's defaults on a cheap env are the MuJoCo preset's, whose 3-seed figures benchmarks/README.md reports.
    assert cfg.to_dict() == parse_config(["--cfg=sac_mujoco", "--env=HalfCheetah-v5"]).to_dict()
    # LayerNorm stays where it is asked for, or where the replay ratio is high (it keeps the critics from diverging).
    for given in (["--critic_layer_norm=true"], ["--replay_ratio=2"]):
        cfg = parse_config(["--algo=sac", "--env=HalfCheetah-v5", *given])
        assert "critic_layer_norm" not in algorithm_layout(cfg, 1e-5) and cfg.algorithm_options.critic_layer_norm
        assert cfg.sampler.num_envs_per_worker == 4
    # An env slower than a gradient step keeps the engine's many asynchronous envs: there the envs set the pace.
    slow = SlowStepEnv(0.002)
    slow.reset()
    cfg = parse_config(["--algo=td3", "--env=HalfCheetah-v5"])
    assert algorithm_layout(cfg, env_step_seconds(slow, None)) is None and slow.steps < 3  # reset at its limit
    assert (cfg.sampler.num_workers, cfg.sampler.num_envs_per_worker, cfg.sampler.async_rl) == (2, 8, True)
    # A layout given anywhere stays whole: on the command line, in --cfg, in the env's own preset (LIBERO's).
    for given in (["--num_envs_per_worker=8"], ["--rollout=64"], ["--cfg=sac_mujoco"], ["--env=libero_object"]):
        assert not wants_layout(parse_config(["--algo=td3", "--env=HalfCheetah-v5", *given]), one_rank), given
    assert not wants_layout(parse_config(["--env=HalfCheetah-v5"]), one_rank)  # PPO keeps the engine's
    # A layout that would not fit the run's other options is not taken.
    cfg = parse_config(["--algo=sac", "--env=HalfCheetah-v5", "--batch_size=40", "--num_batches_per_epoch=4"])
    assert algorithm_layout(cfg, 1e-5) is None and cfg.sampler.rollout == 32 and cfg.algorithm_options.critic_layer_norm


@pytest.mark.slow
def test_a_cheap_env_layout_is_printed_saved_and_kept_on_resume(train_dir):
    args = ["--algo=sac", "--env=sparse_reach", "--learning_starts=256", "--hidden_sizes=16,16"]
    first = run_train(train_dir, "layout", *args, "--train_for_env_steps=512")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "a cheap env (" in first.stdout and "1 rollout workers x 4 envs" in first.stdout
    saved = json.loads((train_dir / "layout" / "config.json").read_text())
    assert saved["offpolicy"]["critic_layer_norm"] is False
    saved = saved["sampler"]
    assert (saved["num_workers"], saved["num_envs_per_worker"], saved["async_rl"], saved["rollout"]) == (
        1,
        4,
        False,
        16,
    )
    resumed = run_train(train_dir, "layout", *args, "--train_for_env_steps=1024")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "a cheap env (" not in resumed.stdout and "1 rollout workers x 4 envs" in resumed.stdout
    assert read_summary(train_dir, "layout")["env_steps"] >= 1024


RECORDING_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from sfengine.algorithms.sac import trainer as sac_trainer
    from sfengine.train import main

    real = sac_trainer.SACTrainer.train


    def recording(self, batch, learner_version, env_steps):
        with open({log!r}, "a") as f:
            f.write(json.dumps({{
                "obs": batch.obs["obs"][..., 0].tolist(),
                "final_obs": batch.final_obs["obs"][..., 0].tolist(),
                "truncated": batch.truncated.tolist(),
                "chunk_steps": batch.chunk_steps.tolist(),
            }}) + "\\n")
        return real(self, batch, learner_version, env_steps)


    sac_trainer.SACTrainer.train = recording

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 4])
def test_a_truncated_episode_bootstraps_from_its_own_last_observation_through_the_engine(tmp_path, train_dir, chunk):
    # chunk_probe_truncated: the observation counts the episode's steps; a time limit ends it after 6, and the
    # next entry of the trajectory is the next episode's first observation (0). In chunks of 4 the second chunk
    # is cut after 2 env steps.
    log, script = tmp_path / "batches.jsonl", tmp_path / "record.py"
    script.write_text(RECORDING_SCRIPT.format(log=str(log)))
    command = train_command(train_dir, "sac_probe", "--algo=sac", "--env=chunk_probe_truncated", "--rollout=16")
    command[1:3] = [str(script)]
    command += ["--num_workers=2", "--num_envs_per_worker=2", "--train_for_env_steps=512", "--learning_starts=256"]
    command += ["--batch_size=64", "--hidden_sizes=16,16", "--critic_hidden_sizes=16,16", f"--action_chunk={chunk}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # The cut entry: its first observation, its final one, the next entry's, the env steps it took.
    expected = {1: (5.0, 6.0, 0.0, 1), 4: (4.0, 6.0, 0.0, 2)}[chunk]
    truncations = 0
    for record in map(json.loads, log.read_text().splitlines()):
        rows = zip(record["obs"], record["final_obs"], record["truncated"], record["chunk_steps"], strict=True)
        for obs, final, truncated, taken in rows:
            for t, cut in enumerate(truncated[:-1]):
                if cut:
                    truncations += 1
                    assert (obs[t], final[t], obs[t + 1], taken[t]) == expected
                else:
                    assert final[t] == 0.0 and taken[t] == chunk
    assert truncations >= 512 // 6 - 8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flow", "lag_limit"),
    [
        # Two workers acting asynchronously: the acting policy may be some batches behind.
        (["--num_workers=2", "--num_envs_per_worker=2", "--rollout=16"], math.inf),
        # The cheap-env preset: 4 envs waiting for the learner's weights after each batch, so each batch is acted
        # by the weights of the one before, none older.
        (["--cfg=sac_mujoco"], 0.0),
    ],
    ids=["async_2_workers", "sac_mujoco_preset"],
)
def test_sac_learns_pendulum_in_multi_process_mode(train_dir, flow, lag_limit):
    # A random policy scores about -1200 on Pendulum-v1. The mean is over the last 10 episodes (2,000 env steps):
    # seeds 1 and 2 of each flow stopped at 5.0-5.6k env steps (-384 to -263), 30 episodes took 8.6-8.8k.
    args = ["--algo=sac", "--env=Pendulum-v1", *flow]
    args += ["--learning_starts=1000", "--train_for_env_steps=30000", "--stop_at_return=-400", "--stats_window=10"]
    args += ["--hidden_sizes=64,64", "--critic_hidden_sizes=64,64", "--batch_size=128", "--learner_threads=1"]
    result = run_train(train_dir, "sac_pendulum", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "sac_pendulum")
    assert reached_target(summary, "stop_at_return=-400"), summary
    assert summary["policy_lag_mean"] <= lag_limit, summary


def test_a_replay_that_cannot_fit_and_a_bad_image_shift_are_one_line_errors_before_anything_starts(train_dir):
    from sfengine.algorithms.offpolicy.replay import check_replay_fits

    with pytest.raises(
        ConfigError, match=r"--replay_size=1000000 needs .* GiB \(.* bytes a step\) .* lower --replay_size"
    ):
        check_replay_fits(1_000_000, OBS_SPEC, ACTION_SPEC, available=2**20)
    check_replay_fits(1_000, OBS_SPEC, ACTION_SPEC, available=2**30)
    for args, message in [
        (["--env=Pendulum-v1", "--replay_size=100000000000"], "--replay_size=100000000000 needs"),
        (["--env=image_reach", "--image_shift=0.5"], "--image_shift=0.5 is a fraction of an image's side"),
    ]:
        result = run_train(train_dir, "sac_bad", "--algo=sac", *args, timeout=120)
        errors = [line for line in result.stderr.splitlines() if line.startswith("sfengine.train: error")]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
        assert not (train_dir / "sac_bad").exists()  # nothing written


def pendulum_demos(path, count: int = 2, steps: int = 5) -> str:
    """``count`` demonstrations of Pendulum-v1 whose observations are 1000 + their step, written to ``path``."""
    obs = 1000 + np.repeat(np.arange(steps, dtype=np.float32)[:, None], 3, 1)
    demo = Demo(
        {"obs": obs},
        np.zeros((steps, 2), np.float32),
        np.ones(steps, np.float32),
        np.zeros(steps, np.uint8),
        None,
        0,
        0,
    )
    write_demos(path, DemoSet("Pendulum-v1", "state", [demo] * count))
    return str(path)


def test_demonstrations_fill_the_asked_share_of_each_minibatch(tmp_path):
    trainer = make_trainer(demos=pendulum_demos(tmp_path / "demos.hdf5"), demo_ratio=0.25)
    stats = trainer.train(batch(0), 0, 0)
    assert stats["demo_share"] == 0.25 and stats["gradient_steps"] == 32
    minibatch = trainer.sample()
    from_demos = minibatch.obs["obs"][:, 0] >= 1000
    assert from_demos.tolist() == [True] * 8 + [False] * 24  # 0.25 of --batch_size=32, online data the rest
    assert trainer.model.normalizers["obs"].mean[0] > 100  # their observations are in the input statistics
    without = make_trainer(demos=pendulum_demos(tmp_path / "demos.hdf5"), demo_ratio=0.0)
    without.train(batch(0), 0, 0)
    assert not (without.sample().obs["obs"][:, 0] >= 1000).any()


def test_a_rounds_minibatches_drawn_together_each_hold_their_share_of_demonstrations(tmp_path, monkeypatch):
    # A round draws its minibatches several at a time (one gather, one copy to the device): each still has its
    # demonstrations first, and as many as a minibatch drawn alone; the draws follow one another.
    trainer = make_trainer(demos=pendulum_demos(tmp_path / "demos.hdf5"), demo_ratio=0.25)
    trainer.train(batch(0), 0, 0)
    monkeypatch.setattr(trainer_module, "ROUND_DRAW_BYTES", 3 * 32 * trainer.transition_bytes)  # 3 a draw
    drawn = list(trainer.minibatches(7))
    assert [len(b.actions) for b in drawn] == [32] * 7
    for b in drawn:
        assert (b.obs["obs"][:, 0] >= 1000).tolist() == [True] * 8 + [False] * 24
    assert len({tuple(b.obs["obs"][8:, 0].tolist()) for b in drawn}) == 7  # each its own online draw


def test_demonstrations_of_another_env_or_for_an_algorithm_that_ignores_them_are_one_line_errors(tmp_path, train_dir):
    demos = pendulum_demos(tmp_path / "demos.hdf5")
    for args, message in [
        (["--algo=sac", "--env=MountainCarContinuous-v0"], "holds demos of Pendulum-v1, not MountainCarContinuous-v0"),
        (["--algo=ppo", "--env=Pendulum-v1"], "--algo=ppo does not learn from --demos"),
    ]:
        result = run_train(train_dir, "bad_demos", f"--demos={demos}", *args, timeout=120)
        errors = [line for line in result.stderr.splitlines() if line.startswith("sfengine.train: error")]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
        assert not (train_dir / "bad_demos").exists()


def test_the_status_line_says_what_sac_did():
    from sfengine.algorithms.offpolicy import status

    cfg = sac_config()
    assert "filling the replay" in status(cfg, {"replay_fill": 0.001, "gradient_steps": 0.0})
    stats = make_trainer().train(batch(0), 0, 0)
    line = status(cfg, stats)
    assert (
        line.startswith("critic loss ")
        and " alpha " in line
        and line.endswith(f"{stats['gradient_steps']:.0f} steps a batch")
    )
    assert "correction 85% of its bound" in status(cfg, stats | {"residual_size": 0.851})


def test_td3_acts_with_clipped_noise_and_learns_towards_its_target_actors_smoothed_action():
    torch.manual_seed(0)
    trainer = make_trainer("td3", exploration_noise=0.1, target_noise=0.0)
    actor = trainer.model
    obs = {"obs": torch.randn(2000, 3)}
    params = actor.policy_params(obs)
    mode, _ = actor.mode(params)
    acting, log_probs = actor.sample(params)
    assert torch.equal(mode, actor.mode(params)[0]) and (log_probs == 0).all()  # deterministic, no likelihood
    assert (acting[:, 0].abs() <= 2).all() and (acting[:, 1] >= 0).all() and (acting[:, 1] <= 1).all()
    spread = (acting - mode)[mode[:, 0].abs() < 1, 0]  # far from the edges: noise of 0.1 half-ranges (2)
    assert spread.std().item() == pytest.approx(0.2, rel=0.1) and spread.mean().abs() < 0.02
    # Without target noise the target is the subset minimum of the target critics at the target actor's action,
    # which reads the observations as the actor's normaliser does now (the target actor's copy of it is never
    # updated): here, with the target actor's weights still the actor's, the actor's own action.
    actor.update_normalizers({"obs": torch.randn(500, 3) * 4 + 2})
    features = trainer.features(obs)
    value = trainer.target_value(obs, features)
    target_action = actor.mode(actor.policy_params(obs))[0]
    expected = trainer.target_critics(features, actor.to_unit(target_action)).min(0).values
    assert torch.allclose(value, expected)
    # With it, each draw is clipped to --target_noise_clip half-ranges.
    trainer.options.target_noise, trainer.options.target_noise_clip = 10.0, 0.1
    smoothed = trainer.target_actor.noisy(target_action, 10.0, 0.1)
    assert ((smoothed - target_action).abs() <= 0.1 * actor.action_half_range + 1e-6).all()


def test_td3s_squash_penalty_pulls_a_saturated_actor_back_where_its_gradient_lives():
    # Deep in tanh's flat ends the critics' gradient does not reach the actor (the TD3 seeds that never learned
    # image_reach sat at |pre-tanh action| 9-17): without the penalty it stays there, with it it comes back.
    moved, saturated = {}, {}
    for penalty in (0.0, 1e-3):
        torch.manual_seed(0)
        trainer = make_trainer("td3", squash_penalty=penalty, actor_delay=1)
        with torch.no_grad():
            trainer.model.policy_head.bias[:2] = 12.0
        obs = {"obs": torch.randn(64, 3)}
        before = trainer.model.pre_squash(trainer.model.policy_params(obs)).detach()
        stats = trainer.train(batch(0), 0, 0)
        after = trainer.model.pre_squash(trainer.model.policy_params(obs)).detach()
        moved[penalty], saturated[penalty] = float((before - after).mean()), stats["actor_saturated"]
    assert saturated == {0.0: 1.0, 1e-3: 1.0}  # every output past 3: the statistic says so
    assert moved[1e-3] > 0.005 and abs(moved[0.0]) < moved[1e-3] / 10
    from sfengine.algorithms.offpolicy import status

    assert "actor saturated 100% (--squash_penalty)" in status(sac_config("td3"), stats)


def test_td3_updates_its_actor_and_target_actor_every_second_critic_step():
    trainer = make_trainer("td3")
    assert trainer.options.actor_delay == 2  # TD3's own default
    before = [p.detach().clone() for p in trainer.target_actor.parameters()]
    stats = trainer.train(batch(0), 0, 0)
    assert stats["gradient_steps"] == 32 and trainer.critic_steps == 32
    moved = [not torch.equal(a, b) for a, b in zip(before, trainer.target_actor.parameters(), strict=True)]
    assert any(moved)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_each_gradient_step_moves_the_target_critics_by_tau_towards_the_critics(algo):
    trainer = make_trainer(algo, tau=0.25)
    trainer.train(batch(0), 0, 0)
    before = [p.detach().clone() for p in trainer.target_critics.parameters()]
    trainer.step()
    for old, target, critic in zip(
        before, trainer.target_critics.parameters(), trainer.critics.parameters(), strict=True
    ):
        assert torch.allclose(target, 0.75 * old + 0.25 * critic, atol=1e-6)


@pytest.mark.parametrize("reduce", ["mean", "min"])
def test_the_actor_climbs_the_ensembles_mean_q_or_its_minimum(reduce):
    trainer = make_trainer("sac", num_critics=3, actor_q=reduce)
    obs = {"obs": torch.randn(64, 3)}
    actions, _ = trainer.model.sample(trainer.model.policy_params(obs))
    q = trainer.critics(trainer.features(obs), trainer.model.unit_actions(actions))
    expected = q.mean(0) if reduce == "mean" else q.min(0).values
    assert torch.allclose(trainer.actor_q(trainer.features(obs), actions), expected)
    assert not torch.allclose(q.mean(0), q.min(0).values)  # the members differ, so the two choices do


def test_with_the_peers_settings_one_sac_step_is_the_textbook_update():
    """Clipped double Q over 2 plain critics, the actor on their minimum, raw observations: the critics, the actor
    and the temperature after one step are those of SAC's update written out with torch.distributions, on the same
    weights and the same noise."""
    trainer = make_trainer("sac", critic_layer_norm=False, actor_q="min", normalize_input=False, init_temperature=0.5)
    trainer.train(batch(0), 0, 0)  # fills the replay (and takes its own steps)
    b = trainer.sample()
    actor, critics, targets = (copy.deepcopy(m) for m in (trainer.model, trainer.critics, trainer.target_critics))
    log_alpha = trainer.log_alpha.detach().clone().requires_grad_(True)
    critic_opt = torch.optim.Adam(critics.parameters(), lr=trainer.options.critic_learning_rate)
    critic_opt.load_state_dict(copy.deepcopy(trainer.critic_optimizer.state_dict()))
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, eps=trainer.cfg.learner.adam_eps)
    actor_opt.load_state_dict(copy.deepcopy(trainer.optimizer.state_dict()))
    alpha_opt = torch.optim.Adam([log_alpha], lr=trainer.options.critic_learning_rate)
    alpha_opt.load_state_dict(copy.deepcopy(trainer.alpha_optimizer.state_dict()))
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])

    def policy(obs):
        """A squashed Gaussian's reparameterised action in [-1, 1] (what the critics read) and its log-density."""
        mean, log_std = actor.policy_params(obs).chunk(2, -1)
        gaussian = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        u = mean + torch.randn_like(mean) * gaussian.stddev  # the draw the policy takes from the global stream
        unit = torch.tanh(u)
        log_prob = (gaussian.log_prob(u) - torch.log((high - low) / 2 * (1 - unit.pow(2)))).sum(-1)
        return unit, log_prob

    torch.manual_seed(11)
    features = trainer.critic_step(b)[1]
    trainer.actor_step(b, features.detach())
    torch.manual_seed(11)
    with torch.no_grad():
        next_unit, next_log_prob = policy(b.next_obs)
        next_v = targets(b.next_obs["obs"], next_unit).min(0).values - log_alpha.exp() * next_log_prob
        target = b.returns + b.discounts * next_v
    unit_taken = (b.actions - (high + low) / 2) / ((high - low) / 2)
    critic_loss = sum(((member - target) ** 2).mean() for member in critics(b.obs["obs"], unit_taken))
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    unit, log_prob = policy(b.obs)
    critics.requires_grad_(False)
    actor_loss = (log_alpha.exp().detach() * log_prob - critics(b.obs["obs"], unit).min(0).values).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    alpha_loss = -(log_alpha * (log_prob.detach() - 2.0)).mean()  # the target entropy: -(action dimensions)
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
    for mine, textbook in ((trainer.critics, critics), (trainer.model, actor)):
        for a, b_ in zip(mine.parameters(), textbook.parameters(), strict=True):
            assert torch.allclose(a, b_, atol=1e-6)
    assert trainer.log_alpha.item() == pytest.approx(log_alpha.item(), abs=1e-7)
    assert trainer.log_alpha.item() != pytest.approx(math.log(0.5), abs=1e-5)  # it moved


def test_the_actor_waits_for_the_critics_warm_up():
    trainer = make_trainer("td3", critic_warmup_updates=40, actor_delay=1)
    beats = []
    trainer.heartbeat = lambda: beats.append(1)  # the learner's hang watch hears of every step, critic-only ones too
    weights = lambda: {name: p.detach().clone() for name, p in trainer.model.named_parameters()}  # noqa: E731
    before = weights()
    assert "actor_loss" not in trainer.train(batch(0), 0, 0)  # 32 gradient steps: the critics' alone
    assert len(beats) == 32
    assert all(torch.equal(before[name], value) for name, value in weights().items())
    assert "actor_loss" in trainer.train(batch(1), 0, 0)  # steps 41-64 move the actor
    assert any(not torch.equal(before[name], value) for name, value in weights().items())


def test_the_actor_pays_for_its_distance_from_the_demonstrations_and_for_its_correction(tmp_path):
    trainer = make_trainer("td3", demos=pendulum_demos(tmp_path / "demos.hdf5"), demo_ratio=0.25, bc_weight=0.4)
    trainer.train(batch(0), 0, 0)
    b = trainer.sample()
    params = trainer.model.policy_params(b.obs)
    actions = trainer.model.action(params)
    q = torch.full((32,), -3.0)
    extra, stats = trainer.actor_terms(b, params, actions, q)
    unit = trainer.model.unit_actions
    gap = (unit(actions[:8]) - unit(b.actions[:8])).pow(2).sum(-1).mean()  # the 8 demonstrations of the 32
    assert float(extra) == pytest.approx(0.4 * 3.0 * float(gap)) and stats["bc_distance"] == pytest.approx(float(gap))


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_gradient_step_on_a_nan_reward_is_skipped_on_the_device_and_counted(algo):
    # The critics' and the actor's steps are skipped without a read-back (the fused Adam's found_inf): the weights,
    # their moments and step counts stay as they were, and the round's statistics count the skipped critic steps.
    trainer = make_trainer(algo, actor_delay=1)
    trainer.train(batch(0), 0, 0)  # 32 finite steps
    critics = [p.detach().clone() for p in trainer.critics.parameters()]
    actor = [p.detach().clone() for p in trainer.model.parameters()]
    steps = [state["step"].clone() for state in trainer.critic_optimizer.state.values()]
    trainer.replay.rewards.fill_(float("nan"))
    stats = trainer.train(batch(1), 0, 0)
    assert stats["critic_nonfinite_fraction"] == 1.0 and stats["critic_grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(critics, trainer.critics.parameters(), strict=True))
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(steps, (s["step"] for s in trainer.critic_optimizer.state.values())))
    trainer.replay.rewards.fill_(0.5)
    stats = trainer.train(batch(2), 0, 0)
    assert stats["critic_nonfinite_fraction"] == 0.0 and stats["critic_grad_norm"] > 0
    assert not all(torch.equal(a, b) for a, b in zip(critics, trainer.critics.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(actor, trainer.model.parameters(), strict=True))
