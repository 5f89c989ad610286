"""PPO (``--algo=ppo``, the default): the policy surrogate of ``--clip_mode`` (``sfengine.algorithms.ppo.surrogates``) with
the advantages of ``--advantage``: with a critic (GAE, V-trace) on trajectory batches, or critic-free (RLOO,
GRPO, or one given to ``register_group_advantage``) on batches of whole groups of episodes of one (task, init
state). The update is ``trainer.PPOTrainer``; the math is in ``loss`` and ``surrogates`` beside it.
"""

from __future__ import annotations

from sfengine.algorithms import GROUPS, TRAJECTORIES, Algorithm, imported_on_call, register_algorithm
from sfengine.algorithms.ppo.options import GROUP_ADVANTAGE_NAMES, SURROGATE_TARGET_KL, PPOOptions
from sfengine.config import Config, ConfigError

CRITIC_ADVANTAGES = ("gae", "vtrace")


def ppo_options(cfg: Config) -> PPOOptions:
    """The run's PPO options (the ``ppo`` group)."""
    return cfg.options_group(PPOOptions.group)


def group_advantages(cfg: Config) -> bool:
    """Critic-free: each episode judged against the others of its group, no value head."""
    return ppo_options(cfg).advantage not in CRITIC_ADVANTAGES


def validate(cfg: Config) -> None:
    advantage = ppo_options(cfg).advantage
    if cfg.model.policy_head == "flow":
        raise ConfigError(
            "--policy_head=flow has no likelihood, which PPO's ratio needs: train it with --algo=flow_sar"
        )
    advantages = [*CRITIC_ADVANTAGES, *GROUP_ADVANTAGE_NAMES]
    if advantage not in advantages:
        raise ConfigError(
            f"--advantage={advantage!r} is not one of {', '.join(advantages)}; register a "
            "new one with sfengine.algo.register_group_advantage"
        )
    grouped = group_advantages(cfg)
    if grouped and not cfg.sampler.async_rl:
        raise ConfigError(
            f"--advantage={advantage} trains on whole groups, which end at their own times, not on each worker's "
            "share of rollouts: use --async_rl=true (each step keeps the version that acted; the clip applies to it)"
        )
    if grouped and cfg.env.task_group_size < 2:
        raise ConfigError(
            f"--advantage={advantage} compares the episodes of a group with each other, and --task_group_size="
            f"{cfg.env.task_group_size} makes groups of one: use --task_group_size=2 or more (e.g. 8)"
        )
    if ppo_options(cfg).group_loss_weighting != "step" and not grouped:
        raise ConfigError(
            f"--group_loss_weighting={ppo_options(cfg).group_loss_weighting} weighs the episodes of a group, and "
            f"--advantage={advantage} has no groups: use --advantage=rloo or grpo, or drop the option"
        )
    validate_policy_loss(ppo_options(cfg))
    options = ppo_options(cfg)
    if options.ppo_clip_ratio <= 0:
        raise ConfigError(f"--ppo_clip_ratio={options.ppo_clip_ratio} must be positive")
    for name in ("ppo_clip_value", "value_loss_coeff", "kl_coeff", "target_kl", "critic_warmup_batches"):
        if getattr(options, name) < 0:
            raise ConfigError(f"--{name}={getattr(options, name)} must not be negative")
    if options.critic_warmup_batches and grouped:
        raise ConfigError(
            f"--critic_warmup_batches trains the value head, and --advantage={advantage} has none: drop it, or train "
            "with --advantage=gae or vtrace"
        )


