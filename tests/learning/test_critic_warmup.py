"""Critic warm-up (``--critic_warmup_batches=N``): PPOTrainer.train on a hand-built batch of continuous actions.

For the first N training batches only the critic learns: the policy's weights, its log-std and the observation
statistics stay bit-identical, so the workers keep acting with the policy the run started from.
"""

from __future__ import annotations

import pytest
import torch

from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import Config, ConfigError, parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic, is_critic_key

OBS_SPEC = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
ACTION_SPEC = ActionSpec(discrete=False, dim=2, low=(-1.0, -1.0), high=(1.0, 1.0))
NUM_TRAJECTORIES, HORIZON = 8, 16
WARMUP = 2


def make_trainer(actor_critic: str) -> PPOTrainer:
    cfg = Config()
    cfg.model.actor_critic = actor_critic
    cfg.learner.batch_size, cfg.learner.num_batches_per_epoch = 64, 2
    cfg.set("critic_warmup_batches", WARMUP)
    torch.manual_seed(0)
    return PPOTrainer(ActorCritic(OBS_SPEC, ACTION_SPEC, cfg.model), cfg)


def reward_batch() -> TrajectoryBuffers:
    """Random steps whose reward is the first action: a critic and a policy both have something to learn."""
    generator = torch.Generator().manual_seed(1)
    batch = TrajectoryBuffers.allocate(NUM_TRAJECTORIES, HORIZON, OBS_SPEC, ACTION_SPEC, shared=False)
    batch.obs["obs"][:] = 3.0 + torch.randn(NUM_TRAJECTORIES, HORIZON + 1, 3, generator=generator)
    batch.actions[:] = torch.randn(NUM_TRAJECTORIES, HORIZON + 1, 2, generator=generator)
    batch.log_probs[:] = -0.5 * batch.actions.pow(2).sum(-1) - torch.log(torch.tensor(2 * torch.pi))
    batch.rewards[:] = batch.actions[..., 0]
    batch.terminated[:] = True
    return batch


def changed(before: dict[str, torch.Tensor], model: ActorCritic) -> set[str]:
    return {name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])}


@pytest.mark.parametrize("actor_critic", ["shared", "separate"])
def test_critic_warmup_trains_the_critic_alone_for_n_batches_then_the_policy_too(actor_critic):
    trainer, batch = make_trainer(actor_critic), reward_batch()
    model = trainer.model
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for version in range(WARMUP):  # the learner's version counts the batches trained
        stats = trainer.train(batch, version, env_steps=0)
        assert stats["critic_warmup"] == 1.0
    moved = changed(start, model)
    # Only the critic moved: no policy weight, log-std, shared encoder weight or observation statistic.
    assert moved and all(is_critic_key(name) for name in moved), sorted(moved)
    assert "value_head.weight" in moved
    if actor_critic == "separate":
        assert any(name.startswith("value_encoders.") for name in moved)

    warmed_up = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    stats = trainer.train(batch, WARMUP, env_steps=0)
    assert stats["critic_warmup"] == 0.0
    moved = changed(warmed_up, model)
    for name in ("log_std", "policy_head.weight", "encoders.obs.0.weight", "normalizers.obs.mean"):
        assert name in moved, name


def test_critic_warmup_needs_a_critic_and_a_count_of_zero_or_more():
    with pytest.raises(ConfigError, match="has none"):
        parse_config(["--critic_warmup_batches=3", "--advantage=rloo", "--task_group_size=4"])
    with pytest.raises(ConfigError, match="must not be negative"):
        parse_config(["--critic_warmup_batches=-1"])
