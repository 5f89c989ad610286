"""FlowSAR (self-annotated credit assignment) for flow-matching policies: the math, apart from the engine.

Notation as in the flow head (``t = 1`` noise, ``t = 0`` the clean action chunk ``a``; ``x_t = (1 - t) a + t eps``,
``u = eps - a``). FlowSAR needs neither a critic nor likelihoods:

1. **Self-annotation** (with the EMA reference policy ``theta_old``, where the acting policy lives): the
   reconstruction error ``e_i = ||a_i - a_hat_i||^2`` of each step's chunk from noise level ``tau_mid``, and a
   pre-drawn training point ``(t, eps)`` with ``v_old = v_theta_old(x_t, t, s_i)``.
2. **Credit weights** per episode with outcome ``R`` (1 success, 0 failure): ``softmax(e_i / T)`` over its steps on
   success (uncertain but right steps weigh most), ``softmax(-e_i / T)`` on failure (confident but wrong ones),
   clipped to ``[w_min, w_max]`` and renormalised; labels ``y = 2R - 1``.
3. **Mirror branches** ``v+ = (1 - beta) v_old + beta v_theta`` and ``v- = (1 + beta) v_old - beta v_theta`` and
   their energies ``E+- = ||v+- - u||^2``, optionally scaled by ``1 / (2t)`` (``sde``).
4. **Losses**: ``mse_branch`` ``w [R E+ + (1 - R) E-]`` or ``softplus_kl``
   ``w softplus(y (E+ - E-) / 2) + kl_coeff ||v_theta - v_old||^2``. A step's weighted term is summed over its
   episode (the weights sum to 1 there, so every episode counts the same) and averaged over episodes; the KL term
   is a mean over steps.
5. **EMA reference** after every update: ``theta_old <- b theta_old + (1 - b) theta``, with ``b`` fixed (``fixed``)
   or ``min(eta_rate * i, eta_max)`` at update ``i`` (``linear``: it tracks the policy closely at first and
   holds back more later).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def reconstruction_error(actions: Tensor, reconstructed: Tensor) -> Tensor:
    """``||a - a_hat||^2`` per step: [N, D], [N, D] -> [N]."""
    return (actions - reconstructed).pow(2).sum(-1)


def credit_weights(
    errors: Tensor, episodes: Tensor, success: Tensor, temperature: float, w_min: float, w_max: float
) -> tuple[Tensor, Tensor]:
    """Per-step credit weights and per-step labels.

    errors [N] (the steps' ``e_i``), episodes [N] (each step's episode, 0..E-1), success [E] (0 or 1) ->
    (weights [N], summing to 1 over each episode's steps; labels [N], ``2R - 1`` of the step's episode).
    """
    num_episodes = success.shape[0]
    outcome = success[episodes]
    logits = torch.where(outcome > 0.5, errors, -errors) / temperature
    # Softmax within each episode: subtract the episode's max for stability, then normalise by its sum.
    episode_max = logits.new_full((num_episodes,), -torch.inf).scatter_reduce(0, episodes, logits, "amax")
    exp = (logits - episode_max[episodes]).exp()
    weights = exp / exp.new_zeros(num_episodes).index_add(0, episodes, exp)[episodes]
    if w_min > 0.0 or w_max < 1.0:
        weights = weights.clamp(w_min, w_max)
        weights = weights / exp.new_zeros(num_episodes).index_add(0, episodes, weights)[episodes]
    return weights, 2.0 * outcome - 1.0


def mirror_branches(v_theta: Tensor, v_old: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """``v+ = (1 - beta) v_old + beta v_theta``, ``v- = (1 + beta) v_old - beta v_theta``."""
    return (1.0 - beta) * v_old + beta * v_theta, (1.0 + beta) * v_old - beta * v_theta


def branch_energies(v_pos: Tensor, v_neg: Tensor, target: Tensor, t: Tensor, energy: str) -> tuple[Tensor, Tensor]:
    """``E+- = ||v+- - u||^2`` per step [N]; ``sde`` scales both by ``1 / (2t)``."""
    e_pos, e_neg = (v_pos - target).pow(2).sum(-1), (v_neg - target).pow(2).sum(-1)
    if energy == "sde":
        return e_pos / (2.0 * t), e_neg / (2.0 * t)
    return e_pos, e_neg


class FlowSARLoss(NamedTuple):
    loss: Tensor  # scalar, what the optimiser minimises
    e_pos: Tensor  # mean E+ over steps
    e_neg: Tensor  # mean E- over steps
    contrastive: (
        Tensor  # the weighted term, per episode (softplus_kl: the softplus ranking; mse_branch: the branch MSE)
    )
    kl_penalty: Tensor  # mean ||v_theta - v_old||^2 over steps (in the loss only with softplus_kl)


def flow_sar_loss(
    v_theta: Tensor,
    v_old: Tensor,
    target: Tensor,
    t: Tensor,
    weights: Tensor,
    labels: Tensor,
    num_episodes: int,
    beta: float,
    energy: str = "mse",
    variant: str = "softplus_kl",
    kl_coeff: float = 1.0,
) -> FlowSARLoss:
    """FlowSAR's loss over N steps of ``num_episodes`` episodes: velocities [N, D], target ``u`` [N, D], times,
    weights and labels [N] (from :func:`credit_weights`)."""
    v_pos, v_neg = mirror_branches(v_theta, v_old, beta)
    e_pos, e_neg = branch_energies(v_pos, v_neg, target, t, energy)
    kl = (v_theta - v_old).pow(2).sum(-1).mean()
    if variant == "mse_branch":
        success = (labels + 1.0) / 2.0
        per_step = success * e_pos + (1.0 - success) * e_neg
    elif variant == "softplus_kl":
        per_step = F.softplus(0.5 * labels * (e_pos - e_neg))
    else:
        raise ValueError(f"unknown FlowSAR loss variant {variant!r}: mse_branch or softplus_kl")
    contrastive = (weights * per_step).sum() / num_episodes
    loss = contrastive + kl_coeff * kl if variant == "softplus_kl" else contrastive
    return FlowSARLoss(loss, e_pos.mean(), e_neg.mean(), contrastive, kl)


def ema_decay(schedule: str, update: int, fixed_beta: float, eta_rate: float, eta_max: float) -> float:
    """The reference's retention ``b`` at update ``update`` (1, 2, ...): fixed, or ``min(eta_rate * i, eta_max)``."""
    if schedule == "fixed":
        return fixed_beta
    if schedule == "linear":
        return min(eta_rate * update, eta_max)
    raise ValueError(f"unknown EMA schedule {schedule!r}: fixed or linear")


