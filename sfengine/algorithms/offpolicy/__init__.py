"""What the off-policy algorithms (SAC, TD3) share: the replay with its n-step targets (``replay``), the critic
ensemble with its subset-min target and Polyak averaging (``critics``), the trainer base (``trainer``), their
options (``options``, one ``offpolicy`` group) and the rules, defaults and checks below."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from sfengine.algorithms import TRAJECTORIES, Algorithm, imported, imported_on_call
from sfengine.algorithms.offpolicy.options import OffPolicyOptions
from sfengine.config import Config, ConfigError, apply_overrides, load_preset

if TYPE_CHECKING:
    from sfengine.env.spaces import ActionSpec, ObsSpec

# The engine's defaults are PPO's; these are the published off-policy ones where a run gives none (Stable-Baselines3,
# CleanRL and the TD3 paper agree: minibatches of 256, Adam at 3e-4 with PyTorch's eps, no gradient clipping, 256-256
# ReLU networks). --adam_eps is every optimiser's of the run: the actor's, the critics' and SAC's temperature's.
OFF_POLICY_DEFAULTS = {
    "batch_size": 256,
    "num_batches_per_epoch": 1,
    "num_epochs": 1,
    "learning_rate": 3e-4,
    "adam_eps": 1e-8,
    "max_grad_norm": 0.0,
    "hidden_sizes": [256, 256],
    "activation": "relu",
}


# Where an env step costs less than this, a gradient step (several ms on a CPU core) sets the pace of a run at
# replay ratio 1, and more envs acting asynchronously only make the acting policy older: HalfCheetah-v5 reached
# twice the return at 50k env steps with the cheap-env preset's 4 envs in step with the learner as with the engine's
# 16 asynchronous ones (benchmarks/README.md, "SAC's own layout on a cheap env"). A slower env keeps the engine's
# layout: there the envs set the pace.
CHEAP_STEP_SEC = 1e-3
CHEAP_ENV_PRESET = "sac_mujoco"


def layout(cfg: Config, step_sec: float) -> str | None:
    """On a cheap env, the sampler layout of ``configs/sac_mujoco.yaml``; and its critics without LayerNorm, unless
    given or the replay ratio is above 1: LayerNorm keeps critics from diverging at high replay ratios, and at 1 the
    critics did as well or better without it on the three cheap envs measured (Hopper-v5 2,735 against 1,857 at 300k
    env steps, HalfCheetah-v5 8,209 against 8,104, sparse_reach to 0.9 success in 6,827 against 8,021 env steps; 3
    seeds each, benchmarks/README.md). LIBERO's residual runs, whose env steps are not cheap, keep it."""
    from sfengine.engine.sizing import SAMPLER_LAYOUT

    if step_sec >= CHEAP_STEP_SEC:
        return None
    preset = load_preset(CHEAP_ENV_PRESET)
    taken = [*SAMPLER_LAYOUT]
    if "critic_layer_norm" not in cfg.chosen and cfg.algorithm_options.replay_ratio <= 1:
        taken.append("critic_layer_norm")
    chosen = {name: preset[name] for name in taken if name in preset}
    apply_overrides(cfg, chosen, f"--cfg={CHEAP_ENV_PRESET}")
    settings = ", ".join(f"{name}={cfg.get(name)}" for name in chosen)
    return (
        f"a cheap env ({step_sec * 1e3:.2f} ms a step): {settings} (as --cfg={CHEAP_ENV_PRESET}), so that the envs "
        "act with the learner's newest weights (give any of the layout's options for another)"
    )


# A residual policy with demonstrations pays TD3+BC's price for leaving them (alpha 2.5) unless told otherwise: on
# LIBERO-Object tasks 0-2 it took the clone from 0.34 to 0.75 in 100k env steps, where without it training success
# first fell from 0.49 to 0.22 and was 0.62 at 100k, and a residual penalty of 0.02 held the clone where it was
# (benchmarks/README.md, "Residual off-policy fine-tuning on LIBERO").
RESIDUAL_BC_WEIGHT = 0.4


