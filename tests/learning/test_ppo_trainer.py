"""PPOTrainer.train on a hand-built batch: the update the learner worker runs, checked without the engine.

The batch is a two-armed bandit seen through a 3-dim observation: every step is an episode of its own, arm 0 pays
1 and arm 1 pays 0, so the advantage of arm 0 is positive wherever it was taken.
"""

from __future__ import annotations

import math

import pytest
import torch

from sfengine.algo import gae
from sfengine.algorithms.ppo import trainer as ppo_trainer
from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import Config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.group_batcher import GroupBatch
from sfengine.models.actor_critic import ActorCritic

NUM_TRAJECTORIES, HORIZON = 8, 16
OBS_SPEC = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
ACTION_SPEC = ActionSpec(discrete=True, num_actions=2)
LEARNER_VERSION = 10
BOOTSTRAP_OBS = 1000.0  # far from every real observation, so statistics that include it are visibly off


def make_trainer(action_chunk: int = 1, **options) -> PPOTrainer:
    """The torch step (several tests spy on its loss and optimiser; tests/learning/test_numpy_step.py holds the numpy
    step to it)."""
    cfg = Config()
    cfg.learner.learner_backend = "torch"
    cfg.model.action_chunk = action_chunk
    cfg.learner.batch_size, cfg.learner.num_batches_per_epoch, cfg.learner.num_epochs = 32, 4, 3
    cfg.learner.learning_rate = 3e-3
    cfg.run.train_for_env_steps = 1000
    for name, value in options.items():
        cfg.set(name, value)  # flat, as on the command line: the learner group's and PPO's alike
    torch.manual_seed(0)
    return PPOTrainer(ActorCritic(OBS_SPEC, ACTION_SPEC, cfg.model), cfg)


def bandit_batch() -> TrajectoryBuffers:
    generator = torch.Generator().manual_seed(1)
    batch = TrajectoryBuffers.allocate(NUM_TRAJECTORIES, HORIZON, OBS_SPEC, ACTION_SPEC, shared=False)
    batch.obs["obs"][:] = 5.0 + 2.0 * torch.randn(NUM_TRAJECTORIES, HORIZON + 1, 3, generator=generator)
    # Entry T is the bootstrap observation: it is the next batch's step 0, never a step of this one.
    batch.obs["obs"][:, HORIZON] = BOOTSTRAP_OBS
    batch.actions[:] = torch.randint(0, 2, (NUM_TRAJECTORIES, HORIZON + 1), generator=generator)
    batch.log_probs[:] = math.log(0.5)  # the first policy is near uniform
    batch.rewards[:] = (batch.actions == 0).float()
    batch.terminated[:] = True
    # Acted by versions LEARNER_VERSION - 3 .. LEARNER_VERSION: lags 0 to 3.
    batch.versions[:] = LEARNER_VERSION - torch.arange(HORIZON + 1) % 4
    return batch


def arm_zero_probability(model: ActorCritic, batch: TrajectoryBuffers) -> float:
    with torch.no_grad():
        logits, _ = model({"obs": batch.obs["obs"][:, :HORIZON].reshape(-1, 3)})
    return float(torch.softmax(logits, -1)[:, 0].mean())


