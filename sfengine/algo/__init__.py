"""Learning math: advantage estimators (with a critic and by groups), policy surrogates and the PPO loss, as pure
functions on tensors. ``register_surrogate`` and ``register_group_advantage`` add new ones by name."""

from sfengine.algo.advantages import gae, vtrace
from sfengine.algo.group_advantages import grpo, register_group_advantage, rloo
from sfengine.algo.ppo_loss import PPOLoss, explained_variance, kl_penalty, normalize_advantages, ppo_loss
from sfengine.algo.surrogates import Surrogate, SurrogateParams, policy_surrogate, register_surrogate

__all__ = [
    "PPOLoss",
    "Surrogate",
    "SurrogateParams",
    "explained_variance",
    "gae",
    "grpo",
    "kl_penalty",
    "normalize_advantages",
    "policy_surrogate",
    "ppo_loss",
    "register_group_advantage",
    "register_surrogate",
    "rloo",
    "vtrace",
]
