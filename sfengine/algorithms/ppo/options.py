"""PPO's own options (``--algo=ppo``, the ``ppo`` group of ``--help``): how each step's advantage is estimated (with
a critic: gae, vtrace; critic-free, from the outcomes of a group of episodes of one (task, init state):
``sfengine.algorithms.group_advantages``), and the policy surrogate (``sfengine.algorithms.ppo.surrogates``): how the ratio
r = pi / pi_old and the advantage make the policy loss. Defaults of the modes' parameters are the published ones.
Then PPO's loss and update: the clip (``--ppo_clip_ratio``), the value loss, the KL penalty and early stop, V-trace's
clips and the critic warm-up. The learner group keeps what every algorithm reads (``--gamma``, ``--gae_lambda``,
``--entropy_coeff``, ...). Names are flat on the command line, so presets and saved runs from before this group
load as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from sfengine.config import option


class SurrogateParams(NamedTuple):
    """The clip modes' parameters. The defaults are the published ones (sources in ``--help``)."""

    clip_ratio: float = 0.2  # eps of ppo_clip and ce_gppo; the reference range of the clip-fraction diagnostic
    soft_clip_alpha: float = 1.0
    sapo_tau_pos: float = 1.0  # SAPO (Qwen, 2025): tau for A > 0
    sapo_tau_neg: float = 1.05  # and a slightly steeper gate for A < 0
    ce_gppo_beta_low: float = 0.75  # CE-GPPO (Kuaishou Klear, 2025): gradient kept below the range, A < 0
    ce_gppo_beta_high: float = 1.0  # and above it, A > 0
    ce_gppo_dual_clip: float = 3.0  # the authors' code bounds A < 0 samples at r = 3 (dual-clip PPO); 0: off
    cispo_eps_low: float = 1.0  # CISPO (MiniMax-M1, arXiv 2506.13585): no lower bound on the weight ...
    cispo_eps_high: float = 0.28  # ... and an upper one at 1.28


PUBLISHED = SurrogateParams()  # the clip modes' published parameters

# Every --clip_mode by name, with the --target_kl its runs take when they set none (its own trust region): the
# built-in modes here, so that a command checks its options before it imports torch; their functions are in
# sfengine.algorithms.ppo.surrogates, whose ``register_surrogate`` adds a user's mode to both. ppo_clip's clip
# bounds each step already; the others keep a gradient outside their range or have no hard range, and with policy
# lag a batch can move them far (CartPole, asynchronous, 1e-3: approx KL jumped to 0.3-1.1 and they collapsed to
# return 9). At 0.01 every run of the four crossed 400 within 216k steps and ended at 500; at 0.02 cispo fell after
# crossing in 2 of 10 seeds, at 0.03 three modes in 1 of 5 (benchmarks/README.md, "Clip modes alone").
MODE_TARGET_KL = 0.01
SURROGATE_TARGET_KL: dict[str, float] = {
    "ppo_clip": 0.0,
    **dict.fromkeys(("soft_clip", "sapo", "ce_gppo", "cispo"), MODE_TARGET_KL),
}
# Every critic-free --advantage by name, the same way: the built-in ones here, their functions and a user's in
# sfengine.algorithms.group_advantages (``register_group_advantage``).
GROUP_ADVANTAGE_NAMES: list[str] = ["rloo", "grpo"]


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
    ppo_clip_ratio: float = option(0.2, "PPO clip on the probability ratio")
    ppo_clip_value: float = option(1.0, "clip on the change of the value prediction (0: no value clipping)")
    value_loss_coeff: float = option(0.5, "weight of the value loss")
    kl_coeff: float = option(
        0.0,
        "weight of a penalty on the KL divergence from the policy the run started from (its --init_from clone; "
        "kept in checkpoints), estimated per sample as GRPO does; keeps a long fine-tuning near its clone; 0: off",
    )
    target_kl: float = option(
        0.0,
        "end an update early, before its next minibatch step, once a step's approximate KL from the acting policy "
        "passed 1.5 x this (the ranks' mean), as CleanRL and SB3 do: no batch moves the policy far; 0: off. Unset, "
        "--algo=ppo takes its --clip_mode's: off for ppo_clip, 0.01 for soft_clip, sapo, ce_gppo and cispo",
    )
    normalize_advantage: bool = option(True, "normalise advantages per minibatch")
    vtrace_rho: float = option(1.0, "V-trace importance-weight clip for the value targets")
    vtrace_c: float = option(1.0, "V-trace trace-cutting clip")
    critic_warmup_batches: int = option(
        0,
        "train the value head alone for the first N training batches: the policy's weights, its log-std and the "
        "observation statistics stay as they start (the workers act with the initial policy, e.g. one from "
        "--init_from); with --actor_critic=shared the encoder is the policy's and stays too, only the value head moves",
    )