def test_train_takes_num_epochs_times_num_batches_per_epoch_steps_over_every_sample():
    trainer, batch = make_trainer(), bandit_batch()
    steps, rows_seen = [], []
    step, forward = trainer.optimizer.step, trainer.model.forward
    # Spies: they count, then call the real method.
    trainer.optimizer.step = lambda *args, **kwargs: (steps.append(1), step(*args, **kwargs))[1]
    trainer.model.forward = lambda obs, **kwargs: (rows_seen.append(len(obs["obs"])), forward(obs, **kwargs))[1]
    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    assert len(steps) == 3 * 4
    # Every minibatch is a quarter of the T real steps of all trajectories; the bootstrap entry is never a sample.
    assert rows_seen == [NUM_TRAJECTORIES * HORIZON // 4] * 12


def test_the_policy_moves_toward_the_positive_advantage_action_and_the_critic_toward_the_returns():
    trainer, batch = make_trainer(learning_rate=1e-2), bandit_batch()
    real_obs = {"obs": batch.obs["obs"][:, :HORIZON].reshape(-1, 3)}
    # Statistics as a run has them after its first batches, so the update's own statistics step moves them little.
    trainer.model.update_normalizers(real_obs)
    returns = batch.rewards[:, :HORIZON].reshape(-1)  # no future: each step is an episode

    def value_error() -> float:
        with torch.no_grad():
            return float((trainer.model(real_obs)[1] - returns).pow(2).mean())

    before, error_before = arm_zero_probability(trainer.model, batch), value_error()
    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    assert abs(before - 0.5) < 0.02
    assert arm_zero_probability(trainer.model, batch) > 0.6
    assert value_error() < 0.5 * error_before


@pytest.mark.parametrize("reward", [0.01, 1000.0])
def test_one_update_fits_the_critic_to_returns_of_any_scale_and_moves_the_policy_alike(reward):
    # Without return normalisation Adam's steps, of about lr in the weights, cannot bring the critic to returns of
    # 1000 in 12 steps, and returns of 0.01 drown in the first critic's noise.
    trainer, batch = make_trainer(learning_rate=1e-2), bandit_batch()
    batch.rewards.mul_(reward)
    real_obs = {"obs": batch.obs["obs"][:, :HORIZON].reshape(-1, 3)}
    trainer.model.update_normalizers(real_obs)
    returns = batch.rewards[:, :HORIZON].reshape(-1)

    def relative_value_error() -> float:
        with torch.no_grad():
            return float((trainer.model(real_obs)[1] - returns).pow(2).mean() / returns.pow(2).mean())

    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    # The return depends on the arm, which V(s) cannot see: the best critic predicts their mean, 0.5 x reward,
    # with a relative squared error of 0.5; one at 0 has 1.0.
    assert relative_value_error() < 0.6
    assert arm_zero_probability(trainer.model, batch) > 0.6


def test_observation_normalizer_learns_from_the_real_steps_only_not_the_bootstrap_entry():
    trainer, batch = make_trainer(), bandit_batch()
    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    normalizer = trainer.model.normalizers["obs"]
    real_steps = batch.obs["obs"][:, :HORIZON].reshape(-1, 3)
    # The prior count (1e-4) weighs nothing next to 128 samples.
    assert torch.allclose(normalizer.mean, real_steps.mean(0), rtol=1e-4)
    assert torch.allclose(normalizer.var, real_steps.var(0, correction=0), rtol=1e-3)
    assert float(normalizer.count) == pytest.approx(NUM_TRAJECTORIES * HORIZON, abs=1e-3)


@pytest.mark.parametrize(("env_steps", "fraction"), [(0, 1.0), (250, 0.75), (1000, 0.0), (5000, 0.0)])
@pytest.mark.slow
def test_linear_schedule_decays_the_learning_rate_to_zero_at_train_for_env_steps(env_steps, fraction):
    trainer = make_trainer(lr_schedule="linear")
    stats = trainer.train(bandit_batch(), LEARNER_VERSION, env_steps=env_steps)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 * fraction)
    assert stats["learning_rate"] == pytest.approx(3e-3 * fraction)


def test_constant_schedule_keeps_the_learning_rate():
    trainer = make_trainer()
    stats = trainer.train(bandit_batch(), LEARNER_VERSION, env_steps=900)
    assert trainer.optimizer.param_groups[0]["lr"] == stats["learning_rate"] == pytest.approx(3e-3)


def test_a_step_with_a_nonfinite_loss_is_skipped_and_counted_and_the_weights_stay_finite():
    trainer = make_trainer()
    poisoned = bandit_batch()
    poisoned.obs["obs"][3, 2] = math.nan  # one step of one trajectory: every minibatch that holds it is lost
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    stats = trainer.train(poisoned, LEARNER_VERSION, env_steps=0)
    # Neither the weights nor the observation statistics took the NaN in: the next batch trains as usual.
    assert all(torch.isfinite(t).all() for t in trainer.model.state_dict().values())
    assert 0 < stats["nonfinite_steps"] < 1  # the minibatches without the NaN step still trained
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert trainer.train(bandit_batch(), LEARNER_VERSION, env_steps=0)["nonfinite_steps"] == 0


