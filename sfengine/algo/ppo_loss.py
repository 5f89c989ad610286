"""The clipped PPO objective (Schulman et al. 2017) and two small statistics that go with it.

All inputs are flat [N] tensors: one entry per sampled (observation, action) pair of a minibatch, however the
caller's [B, T] batch was flattened.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class PPOLoss(NamedTuple):
    """Scalar tensors. Only ``loss`` is meant for ``backward()``; the rest are for logging."""

    loss: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor


def ppo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    values: Tensor,
    old_values: Tensor,
    value_targets: Tensor,
    entropy: Tensor,
    clip_ratio: float,
    value_clip: float | None,
    value_loss_coeff: float,
    entropy_coeff: float,
) -> PPOLoss:
    """Combined actor-critic loss ``policy_loss + value_loss_coeff * value_loss - entropy_coeff * entropy``.

    Args:
        log_probs: [N] log-probability of the taken actions under the current policy (with grad).
        old_log_probs: [N] the same under the policy that collected the data.
        advantages: [N] advantage estimates (usually normalized).
        values: [N] current critic predictions (with grad).
        old_values: [N] critic predictions at collection time; anchor of the value clipping.
        value_targets: [N] regression targets (GAE returns or V-trace ``vs``).
        entropy: [N] entropy of the current action distribution at each observation.
        clip_ratio: the policy ratio is trusted within ``[1 - clip_ratio, 1 + clip_ratio]``.
        value_clip: max distance of the value prediction from ``old_values``; ``None`` disables value clipping.
        value_loss_coeff, entropy_coeff: weights of the value loss and of the entropy bonus.
    """
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    # Pessimistic bound: once the ratio has moved past the clip range in the direction that helps, the clipped
    # term is the minimum and is constant, so that sample stops pushing the policy further.
    unclipped_objective = ratio * advantages
    clipped_objective = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
    policy_loss = -torch.min(unclipped_objective, clipped_objective).mean()

    squared_errors = (values - value_targets) ** 2
    if value_clip is None:
        value_loss = 0.5 * squared_errors.mean()
    else:
        # Same pessimism for the critic: the larger error wins, so moving far from old_values earns nothing.
        clipped_values = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
        clipped_squared_errors = (clipped_values - value_targets) ** 2
        value_loss = 0.5 * torch.max(squared_errors, clipped_squared_errors).mean()

    mean_entropy = entropy.mean()
    # The entropy is a bonus: subtracting it means minimizing the loss keeps the policy exploratory.
    loss = policy_loss + value_loss_coeff * value_loss - entropy_coeff * mean_entropy

    with torch.no_grad():
        # (r - 1) - log r is a non-negative, low-variance estimator of KL(old || new).
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_ratio).float().mean()

    return PPOLoss(loss, policy_loss, value_loss, mean_entropy, approx_kl, clip_fraction)


def normalize_advantages(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """Shift to zero mean and scale to unit std, so the policy step size does not depend on the reward scale.

    Uses the population std (no Bessel correction) so that a single-element batch gives 0 rather than NaN.
    """
    return (advantages - advantages.mean()) / (advantages.std(correction=0) + eps)


def explained_variance(predicted: Tensor, target: Tensor) -> float:
    """``1 - Var(target - predicted) / Var(target)``: 1 is a perfect critic, 0 is no better than the mean.

    Returns NaN when the target is constant, since no fraction of zero variance can be explained.
    """
    target_variance = target.var(correction=0).item()
    if target_variance == 0.0:
        return float("nan")
    return 1.0 - (target - predicted).var(correction=0).item() / target_variance
