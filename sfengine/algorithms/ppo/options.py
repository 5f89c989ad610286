"""PPO's own options (``--algo=ppo``, the ``ppo`` group of ``--help``): how each step's advantage is estimated (with
a critic: gae, vtrace; critic-free, from the outcomes of a group of episodes of one (task, init state):
``sfengine.algorithms.group_advantages``), and the policy surrogate (``sfengine.algorithms.ppo.surrogates``): how the ratio
r = pi / pi_old and the advantage make the policy loss. Defaults of the modes' parameters are the published ones.
The learner group's PPO settings (``--ppo_clip_ratio``, ``--gae_lambda``, ...) predate this group and keep their
names and place."""

from __future__ import annotations

from dataclasses import dataclass

from sfengine.algorithms.ppo.surrogates import SurrogateParams
from sfengine.config import option

PUBLISHED = SurrogateParams()  # the clip modes' published parameters


@dataclass
class PPOOptions:
    group = "ppo"

    advantage: str = option(
        "gae",
        "gae (with a critic), vtrace (with a critic, corrects policy lag), rloo or grpo (no critic: each episode "
        "against the other --task_group_size - 1 episodes of its (task, init state)), or a name given to "
        "register_group_advantage",
    )
    dynamic_sampling: bool = option(
        False, "rloo/grpo: drop groups whose outcomes are all equal (they carry no signal); counted and reported"
    )
    group_loss_weighting: str = option(
        "step",
        "rloo/grpo: how a group's episodes weigh in the loss: step (every step alike, so an episode that ran to the "
        "time limit outweighs a short success) or episode (every episode alike, whatever its length)",
        ("step", "episode"),
    )
    recompute_advantages: bool = option(
        False,
        "gae: recompute the values, advantages and value targets with the learner's current critic before every "
        "epoch, instead of once from the values the acting policy wrote (costs one critic pass over the batch per "
        "epoch)",
    )
    clip_mode: str = option(
        "ppo_clip",
        "policy surrogate: ppo_clip (PPO's clipped ratio, eps = --ppo_clip_ratio), soft_clip (no cut, extreme ratios "
        "damped), sapo (sigmoid gate), ce_gppo (PPO's clip, but clipped samples keep a scaled gradient), cispo "
        "(clipped, detached ratio times log pi), or a name given to register_surrogate",
    )
    soft_clip_alpha: float = option(
        PUBLISHED.soft_clip_alpha, "soft_clip: the damping coefficient is (1 / max(r, 1/r))^alpha"
    )
    sapo_tau_pos: float = option(PUBLISHED.sapo_tau_pos, "sapo: gate temperature for A > 0 (the SAPO paper's default)")
    sapo_tau_neg: float = option(PUBLISHED.sapo_tau_neg, "sapo: gate temperature for A < 0 (the SAPO paper's default)")
    ce_gppo_beta_low: float = option(
        PUBLISHED.ce_gppo_beta_low,
        "ce_gppo: gradient scale of samples clipped below 1 - eps with A < 0 (CE-GPPO authors' default)",
    )
    ce_gppo_beta_high: float = option(
        PUBLISHED.ce_gppo_beta_high,
        "ce_gppo: gradient scale of samples clipped above 1 + eps with A > 0 (CE-GPPO authors' default)",
    )
    ce_gppo_dual_clip: float = option(
        PUBLISHED.ce_gppo_dual_clip,
        "ce_gppo: samples with A < 0 and a ratio above this keep the value c A and no gradient (dual clip, as in "
        "the CE-GPPO authors' code; 0: off)",
    )
    cispo_eps_low: float = option(
        PUBLISHED.cispo_eps_low,
        "cispo: the weight is clipped below at 1 - eps_low (1: no lower bound, as in MiniMax-M1's CISPO)",
    )
    cispo_eps_high: float = option(
        PUBLISHED.cispo_eps_high,
        "cispo: the weight is clipped above at 1 + eps_high (0.28, the default of Trinity-RFT's CISPO)",
    )