@pytest.mark.parametrize("statistics", ["running", "frozen"])
def test_frozen_input_statistics_stay_as_they_start_and_running_ones_learn(statistics):
    cfg = make_trainer().cfg
    cfg.model.input_statistics = statistics
    torch.manual_seed(0)
    trainer = PPOTrainer(ActorCritic(OBS_SPEC, ACTION_SPEC, cfg.model), cfg)
    before = {name: t.clone() for name, t in trainer.model.normalizers.state_dict().items()}
    trainer.train(bandit_batch(), LEARNER_VERSION, env_steps=0)
    after = trainer.model.normalizers.state_dict()
    unchanged = all(torch.equal(before[name], after[name]) for name in before)
    assert unchanged == (statistics == "frozen")


def test_stats_report_every_loss_and_diagnostic_as_a_finite_number():
    stats = make_trainer().train(bandit_batch(), LEARNER_VERSION, env_steps=0)
    expected = {"loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"}
    expected |= {"explained_variance", "learning_rate"}
    expected |= {"value_mean", "advantage_mean", "return_mean", "return_std"}
    assert expected <= set(stats), expected - set(stats)
    assert all(math.isfinite(value) for value in stats.values()), stats
    # The learner measures the lag of any algorithm's batch from its acting versions: here 0, 1, 2, 3 in turn over
    # the 16 real steps (the bootstrap entry's version is not a sample's).
    lag = LEARNER_VERSION - bandit_batch().acting_versions()
    assert lag.float().mean() == pytest.approx(1.5) and lag.max() == 3
    assert stats["approx_kl"] > 0 and stats["entropy"] > 0


def test_explained_variance_is_left_out_while_every_return_is_the_same():
    # A sparse reward not yet earned (LIBERO before its first success): no fraction of no variance is explained,
    # and a NaN in the stats would reach TensorBoard, whose writer then logs "NaN or Inf found in input tensor".
    unrewarded = bandit_batch()
    unrewarded.rewards[:] = 0.0
    stats = make_trainer().train(unrewarded, LEARNER_VERSION, env_steps=0)
    assert "explained_variance" not in stats and all(math.isfinite(value) for value in stats.values()), stats


@pytest.mark.parametrize("reward_scale, action_chunk", [(0.1, 1), (2.0, 1), (1.0, 3)])
def test_advantages_are_gae_of_the_scaled_rewards(reward_scale, action_chunk):
    # With --action_chunk=K an entry is K env steps: the next entry is discounted by gamma^K.
    batch = bandit_batch()
    # Episodes that run on across steps and end both ways, so GAE here is more than reward minus value.
    generator = torch.Generator().manual_seed(2)
    batch.values[:] = torch.randn(NUM_TRAJECTORIES, HORIZON + 1, generator=generator)
    batch.truncation_values[:] = torch.randn(NUM_TRAJECTORIES, HORIZON + 1, generator=generator)
    batch.terminated[:] = torch.rand(NUM_TRAJECTORIES, HORIZON + 1, generator=generator) < 0.1
    batch.truncated[:] = ~batch.terminated & (torch.rand(NUM_TRAJECTORIES, HORIZON + 1, generator=generator) < 0.1)
    stats = make_trainer(action_chunk, reward_scale=reward_scale).train(batch, LEARNER_VERSION, env_steps=0)
    steps = slice(0, HORIZON)
    advantages, _ = gae(
        batch.rewards[:, steps] * reward_scale,
        batch.values,
        batch.terminated[:, steps],
        batch.truncated[:, steps],
        batch.truncation_values[:, steps],
        gamma=0.99**action_chunk,
        gae_lambda=0.95,
    )
    assert stats["advantage_mean"] == pytest.approx(float(advantages.mean()), rel=1e-5)


def test_an_on_policy_update_starts_at_ratio_one(monkeypatch):
    # The batch is acted by the trainer's own weights, as with --async_rl=false. Its observations (mean 5) are far
    # from the normaliser's start (mean 0): statistics moved before the update would change what the policy sees.
    trainer, batch = make_trainer(), bandit_batch()
    with torch.no_grad():
        acted = trainer.model.act({"obs": batch.obs["obs"].reshape(-1, 3)})
    batch.actions[:] = acted.actions.view(NUM_TRAJECTORIES, HORIZON + 1)
    batch.log_probs[:] = acted.log_probs.view(NUM_TRAJECTORIES, HORIZON + 1)
    batch.values[:] = acted.values.view(NUM_TRAJECTORIES, HORIZON + 1)
    ratios = []
    real_loss = ppo_trainer.ppo_loss

    def recording_loss(log_probs, old_log_probs, *args, **kwargs):  # a spy: records, then computes the real loss
        ratios.append((log_probs - old_log_probs).detach().exp())
        return real_loss(log_probs, old_log_probs, *args, **kwargs)

    monkeypatch.setattr(ppo_trainer, "ppo_loss", recording_loss)
    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    assert torch.allclose(ratios[0], torch.ones_like(ratios[0]), rtol=0, atol=1e-6), ratios[0]
    assert not torch.allclose(ratios[-1], torch.ones_like(ratios[-1]), atol=1e-3)  # and the update moved on


