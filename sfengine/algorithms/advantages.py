"""Advantage estimators: GAE for on-policy data and V-trace for data that lags behind the learner's policy.

Everything here is a pure function on batch-major tensors: ``B`` trajectories of ``T`` consecutive steps. A
trajectory may cross episode boundaries, so each step carries two flags:

* ``terminated[t]``: the episode really ended (the agent reached a terminal state); the future is worth 0.
* ``truncated[t]``: the episode was cut off (time limit); the future is still worth something, estimated as
  ``truncation_values[t]``, the critic's value of the episode's real final observation.

In both cases ``values[:, t + 1]`` belongs to the first observation of the *next* episode, so it must never be
used to bootstrap step ``t``. Targets are computed without gradient: they are regression labels, not predictions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_shapes(rewards: Tensor, values: Tensor) -> tuple[int, int]:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, T], got shape {tuple(rewards.shape)}")
    batch_size, num_steps = rewards.shape
    if tuple(values.shape) != (batch_size, num_steps + 1):
        raise ValueError(f"values must be [B, T + 1] = {(batch_size, num_steps + 1)}, got {tuple(values.shape)}")
    return batch_size, num_steps


def _value_after_step(
    following_values: Tensor, terminated: Tensor, truncated: Tensor, truncation_values: Tensor
) -> Tensor:
    """Worth of the state reached by each step, [B, T].

    ``following_values[:, t]`` is the estimate stored for the entry after step ``t`` (a critic value or a V-trace
    target). It is right only when step ``t`` did not end its episode; otherwise the truncation bootstrap or zero
    replaces it. Termination is checked last so that it wins when both flags are set.
    """
    next_values = torch.where(truncated.bool(), truncation_values, following_values)
    return torch.where(terminated.bool(), torch.zeros_like(next_values), next_values)


def _continues(terminated: Tensor, truncated: Tensor, dtype: torch.dtype) -> Tensor:
    """1.0 where the episode goes on after step t, 0.0 where it ended: cuts the backward recursions, [B, T]."""
    return (~(terminated.bool() | truncated.bool())).to(dtype)


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    truncation_values: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016).

    Args:
        rewards: [B, T] reward received at each step.
        values: [B, T + 1] critic values; ``values[:, T]`` bootstraps the observation after the last step.
        terminated, truncated: [B, T] bool (or 0/1) episode-end flags of each step.
        truncation_values: [B, T] value of the final observation where ``truncated`` is set, ignored elsewhere.
        gamma: discount factor.
        gae_lambda: 0 gives one-step TD advantages (low variance, biased), 1 gives Monte-Carlo returns minus the
            baseline (unbiased, high variance).

    Returns:
        ``(advantages, returns)``, both [B, T], with ``returns = advantages + values[:, :T]`` as value targets.
    """
    _, num_steps = _check_shapes(rewards, values)
    current_values = values[:, :num_steps]
    next_values = _value_after_step(values[:, 1:], terminated, truncated, truncation_values)
    td_errors = rewards + gamma * next_values - current_values
    # Decay of the carried advantage; zero at an episode end so credit never leaks into the previous episode.
    carry_weights = gamma * gae_lambda * _continues(terminated, truncated, rewards.dtype)

    advantages = torch.empty_like(rewards)
    running_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(num_steps)):
        running_advantage = td_errors[:, t] + carry_weights[:, t] * running_advantage
        advantages[:, t] = running_advantage
    return advantages, advantages + current_values


@torch.no_grad()
def vtrace(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    truncation_values: Tensor,
    log_rhos: Tensor,
    gamma: float,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace targets (IMPALA, Espeholt et al. 2018) for experience collected by an older behaviour policy.

    Importance ratios ``exp(log_rhos)`` reweight each step towards the learner's policy. They are clipped twice:
    ``rho_clip`` bounds the weight of each TD error (which fixes the value function being learned), ``c_clip``
    bounds how far corrections propagate back in time (which trades variance for contraction speed). With
    ``log_rhos == 0`` and both clips >= 1 the targets equal ``gae(..., gae_lambda=1)`` returns.

    Args:
        rewards, values, terminated, truncated, truncation_values, gamma: as in :func:`gae`.
        log_rhos: [B, T] ``log pi(a|s) - log mu(a|s)``, learner (target) minus behaviour log-probability.
        rho_clip: upper bound of the ratio used on TD errors and policy-gradient advantages.
        c_clip: upper bound of the trace-cutting ratio.

    Returns:
        ``(value_targets, pg_advantages)``, both [B, T]: ``vs`` for the critic, and
        ``rho * (r + gamma * vs_next - V)`` for the policy gradient.
    """
    _, num_steps = _check_shapes(rewards, values)
    current_values = values[:, :num_steps]
    ratios = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(ratios, max=rho_clip)
    trace_weights = gamma * torch.clamp(ratios, max=c_clip) * _continues(terminated, truncated, rewards.dtype)

    next_values = _value_after_step(values[:, 1:], terminated, truncated, truncation_values)
    weighted_td_errors = clipped_rhos * (rewards + gamma * next_values - current_values)

    # Backward recursion on the correction vs_t - V_t, zero beyond the last step.
    corrections = torch.empty_like(rewards)
    running_correction = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(num_steps)):
        running_correction = weighted_td_errors[:, t] + trace_weights[:, t] * running_correction
        corrections[:, t] = running_correction
    value_targets = current_values + corrections

    # The policy gradient bootstraps from the corrected target of the next step; past the end only V is known.
    following_targets = torch.cat([value_targets[:, 1:], values[:, num_steps:]], dim=1)
    next_targets = _value_after_step(following_targets, terminated, truncated, truncation_values)
    pg_advantages = clipped_rhos * (rewards + gamma * next_targets - current_values)
    return value_targets, pg_advantages
