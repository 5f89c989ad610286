"""The Gaussian policy head's constants and formulas, in one place for the torch model (``ActorCritic``) and the
numpy backend (``sfengine.numpy_backend``) alike: each formula takes torch tensors or numpy arrays (it uses only
arithmetic and ``.sum(-1)``), so both compute the same function by construction."""

from __future__ import annotations

import math

LOG_STD_RANGE = (-5.0, 2.0)  # every log-std the policy uses is clamped to this
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_prob(z, log_std):
    """The log-density of ``mean + z * std`` under N(mean, std²), summed over the action's dimensions: [N]."""
    return (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)


def gaussian_entropy(log_std):
    """The entropy of N(mean, std²), summed over the action's dimensions."""
    return (0.5 + HALF_LOG_2PI + log_std).sum(-1)