@pytest.mark.parametrize("max_grad_norm", [0.01, 0.0])
def test_gradients_are_clipped_to_max_grad_norm_before_the_step_and_zero_turns_it_off(max_grad_norm):
    trainer = make_trainer(max_grad_norm=max_grad_norm)
    stats = trainer.train(bandit_batch(), LEARNER_VERSION, env_steps=0)
    # The gradients of the last minibatch are still on the parameters: what the optimiser stepped with.
    stepped = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in trainer.model.parameters() if p.grad is not None])
    )
    assert stats["grad_norm"] > 0.05  # the norm before the clip, far above 0.01
    if max_grad_norm:
        assert float(stepped) == pytest.approx(max_grad_norm, rel=1e-3)
    else:
        assert float(stepped) > 0.05


@pytest.mark.parametrize("recompute", [True, False])
def test_recompute_advantages_takes_values_and_targets_from_the_current_critic_every_epoch(monkeypatch, recompute):
    trainer, batch = make_trainer(), bandit_batch()
    trainer.cfg.set("recompute_advantages", recompute)
    batch.values[:] = 7.0  # what a stale acting critic wrote: far from anything the learner's critic predicts
    gae_calls, loss_targets = [], []
    real_gae, real_loss = ppo_trainer.gae, ppo_trainer.ppo_loss

    def recording_gae(rewards, values, *args):  # spies: record, then compute the real thing
        with torch.no_grad():
            _, critic_now = trainer.model({"obs": batch.obs["obs"].flatten(0, 1)})
        advantages, returns = real_gae(rewards, values, *args)
        gae_calls.append((values.clone(), critic_now.view(values.shape), returns.clone()))
        return advantages, returns

    def recording_loss(*args, **kwargs):
        loss_targets.append(args[5].detach().clone())  # the value targets, in the critic's units
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(ppo_trainer, "gae", recording_gae)
    monkeypatch.setattr(ppo_trainer, "ppo_loss", recording_loss)
    trainer.train(batch, LEARNER_VERSION, env_steps=0)

    epochs, minibatches = trainer.cfg.learner.num_epochs, trainer.cfg.learner.num_batches_per_epoch
    if not recompute:  # once, from the values the acting policy wrote
        assert len(gae_calls) == 1 and torch.equal(gae_calls[0][0], batch.values)
        return
    assert len(gae_calls) == epochs
    for epoch, (values, critic_now, returns) in enumerate(gae_calls):
        assert torch.allclose(values, critic_now, atol=1e-6), epoch
        epoch_targets = torch.cat(loss_targets[epoch * minibatches : (epoch + 1) * minibatches])
        expected = trainer.model.normalized_values(returns.reshape(-1))
        assert torch.allclose(epoch_targets.sort().values, expected.sort().values, atol=1e-5), epoch
    assert not torch.allclose(gae_calls[0][0], gae_calls[-1][0], atol=1e-3)  # the critic moved between epochs


@pytest.mark.parametrize("weighting, net_push", [("step", -4.0), ("episode", 0.0)])
def test_group_loss_weighting_episode_weighs_a_long_failure_like_a_short_success(monkeypatch, weighting, net_push):
    # One RLOO group of two episodes: a 2-step success (A = +1) and a 6-step failure that ran to the time limit
    # (A = -1). Step-averaged, the failure's six steps outweigh the success; weighed by episode they cancel.
    cfg = make_trainer().cfg
    cfg.set("advantage", "rloo"), cfg.set("group_loss_weighting", weighting)
    cfg.env.task_group_size = 2
    cfg.learner.num_epochs, cfg.learner.num_batches_per_epoch = 1, 1
    trainer = PPOTrainer(ActorCritic(OBS_SPEC, ACTION_SPEC, cfg.model), cfg)
    batch = GroupBatch.allocate(16, 2, OBS_SPEC, ACTION_SPEC)
    batch.num_steps, batch.num_groups = 8, 1
    batch.episodes[:8] = torch.tensor([0, 1, 1, 0, 1, 1, 1, 1])
    batch.outcomes[0] = torch.tensor([1.0, 0.0])
    batch.log_probs[:8] = math.log(0.5)
    advantages = []
    real_loss = ppo_trainer.ppo_loss

    def recording_loss(log_probs, old_log_probs, minibatch_advantages, *args, **kwargs):
        advantages.append(minibatch_advantages.clone())
        return real_loss(log_probs, old_log_probs, minibatch_advantages, *args, **kwargs)

    monkeypatch.setattr(ppo_trainer, "ppo_loss", recording_loss)
    trainer.train(batch, LEARNER_VERSION, env_steps=0)
    (seen,) = advantages
    assert float(seen.sum()) == pytest.approx(net_push, abs=1e-5)


