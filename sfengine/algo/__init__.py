"""Learning math: advantage estimators and the PPO loss, as pure functions on tensors."""

from sfengine.algo.advantages import gae, vtrace
from sfengine.algo.ppo_loss import PPOLoss, explained_variance, normalize_advantages, ppo_loss

__all__ = ["PPOLoss", "explained_variance", "gae", "normalize_advantages", "ppo_loss", "vtrace"]