def validate_policy_loss(policy: PPOOptions) -> None:
    if policy.clip_mode not in SURROGATE_TARGET_KL:
        raise ConfigError(
            f"--clip_mode={policy.clip_mode!r} is not one of {', '.join(SURROGATE_TARGET_KL)}; register a new one with "
            "sfengine.algo.register_surrogate"
        )
    for name in ("soft_clip_alpha", "ce_gppo_beta_low", "ce_gppo_beta_high", "cispo_eps_high"):
        if getattr(policy, name) < 0:
            raise ConfigError(f"--{name}={getattr(policy, name)} must not be negative")
    for name in ("sapo_tau_pos", "sapo_tau_neg"):
        if getattr(policy, name) <= 0:
            raise ConfigError(f"--{name}={getattr(policy, name)} must be positive")
    if policy.ce_gppo_dual_clip != 0 and policy.ce_gppo_dual_clip <= 1:
        raise ConfigError(
            f"--ce_gppo_dual_clip={policy.ce_gppo_dual_clip} must be above 1 (it bounds ratios above the clip "
            "range), or 0 to turn it off"
        )
    if not 0 <= policy.cispo_eps_low <= 1:
        raise ConfigError(f"--cispo_eps_low={policy.cispo_eps_low} must be in [0, 1] (1: no lower bound)")


def defaults(cfg: Config, given: set[str]) -> None:
    """A clip mode's own trust region: its --target_kl (``register_surrogate``), unless the run sets one."""
    if "target_kl" not in given:
        ppo_options(cfg).target_kl = SURROGATE_TARGET_KL.get(ppo_options(cfg).clip_mode, 0.0)


def numpy_learner_unsupported(cfg: Config) -> str | None:
    """Why the numpy learner cannot take PPO's step in this run, or None (it has the ppo_clip surrogate and no KL
    penalty)."""
    if ppo_options(cfg).kl_coeff > 0:
        return "the KL penalty (--kl_coeff) runs in torch"
    mode = ppo_options(cfg).clip_mode
    return None if mode == "ppo_clip" else f"--clip_mode={mode} runs in torch (numpy has ppo_clip)"


def describe(cfg: Config) -> str:
    advantage = ppo_options(cfg).advantage
    words = {"gae": "GAE", "vtrace": "V-trace"}.get(advantage, f"{advantage.upper()}, no critic")
    if group_advantages(cfg):
        words += f", groups of {cfg.env.task_group_size}"
    if ppo_options(cfg).clip_mode != "ppo_clip":
        words += f", {ppo_options(cfg).clip_mode}"
    if ppo_options(cfg).target_kl:
        words += f", target KL {ppo_options(cfg).target_kl:g}"
    if ppo_options(cfg).critic_warmup_batches:
        words += (
            f", critic warm-up: the first {ppo_options(cfg).critic_warmup_batches} batches train the value head alone"
        )
    return words


def status(cfg: Config, learner: dict[str, float]) -> str | None:
    """The policy update's diagnostics for the status line: ``ppo_clip kl 0.0041 clipped 0.06 dead-grad 0.06
    ess 0.98 ratio 0.71-1.38``, named by the run's --clip_mode; None before the first update."""
    if "approx_kl" not in learner:
        return None
    clip_mode = ppo_options(cfg).clip_mode
    line = (
        f"{clip_mode} kl {learner['approx_kl']:.4f} clipped {learner['clip_fraction']:.2f} "
        f"dead-grad {learner['dead_grad_fraction']:.2f} ess {learner['ess']:.2f} "
        f"ratio {learner['ratio_min']:.2f}-{learner['ratio_max']:.2f}"
    )
    if "sapo_saturated_fraction" in learner:
        line += f" saturated {learner['sapo_saturated_fraction']:.2f}"
    if "groups_dropped_fraction" in learner:
        line += f"  groups dropped {learner['groups_dropped_fraction']:.2f}"
    if learner.get("critic_warmup"):
        line += "  critic warm-up: the policy is frozen"
    return line


register_algorithm(
    "ppo",
    Algorithm(
        trainer=imported_on_call("sfengine.algorithms.ppo.trainer:PPOTrainer"),
        validate=validate,
        defaults=defaults,
        critic=lambda cfg: not group_advantages(cfg),
        batch=lambda cfg: GROUPS if group_advantages(cfg) else TRAJECTORIES,
        options=PPOOptions,
        numpy_learner=numpy_learner_unsupported,
        title="PPO",
        describe=describe,
        status=status,
    ),
)