@pytest.mark.slow
def test_kl_coeff_holds_the_policy_near_the_one_it_started_from_and_a_checkpoint_keeps_that_reference():
    # Arm 0's advantage pulls the policy away from its near-uniform start; the penalty pulls back toward the start.
    free, held = make_trainer(learning_rate=1e-2), make_trainer(learning_rate=1e-2, kl_coeff=3.0)
    batch = bandit_batch()
    for trainer in (free, held):
        for _ in range(4):
            stats = trainer.train(batch, LEARNER_VERSION, env_steps=0)
    moved_free, moved_held = (arm_zero_probability(t.model, batch) - 0.5 for t in (free, held))
    assert moved_free > 0.25 and 0.02 < moved_held < 0.5 * moved_free
    assert stats["kl_to_reference"] > 0
    assert free.state_dict() == {} and "kl_to_reference" not in free.train(batch, LEARNER_VERSION, env_steps=0)
    # A resumed run's trainer starts from the resumed weights, and takes the reference back from the checkpoint.
    resumed = make_trainer(kl_coeff=3.0)
    resumed.model.load_state_dict(held.model.state_dict())
    resumed.load_state_dict(held.state_dict())
    start = make_trainer().model.state_dict()
    assert all(torch.equal(resumed.kl_reference.state_dict()[k], start[k]) for k in start)


def group_bandit_batch() -> GroupBatch:
    """The bandit's steps as 16 RLOO groups of two one-step episodes: arm 0 succeeds, arm 1 fails."""
    source = bandit_batch()
    batch = GroupBatch.allocate(64, 2, OBS_SPEC, ACTION_SPEC)
    batch.num_steps, batch.num_groups = 32, 16
    batch.obs["obs"][:32] = source.obs["obs"][:2, :HORIZON].reshape(32, 3)
    batch.actions[:32] = source.actions[:2, :HORIZON].reshape(32)
    batch.log_probs[:32] = math.log(0.5)
    batch.episodes[:32] = torch.arange(32)
    batch.outcomes[:16] = (batch.actions[:32] == 0).float().reshape(16, 2)
    return batch


@pytest.mark.parametrize("advantage", ["gae", "rloo"])
@pytest.mark.parametrize("backend", ["torch", "numpy"])
@pytest.mark.slow
def test_target_kl_ends_the_update_after_the_step_that_passed_it(advantage, backend):
    def steps_and_stats(target_kl: float) -> tuple[int, dict]:
        trainer = make_trainer(learning_rate=0.05, target_kl=target_kl, learner_backend=backend)
        trainer.cfg.set("advantage", advantage)
        trainer.cfg.env.task_group_size = 2
        steps = []
        real = trainer._add_step_stats
        trainer._add_step_stats = lambda *args: (steps.append(1), real(*args))[1]
        batch = bandit_batch() if advantage == "gae" else group_bandit_batch()
        stats = trainer.train(batch, LEARNER_VERSION, env_steps=0)
        return len(steps), stats

    taken, stats = steps_and_stats(0.0)
    assert taken == 12 and stats["target_kl_stop"] == 0.0  # 3 epochs x 4 minibatches, no target
    # A large step's KL passes a tiny target at once: that step is the update's last (and its statistics are that
    # one step's, not a twelfth of it).
    taken, stats = steps_and_stats(1e-6)
    assert taken == 1 and stats["target_kl_stop"] == 1.0 and stats["approx_kl"] > 1.5e-6
    taken, _ = steps_and_stats(10.0)  # a target no step reaches
    assert taken == 12
