"""SAC (``--algo=sac``): soft actor-critic from a replay, in the engine's asynchronous data flow.

Rollout and inference workers sample as for any algorithm; the learner puts each training batch of new
trajectories into its replay (``sfengine.algorithms.offpolicy.replay``) and takes ``--replay_ratio`` gradient steps
per env step on n-step minibatches drawn from it, with an ensemble of LayerNorm critics whose target is the minimum
of a random subset (``offpolicy.critics``) and a temperature learned to a target entropy. The acting policy is a
tanh-squashed Gaussian (``actor.SquashedGaussianActor``); the update is ``trainer.SACTrainer``. Options: the ``sac``
group of ``--help``.
"""

from __future__ import annotations

import psutil

from sfengine.algorithms import TRAJECTORIES, Algorithm, register_algorithm
from sfengine.algorithms.offpolicy.replay import check_replay_fits
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.algorithms.sac.options import SACOptions
from sfengine.algorithms.sac.trainer import SACTrainer
from sfengine.config import Config, ConfigError
from sfengine.env.spaces import ActionSpec, ObsSpec

# The engine's defaults are PPO's; SAC's published ones where a run gives none (Stable-Baselines3 and CleanRL agree:
# minibatches of 256, Adam at 3e-4, no gradient clipping; a 256-256 ReLU actor with a state-dependent log-std).
SAC_DEFAULTS = {
    "batch_size": 256,
    "num_batches_per_epoch": 1,
    "num_epochs": 1,
    "learning_rate": 3e-4,
    "max_grad_norm": 0.0,
    "continuous_log_std": "state_dependent",
    "hidden_sizes": [256, 256],
    "activation": "relu",
}


def defaults(cfg: Config, given: set[str]) -> None:
    for name, value in SAC_DEFAULTS.items():
        if name not in given:
            cfg.set(name, value)


def validate(cfg: Config) -> None:
    sac = cfg.algorithm_options
    if cfg.model.action_chunk != 1:
        raise ConfigError("--algo=sac learns one action per step: drop --action_chunk")
    if cfg.model.policy_head != "gaussian":
        raise ConfigError(f"--algo=sac acts with its own squashed Gaussian: drop --policy_head={cfg.model.policy_head}")
    if cfg.learner.num_epochs != 1:
        raise ConfigError("--algo=sac takes --replay_ratio gradient steps per env step; --num_epochs is PPO's: drop it")
    if sac.replay_ratio <= 0:
        raise ConfigError(f"--replay_ratio={sac.replay_ratio} must be positive (gradient steps per env step)")
    if sac.replay_size < cfg.sampler.rollout:
        raise ConfigError(f"--replay_size={sac.replay_size} must hold at least one trajectory (--rollout)")
    if sac.n_step < 1 or sac.actor_delay < 1:
        raise ConfigError("--n_step and --actor_delay must be at least 1")
    if not 1 <= sac.critic_subset <= sac.num_critics:
        raise ConfigError(f"--critic_subset={sac.critic_subset} must be between 1 and --num_critics={sac.num_critics}")
    if not 0 < sac.tau <= 1 or sac.init_temperature <= 0 or sac.critic_learning_rate <= 0:
        raise ConfigError("--tau must be in (0, 1], --init_temperature and --critic_learning_rate positive")
    if sac.learning_starts < 0:
        raise ConfigError(f"--learning_starts={sac.learning_starts} must not be negative")


def check(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> None:
    images = [key for key in obs_spec.shapes if obs_spec.is_image(key)]
    if images:
        raise ConfigError(
            f"--algo=sac reads vector observations, and this env has image observations ({', '.join(images)}): use a "
            "vector observation mode (LIBERO: --libero_obs_mode=state), or --algo=ppo for images"
        )
    check_replay_fits(cfg.algorithm_options.replay_size, obs_spec, action_spec, psutil.virtual_memory().available)


def describe(cfg: Config) -> str:
    sac = cfg.algorithm_options
    words = f"replay ratio {sac.replay_ratio:g}, {sac.num_critics} critics"
    if sac.critic_subset < sac.num_critics:
        words += f" (target: min of {sac.critic_subset})"
    if sac.n_step > 1:
        words += f", {sac.n_step}-step returns"
    return words


def status(cfg: Config, learner: dict[str, float]) -> str | None:
    """``critic loss 0.41 q -35.2 td 0.48 alpha 0.21 entropy -0.8  256 steps a batch``; before the first gradient
    step, how full the replay is."""
    if "critic_loss" not in learner:
        if "replay_fill" not in learner:
            return None
        return f"filling the replay to --learning_starts ({learner['replay_fill']:.1%} of --replay_size)"
    return (
        f"critic loss {learner['critic_loss']:.3g} q {learner['q_mean']:.3g} td {learner['td_error']:.3g} "
        f"alpha {learner['temperature']:.3g} entropy {learner.get('entropy', float('nan')):.2f}  "
        f"{learner['gradient_steps']:.0f} steps a batch"
    )


register_algorithm(
    "sac",
    Algorithm(
        trainer=SACTrainer,
        options=SACOptions,
        validate=validate,
        defaults=defaults,
        critic=False,  # the acting model has no value head: the critics are the trainer's
        batch=TRAJECTORIES,
        final_obs=True,
        model=SquashedGaussianActor.build,
        title="SAC",
        describe=describe,
        status=status,
        check=check,
    ),
)