def off_policy_algorithm(
    trainer: str, actor: str, residual: str, title: str, own_defaults: dict, own_check: Callable | None = None
) -> Algorithm:
    """The spec of an off-policy algorithm: its trainer (an ``OffPolicyTrainer``), the policy it acts with (its
    ``actor`` class, or with --residual_over its ``residual`` class over the frozen base), each as ``module:name``
    (imported when a run builds them, so reading the options imports no torch), the defaults it sets beyond the
    shared ones where a run gives none, and its own rules on the env's spaces beside the shared ``check``."""

    def checks(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> None:
        check(cfg, obs_spec, action_spec)
        if own_check is not None:
            own_check(cfg, obs_spec, action_spec)

    def defaults(cfg: Config, given: set[str]) -> None:
        for name, value in {**OFF_POLICY_DEFAULTS, **own_defaults}.items():
            if name not in given:
                cfg.set(name, value)
        if cfg.algorithm_options.residual_over and cfg.learner.demos and "bc_weight" not in given:
            cfg.set("bc_weight", RESIDUAL_BC_WEIGHT)

    def model(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec):
        from sfengine.algorithms.offpolicy.residual import policy_factory

        return policy_factory(imported(actor), imported(residual))(cfg, obs_spec, action_spec)

    return Algorithm(
        trainer=imported_on_call(trainer),
        options=OffPolicyOptions,
        validate=validate,
        defaults=defaults,
        critic=False,  # the acting model has no value head: the critics are the trainer's
        batch=TRAJECTORIES,
        final_obs=True,  # n-step targets bootstrap a time limit from the episode's own last observation
        demos=True,  # kept in a replay of their own, drawn at --demo_ratio
        model=model,
        check=checks,
        check_resume=check_resume,
        title=title,
        describe=describe,
        status=status,
        layout=layout,
    )


def validate(cfg: Config) -> None:
    options, algo = cfg.algorithm_options, cfg.learner.algo
    if cfg.model.policy_head != "gaussian":
        raise ConfigError(
            f"--algo={algo} acts with its own squashed policy: drop --policy_head={cfg.model.policy_head}"
        )
    if cfg.learner.num_epochs != 1:
        raise ConfigError(
            f"--algo={algo} takes --replay_ratio gradient steps per env step; --num_epochs is PPO's: drop it"
        )
    if options.replay_ratio <= 0:
        raise ConfigError(f"--replay_ratio={options.replay_ratio} must be positive (gradient steps per env step)")
    if options.replay_size < cfg.sampler.rollout:
        raise ConfigError(f"--replay_size={options.replay_size} must hold at least one trajectory (--rollout)")
    if options.n_step < 1 or options.actor_delay < 1:
        raise ConfigError("--n_step and --actor_delay must be at least 1")
    if not 1 <= options.critic_subset <= options.num_critics:
        raise ConfigError(
            f"--critic_subset={options.critic_subset} must be between 1 and --num_critics={options.num_critics}"
        )
    if not 0 < options.tau <= 1 or options.critic_learning_rate <= 0:
        raise ConfigError("--tau must be in (0, 1] and --critic_learning_rate positive")
    if options.init_temperature <= 0:
        raise ConfigError(f"--init_temperature={options.init_temperature} must be positive")
    if min(options.exploration_noise, options.target_noise, options.target_noise_clip) < 0:
        raise ConfigError("--exploration_noise, --target_noise and --target_noise_clip must not be negative")
    if not 0 <= options.demo_ratio < 1:
        raise ConfigError(f"--demo_ratio={options.demo_ratio} must lie in [0, 1) (the share of demonstration samples)")
    if options.residual_scale <= 0 or options.residual_scale > 2:
        raise ConfigError(f"--residual_scale={options.residual_scale} must lie in (0, 2] (half-ranges of the box)")
    if options.residual_base_device:
        check_base_device(options)
    if options.ibrl and (algo != "td3" or not options.residual_over):
        raise ConfigError(
            "--ibrl lets the critics choose between a frozen base's action and the actor's correction of it: it "
            "needs --algo=td3 and --residual_over"
        )
    if min(options.critic_warmup_updates, options.residual_penalty, options.bc_weight, options.squash_penalty) < 0:
        raise ConfigError(
            "--critic_warmup_updates, --residual_penalty, --bc_weight and --squash_penalty must not be negative"
        )
    if options.bc_weight > 0 and not cfg.learner.demos:
        raise ConfigError("--bc_weight pulls the actor toward the demonstrations: give them with --demos=FILE")
    if "demo_ratio" in cfg.asked and not cfg.learner.demos:
        raise ConfigError(
            f"--demo_ratio={options.demo_ratio:g} is the demonstrations' share of each minibatch, and none are given: "
            "give them with --demos=FILE, or drop --demo_ratio"
        )
    if options.learning_starts < 0:
        raise ConfigError(f"--learning_starts={options.learning_starts} must not be negative")
    if not 0 <= options.image_shift < 0.5:
        raise ConfigError(
            f"--image_shift={options.image_shift:g} is a fraction of an image's side: give 0 or more, under 0.5"
        )


def check_base_device(options) -> None:
    import torch

    where = f"--residual_base_device={options.residual_base_device}"
    if not options.residual_over:
        raise ConfigError(f"{where} places the base of --residual_over, and none is given: drop it")
    try:
        device = torch.device(options.residual_base_device)
    except RuntimeError:
        raise ConfigError(f"{where} is not a device torch knows: give cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"{where}: torch sees {torch.cuda.device_count()} CUDA devices; give one of them or cpu")


def check(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> None:
    from sfengine.algorithms.offpolicy.replay import check_replay_fits
    from sfengine.demos.fit import check_demos_fit, read_run_demos

    check_replay_fits(cfg.algorithm_options.replay_size, obs_spec, action_spec, psutil.virtual_memory().available)
    if cfg.learner.demos:
        check_demos_fit(read_run_demos(cfg), cfg, obs_spec, action_spec)


def check_resume(cfg: Config, model, state: dict) -> None:
    """The checkpoint's critics fit --num_critics, --critic_hidden_sizes and --critic_layer_norm (a mismatch
    raises load_state_dict's RuntimeError); the optimiser's state and the targets have the critics' shapes. A
    replay it keeps (--save_replay) fits --replay_size and --rollout, unless this run drops it (--save_replay=false)."""
    from sfengine.algorithms.offpolicy.critics import CriticEnsemble
    from sfengine.algorithms.offpolicy.replay import replay_rows

    width = model.critic_feature_dim + model.action_spec.dim
    CriticEnsemble.of_options(cfg.algorithm_options, width).load_state_dict(state["critics"])
    if "replay" not in state or not cfg.algorithm_options.save_replay:
        return
    saved = tuple(state["replay"]["actions"].shape[:2])
    here = (replay_rows(cfg.algorithm_options.replay_size, cfg.sampler.rollout, model.action_spec), cfg.sampler.rollout)
    if saved != here:
        raise RuntimeError(
            f"its replay (--save_replay) holds {saved[0]} trajectories of {saved[1]} steps, this run's "
            f"{here[0]} of {here[1]} (--replay_size, --rollout; --save_replay=false refills it instead)"
        )


def describe(cfg: Config) -> str:
    options = cfg.algorithm_options
    words = f"replay ratio {options.replay_ratio:g}, {options.num_critics} critics"
    if options.critic_subset < options.num_critics:
        words += f" (target: min of {options.critic_subset})"
    if options.n_step > 1:
        words += f", {options.n_step}-step returns"
    if cfg.model.action_chunk > 1:
        words += f" over chunks of {cfg.model.action_chunk} actions"
    if cfg.learner.demos and options.demo_ratio > 0:
        words += f", demonstrations {options.demo_ratio:.0%} of each minibatch"
    if options.residual_over:
        words += f"; a correction of at most {options.residual_scale:g} over {options.residual_over} (frozen)"
        if options.ibrl:
            words += ", the critics choosing between the base's action and the corrected one (IBRL)"
    return words


def status(cfg: Config, learner: dict[str, float]) -> str | None:
    """``critic loss 0.41 q -35.2 td 0.48 alpha 0.21 entropy -0.8  256 steps a batch``; before the first gradient
    step, how full the replay is."""
    if "critic_loss" not in learner:
        if "replay_fill" not in learner:
            return None
        return f"filling the replay to --learning_starts ({learner['replay_fill']:.1%} of --replay_size)"
    words = f"critic loss {learner['critic_loss']:.3g} q {learner['q_mean']:.3g} td {learner['td_error']:.3g} "
    if "temperature" in learner:
        words += f"alpha {learner['temperature']:.3g} entropy {learner.get('entropy', float('nan')):.2f} "
    if "residual_size" in learner:
        words += f"correction {learner['residual_size']:.0%} of its bound "
    if learner.get("actor_saturated", 0) >= 0.5:  # TD3: most of the actor's outputs where tanh is flat
        words += f"actor saturated {learner['actor_saturated']:.0%} (--squash_penalty) "
    return words + f" {learner['gradient_steps']:.0f} steps a batch"
