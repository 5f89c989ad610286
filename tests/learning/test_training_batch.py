"""The batch the learner trains on, captured from the real engine: the glue between the components.

The engine runs in serial mode, in this process, on Pendulum-v1 cut at 40 steps: with trajectories of 16 steps,
episodes end by truncation at step 7 of a trajectory and at its last step 15, where the bootstrap value comes
with the next rollout's first request. Two spies only record, and change nothing:

* the env records what each step received and returned, keyed by the observation it was taken from;
* ``PPOTrainer.train`` records a copy of each batch, and the learner's weights as it enters ``train`` with
  version v: the learner published them as v right after its previous update and has not changed them since,
  so they are the weights the inference worker acts with under version v.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch

from sfengine import register_env
from sfengine.algo import explained_variance, gae, vtrace
from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import Config, parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import action_spec_from_space, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic
from sfengine.train import main

ROLLOUT = 16
EPISODE_STEPS = 40
ACTION_LIMIT = 2.0  # Pendulum's Box bounds


@dataclass
class EnvStep:
    action: np.ndarray  # as the env received it
    obs: np.ndarray  # as the env returned it
    truncated: bool


ENV_STEPS: dict[bytes, EnvStep] = {}  # keyed by the observation the step was taken from


class RecordsSteps(gym.Wrapper):
    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.last_obs = obs.copy()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        ENV_STEPS[self.last_obs.tobytes()] = EnvStep(np.array(action, copy=True), obs.copy(), truncated)
        self.last_obs = obs.copy()
        return obs, reward, terminated, truncated, info


def make_recorded_pendulum(ctx):
    return RecordsSteps(gym.make("Pendulum-v1", max_episode_steps=ctx.max_episode_steps, disable_env_checker=True))


@dataclass
class Captured:
    batch: TrajectoryBuffers
    learner_version: int
    env_steps: int
    stats: dict[str, float]


@dataclass
class TrainingRun:
    cfg: Config
    batches: list[Captured]
    published: dict[int, dict]  # policy version -> the weights published under it

    def policy(self, version: int) -> ActorCritic:
        """A fresh model holding the weights published as ``version``."""
        env = gym.make("Pendulum-v1")
        obs_spec, action_spec = obs_spec_from_space(env.observation_space), action_spec_from_space(env.action_space)
        model = ActorCritic(obs_spec, action_spec, self.cfg.model)
        model.load_state_dict(self.published[version])
        return model


def clone(batch: TrajectoryBuffers) -> TrajectoryBuffers:
    tensors = {name: t.clone() for name, t in batch.tensors().items()}
    obs = {name.removeprefix("obs."): t for name, t in tensors.items() if name.startswith("obs.")}
    return TrajectoryBuffers(obs=obs, **{name: t for name, t in tensors.items() if not name.startswith("obs.")})


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> TrainingRun:
    register_env("recorded_pendulum", make_recorded_pendulum)
    ENV_STEPS.clear()
    argv = [
        "--env=recorded_pendulum",
        f"--train_dir={tmp_path_factory.mktemp('train_dir')}",
        "--serial_mode=true",
        "--num_workers=1",
        "--num_envs_per_worker=4",
        "--worker_num_splits=2",
        f"--rollout={ROLLOUT}",
        "--batch_size=64",
        "--num_batches_per_epoch=2",
        "--num_epochs=2",
        f"--max_episode_steps={EPISODE_STEPS}",
        "--initial_log_std=1.5",  # std 4.5: most draws leave [-2, 2]
        "--train_for_env_steps=1280",
    ]
    cfg = parse_config(argv)
    batches, published = [], {}
    real_train = PPOTrainer.train

    def recording_train(trainer, batch, learner_version, env_steps):
        published[learner_version] = copy.deepcopy(trainer.model.state_dict())
        captured = clone(batch)
        stats = real_train(trainer, batch, learner_version, env_steps)
        batches.append(Captured(captured, learner_version, env_steps, stats))
        return stats

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PPOTrainer, "train", recording_train)
        assert main(argv) == 0
    assert len(batches) == 10
    return TrainingRun(cfg, batches, published)


def test_truncation_value_is_the_acting_policys_value_of_the_episodes_final_observation(training_run):
    checked_at = set()
    for captured in training_run.batches:
        batch = captured.batch
        for b, t in batch.truncated[:, :ROLLOUT].nonzero().tolist():
            # Valued in the same forward pass as the next step's action, so by the policy of that step's version.
            version = int(batch.versions[b, t + 1])
            step = ENV_STEPS[batch.obs["obs"][b, t].numpy().tobytes()]
            assert step.truncated
            policy = training_run.policy(version)
            with torch.no_grad():
                final_value = float(policy({"obs": torch.from_numpy(step.obs)[None]})[1])
                reset_value = float(policy({"obs": batch.obs["obs"][b, t + 1][None]})[1])
            assert float(batch.truncation_values[b, t]) == pytest.approx(final_value, abs=1e-5), (b, t)
            # Not the value of the next episode's first observation, which entry t + 1 holds.
            assert abs(final_value - reset_value) > 1e-3
            checked_at.add(t)
    # Both ways a truncation value arrives: mid-trajectory, and with the bootstrap request of the last step.
    assert checked_at == {EPISODE_STEPS % ROLLOUT - 1, ROLLOUT - 1}


def test_env_receives_clipped_actions_while_the_batch_keeps_the_unclipped_sample(training_run):
    outside = total = 0
    for captured in training_run.batches:
        batch = captured.batch
        for b in range(batch.actions.shape[0]):
            for t in range(ROLLOUT):
                stored = batch.actions[b, t].numpy()
                received = ENV_STEPS[batch.obs["obs"][b, t].numpy().tobytes()].action
                np.testing.assert_array_equal(received, np.clip(stored, -ACTION_LIMIT, ACTION_LIMIT))
                outside += int(np.abs(stored).max() > ACTION_LIMIT)
                total += 1
    # With std 4.5 most draws leave the Box; the learner must see them as drawn, or their log-probs are wrong.
    assert outside > 0.4 * total


def test_each_step_holds_the_log_prob_and_value_of_the_policy_version_that_acted(training_run):
    for captured in training_run.batches:
        batch = captured.batch
        # Version 0 included: the learner starts from the very weights the inference worker first acts with.
        for version in batch.versions.unique().tolist():
            at = batch.versions == version
            policy = training_run.policy(version)
            with torch.no_grad():
                params, values = policy({"obs": batch.obs["obs"][at]})
                log_probs, _ = policy.log_prob_entropy(params, batch.actions[at])
            assert torch.allclose(values, batch.values[at], atol=1e-5)
            assert torch.allclose(log_probs, batch.log_probs[at], atol=1e-4)


def test_policy_lag_is_positive_in_async_mode_and_measured_from_the_acting_versions(training_run):
    assert training_run.cfg.sampler.async_rl
    lags = []
    for captured in training_run.batches:
        versions = captured.batch.versions[:, :ROLLOUT]
        assert int(versions.max()) <= captured.learner_version
        lag = (captured.learner_version - versions).float()
        assert captured.stats["policy_lag_mean"] == pytest.approx(float(lag.mean()))
        assert captured.stats["policy_lag_max"] == float(lag.max())
        lags.append(captured.stats["policy_lag_mean"])
    # Rollouts go on while the learner trains, so part of every batch after the first was acted by older policies.
    assert all(lag > 0 for lag in lags[1:]), lags


def test_with_vtrace_the_learner_trains_on_vtrace_targets_not_gae(training_run):
    captured = training_run.batches[-1]
    batch, version = captured.batch, captured.learner_version
    steps = slice(0, ROLLOUT)
    learner_cfg = training_run.cfg.learner
    rewards = batch.rewards[:, steps] * learner_cfg.reward_scale
    episode_ends = (batch.terminated[:, steps], batch.truncated[:, steps], batch.truncation_values[:, steps])
    gae_advantages, gae_returns = gae(rewards, batch.values, *episode_ends, learner_cfg.gamma, learner_cfg.gae_lambda)
    # V-trace re-evaluates the whole batch with the learner's policy and critic as published (the observation
    # statistics move only after the update).
    learner = training_run.policy(version)
    with torch.no_grad():
        params, values = learner({"obs": batch.obs["obs"].flatten(0, 1)})
        log_probs, _ = learner.log_prob_entropy(params, batch.actions.flatten(0, 1))
    log_rhos = (log_probs.view_as(batch.log_probs) - batch.log_probs)[:, steps]
    assert log_rhos.abs().max() > 1e-3  # the learner's policy is not the behaviour policy: V-trace corrects
    vtrace_returns, vtrace_advantages = vtrace(
        rewards, values.view_as(batch.values), *episode_ends, log_rhos, learner_cfg.gamma
    )

    def targets_trained_on(with_vtrace: bool) -> tuple[float, float]:
        cfg = copy.deepcopy(training_run.cfg)
        cfg.set("advantage", "vtrace" if with_vtrace else "gae")
        cfg.learner.num_epochs = 1  # V-trace's targets are those of the weights as published, computed above
        stats = PPOTrainer(training_run.policy(version), cfg).train(clone(batch), version, captured.env_steps)
        return stats["advantage_mean"], stats["explained_variance"]

    def summary(advantages: torch.Tensor, returns: torch.Tensor) -> tuple[float, float]:
        return float(advantages.mean()), explained_variance(batch.values[:, steps].reshape(-1), returns.reshape(-1))

    with_gae, with_vtrace = summary(gae_advantages, gae_returns), summary(vtrace_advantages, vtrace_returns)
    assert with_gae != pytest.approx(with_vtrace, rel=0.01)  # the two estimators disagree on this batch
    assert targets_trained_on(with_vtrace=False) == pytest.approx(with_gae, rel=1e-4, abs=1e-6)
    assert targets_trained_on(with_vtrace=True) == pytest.approx(with_vtrace, rel=1e-4, abs=1e-6)
