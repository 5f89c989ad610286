"""Policy surrogates: how the probability ratio ``r = pi / pi_old`` and the advantage ``A`` become a loss.

Every surrogate returns a per-sample loss [N] (the caller averages it), so one function serves the GAE and the
V-trace paths alike, and the diagnostics can ask each sample's gradient on its own. ``sg`` is stop-gradient.

    ppo_clip   -min(r A, clip(r, 1 - eps, 1 + eps) A)                  no gradient once r left the range helpfully
    soft_clip  -r A sg(c),  c = (1 / max(r, 1/r))^alpha                 no hard cut: extreme ratios damped
    sapo       -f(r) A,  f(r) = sigmoid(tau (r - 1)) 4 / tau            tau_pos for A > 0, tau_neg for A < 0
    ce_gppo    ppo_clip's value; where it clips, the gradient stays, scaled by beta_low (1 - eps) or
               beta_high (1 + eps); with A < 0 the objective is bounded below by c A (dual clip), so a stale
               sample with r > c stops pushing
    cispo      -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi         the gradient always flows through log pi

A new surrogate is one function ``fn(ratio, advantages, log_probs, params) -> Surrogate`` and one
``register_surrogate(name, fn)``; ``--clip_mode=name`` then selects it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from sfengine.algorithms.ppo.options import MODE_TARGET_KL, SURROGATE_TARGET_KL, SurrogateParams


class Surrogate(NamedTuple):
    loss: Tensor  # [N] per-sample loss, with gradient
    low: float  # the mode's trusted ratio range, for the clip-fraction diagnostic
    high: float
    saturated: Tensor | None = None  # [N] bool: sapo's gates whose slope is nearly flat


SurrogateFn = Callable[[Tensor, Tensor, Tensor, SurrogateParams], Surrogate]
SURROGATES: dict[str, SurrogateFn] = {}

# A sapo gate is saturated where its slope 4 s (1 - s) (1 at r = 1, PPO's gradient) is below this: the sample then
# moves the policy at less than a tenth of the rate PPO would.
SAPO_SATURATED_SLOPE = 0.1


def register_surrogate(name: str, fn: SurrogateFn, target_kl: float = 0.0) -> None:
    """Make ``fn`` available as ``--clip_mode=name``; ``target_kl``: the --target_kl its runs take unless they set
    one (0: none)."""
    SURROGATES[name] = fn
    SURROGATE_TARGET_KL[name] = target_kl


def policy_surrogate(
    clip_mode: str, ratio: Tensor, advantages: Tensor, log_probs: Tensor, params: SurrogateParams
) -> Surrogate:
    """The per-sample loss of ``clip_mode``. ratio, advantages, log_probs: [N]; ``ratio`` and ``log_probs`` carry
    the gradient (``ratio = exp(log_probs - old_log_probs)``), advantages do not."""
    return SURROGATES[clip_mode](ratio, advantages, log_probs, params)


def ppo_clip(ratio: Tensor, advantages: Tensor, log_probs: Tensor, p: SurrogateParams) -> Surrogate:
    # Pessimistic bound: once the ratio has moved past the range in the direction that helps, the clipped term is
    # the minimum and constant, so that sample stops pushing the policy further.
    low, high = 1.0 - p.clip_ratio, 1.0 + p.clip_ratio
    clipped = torch.clamp(ratio, low, high) * advantages
    return Surrogate(-torch.min(ratio * advantages, clipped), low, high)


def soft_clip(ratio: Tensor, advantages: Tensor, log_probs: Tensor, p: SurrogateParams) -> Surrogate:
    damping = (1.0 / torch.max(ratio, 1.0 / ratio)).detach() ** p.soft_clip_alpha
    return Surrogate(-ratio * advantages * damping, 1.0 - p.clip_ratio, 1.0 + p.clip_ratio)


def sapo(ratio: Tensor, advantages: Tensor, log_probs: Tensor, p: SurrogateParams) -> Surrogate:
    tau = torch.where(advantages > 0, p.sapo_tau_pos, p.sapo_tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    slope = (4.0 * gate * (1.0 - gate)).detach()
    return Surrogate(
        -gate * 4.0 / tau * advantages, 1.0 - p.clip_ratio, 1.0 + p.clip_ratio, slope < SAPO_SATURATED_SLOPE
    )


def ce_gppo(ratio: Tensor, advantages: Tensor, log_probs: Tensor, p: SurrogateParams) -> Surrogate:
    low, high = 1.0 - p.clip_ratio, 1.0 + p.clip_ratio
    # ratio / sg(ratio) is 1 with the gradient of log pi: it turns a constant into "this value, with this gradient".
    grad_of_log_pi = ratio / ratio.detach()
    below = (ratio < low) & (advantages < 0)  # where ppo_clip's gradient is zero
    above = (ratio > high) & (advantages > 0)
    kept_below = low * advantages * (1.0 + p.ce_gppo_beta_low * (grad_of_log_pi - 1.0))
    kept_above = high * advantages * (1.0 + p.ce_gppo_beta_high * (grad_of_log_pi - 1.0))
    objective = torch.where(below, kept_below, torch.where(above, kept_above, ratio * advantages))
    if p.ce_gppo_dual_clip > 0:
        # Without it, r A with A < 0 grows without bound in r: a sample that policy lag or the epochs drove far
        # above the range pushes its probability down harder the more it already moved.
        bounded = torch.max(objective, p.ce_gppo_dual_clip * advantages)
        objective = torch.where(advantages < 0, bounded, objective)
    return Surrogate(-objective, low, high)


def cispo(ratio: Tensor, advantages: Tensor, log_probs: Tensor, p: SurrogateParams) -> Surrogate:
    low, high = 1.0 - p.cispo_eps_low, 1.0 + p.cispo_eps_high
    weight = torch.clamp(ratio, low, high).detach()
    return Surrogate(-weight * advantages * log_probs, low, high)


register_surrogate("ppo_clip", ppo_clip)
for _fn in (soft_clip, sapo, ce_gppo, cispo):
    register_surrogate(_fn.__name__, _fn, target_kl=MODE_TARGET_KL)


@torch.no_grad()
def ratio_diagnostics(ratio: Tensor, log_ratio: Tensor, surrogate: Surrogate, sample_grads: Tensor) -> dict[str, float]:
    """What the update did to the ratio, for TensorBoard and the status line.

    ``sample_grads`` [N]: each sample's gradient of its own loss with respect to its log-prob (exactly zero where
    the surrogate cut it off)."""
    n = ratio.numel()
    stats = {
        "clip_fraction": float(((ratio < surrogate.low) | (ratio > surrogate.high)).float().mean()),
        "dead_grad_fraction": float((sample_grads == 0).float().mean()),
        # (sum r)^2 / (N sum r^2): 1 when every ratio is equal, 1/N when one sample carries all the weight. In
        # float64: float32 sums of ratios near 1 round it to 1.0000004 now and then.
        "ess": float(ratio.double().sum() ** 2 / (n * ratio.double().pow(2).sum()).clamp_min(1e-300)),
        # (r - 1) - log r is a non-negative, low-variance estimator of KL(old || new).
        "approx_kl": float(((ratio - 1.0) - log_ratio).mean()),
        "ratio_min": float(ratio.min()),
        "ratio_max": float(ratio.max()),
    }
    if surrogate.saturated is not None:
        stats["sapo_saturated_fraction"] = float(surrogate.saturated.float().mean())
    return stats
