"""The PPO objective (Schulman et al. 2017) with a choice of policy surrogates, and two small statistics that go
with it.

All inputs are flat [N] tensors: one entry per sampled (observation, action) pair of a minibatch, however the
caller's [B, T] batch was flattened.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sfengine.algorithms.ppo.surrogates import SurrogateParams, policy_surrogate, ratio_diagnostics


class PPOLoss:
    """Scalar tensors. Only ``loss`` is meant for ``backward()``; the rest, and ``diagnostics`` (the ratio's
    statistics, :func:`ratio_diagnostics`), are for logging.

    ``diagnostics`` is computed when first read. Read after ``loss.backward()``, it takes each sample's gradient
    from that pass; read before, it asks autograd for them on a detached copy (a second, small backward pass)."""

    def __init__(
        self,
        loss: Tensor,
        policy_loss: Tensor,
        value_loss: Tensor,
        entropy: Tensor,
        diagnose: Callable[[], dict[str, float]],
    ):
        self.loss, self.policy_loss, self.value_loss, self.entropy = loss, policy_loss, value_loss, entropy
        self._diagnose = diagnose
        self._diagnostics: dict[str, float] | None = None

    @property
    def diagnostics(self) -> dict[str, float]:
        if self._diagnostics is None:
            self._diagnostics = self._diagnose()
        return self._diagnostics


def ppo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    values: Tensor | None,
    old_values: Tensor | None,
    value_targets: Tensor | None,
    entropy: Tensor,
    clip_ratio: float,
    value_clip: float | None,
    value_loss_coeff: float,
    entropy_coeff: float,
    clip_mode: str = "ppo_clip",
    surrogate_params: SurrogateParams | None = None,
) -> PPOLoss:
    """Combined actor-critic loss ``policy_loss + value_loss_coeff * value_loss - entropy_coeff * entropy``.

    Args:
        log_probs: [N] log-probability of the taken actions under the current policy (with grad).
        old_log_probs: [N] the same under the policy that collected the data.
        advantages: [N] advantage estimates (usually normalized).
        values: [N] current critic predictions (with grad); None without a critic (group advantages), and then
            ``old_values`` and ``value_targets`` are None too and the value loss is 0.
        old_values: [N] critic predictions at collection time; anchor of the value clipping.
        value_targets: [N] regression targets (GAE returns or V-trace ``vs``).
        entropy: [N] entropy of the current action distribution at each observation.
        clip_ratio: the policy ratio is trusted within ``[1 - clip_ratio, 1 + clip_ratio]``.
        value_clip: max distance of the value prediction from ``old_values``; ``None`` disables value clipping.
        value_loss_coeff, entropy_coeff: weights of the value loss and of the entropy bonus.
        clip_mode: the policy surrogate (``sfengine.algorithms.ppo.surrogates``); ``surrogate_params`` its parameters
            (default: the published ones, with ``clip_ratio``).
    """
    params = (surrogate_params or SurrogateParams())._replace(clip_ratio=clip_ratio)
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate = policy_surrogate(clip_mode, ratio, advantages, log_probs, params)
    policy_loss = surrogate.loss.mean()

    if values is None:
        value_loss = torch.zeros((), device=log_probs.device)
    else:
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
    # backward() hands this hook the loss's gradient with respect to each log-prob: the policy loss's alone (the
    # value and entropy terms do not read log_probs), the per-sample surrogate gradient divided by N, exactly 0
    # where the surrogate cut the sample off. The dead-gradient statistic then needs no backward pass of its own.
    from_backward: list[Tensor] = []
    if log_probs.requires_grad:
        log_probs.register_hook(from_backward.append)

    def diagnose() -> dict[str, float]:
        if from_backward:
            sample_grads = from_backward[0]
        else:
            sample_grads = per_sample_gradients(clip_mode, log_probs, old_log_probs, advantages, params)
        return ratio_diagnostics(ratio.detach(), log_ratio.detach(), surrogate, sample_grads)

    return PPOLoss(loss, policy_loss, value_loss, mean_entropy, diagnose)


def per_sample_gradients(
    clip_mode: str, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, params: SurrogateParams
) -> Tensor:
    """[N] each sample's gradient of its own surrogate loss with respect to its log-prob: exactly 0 where the
    surrogate cuts the sample off. Computed on a detached copy (the surrogate is elementwise, so this costs N
    operations, not a pass through the network)."""
    with torch.enable_grad():
        leaf = log_probs.detach().requires_grad_()
        loss = policy_surrogate(clip_mode, torch.exp(leaf - old_log_probs.detach()), advantages.detach(), leaf, params)
        (grads,) = torch.autograd.grad(loss.loss.sum(), leaf)
    return grads


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


def kl_penalty(log_probs: Tensor, reference_log_probs: Tensor, max_log_ratio: float = 20.0) -> Tensor:
    """Mean estimate of KL(pi || pi_ref) from the log-probs [N] of actions the policy sampled, under the policy and
    under a reference: ``exp(d) - d - 1`` with ``d = log pi_ref(a) - log pi(a)`` (the non-negative, unbiased
    estimator GRPO uses). ``d`` is clamped to +-``max_log_ratio``: a many-dimensional Gaussian's log-ratio can be
    large, and its exponential must stay finite."""
    d = (reference_log_probs - log_probs).clamp(-max_log_ratio, max_log_ratio)
    return (d.exp() - d - 1.0).mean()