@torch.no_grad()
def ema_update_(reference: nn.Module, policy: nn.Module, decay: float) -> None:
    """``reference <- decay * reference + (1 - decay) * policy``, parameter by parameter, in place."""
    for ref, current in zip(reference.parameters(), policy.parameters()):
        ref.mul_(decay).add_(current, alpha=1.0 - decay)


class Annotation(NamedTuple):
    errors: Tensor  # [N] e_i: how far the reference reconstructs the chunk from noise level tau_mid
    times: Tensor  # [N] the training point's flow time t ~ U[t_min, t_max]
    noise: Tensor  # [N, D] its noise eps
    v_old: Tensor  # [N, D] the reference's velocity at x_t = (1 - t) a + t eps


@torch.no_grad()
def self_annotate(reference, obs: dict[str, Tensor], actions: Tensor, tau_mid: float, t_min: float, t_max: float):
    """FlowSAR's self-annotation of N steps by the reference policy (an ``ActorCritic`` with a flow head): two
    velocity passes, one for the reconstruction error and one for the training point's ``v_old``."""
    features = reference.policy_features(obs)
    n = actions.shape[0]
    tau = torch.full((n,), tau_mid, device=actions.device)
    reconstructed = reference.flow_head.reconstruct(actions, tau, torch.randn_like(actions), features)
    times = t_min + (t_max - t_min) * torch.rand(n, device=actions.device)
    noise = torch.randn_like(actions)
    x_t = (1.0 - times[:, None]) * actions + times[:, None] * noise
    v_old = reference.flow_head.velocity(x_t, times, features)
    return Annotation(reconstruction_error(actions, reconstructed), times, noise, v_old)
