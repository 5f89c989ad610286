"""The learning math in one import, for training scripts: advantage estimators (with a critic and by groups), policy
surrogates and the PPO loss, pure functions on tensors. They live with their algorithms (``sfengine.algorithms``:
``advantages``, ``group_advantages``, ``ppo.loss``, ``ppo.surrogates``); ``register_surrogate`` and
``register_group_advantage`` add new ones by name."""

from sfengine.algorithms.advantages import gae, vtrace
from sfengine.algorithms.group_advantages import grpo, register_group_advantage, rloo
from sfengine.algorithms.ppo.loss import PPOLoss, explained_variance, kl_penalty, normalize_advantages, ppo_loss
from sfengine.algorithms.ppo.surrogates import Surrogate, SurrogateParams, policy_surrogate, register_surrogate

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
