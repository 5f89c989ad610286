"""SAC (``--algo=sac``): soft actor-critic from a replay, in the engine's asynchronous data flow.

Rollout and inference workers sample as for any algorithm; the learner puts each training batch of new
trajectories into its replay (``sfengine.algorithms.offpolicy.replay``) and takes ``--replay_ratio`` gradient steps
per env step on n-step minibatches drawn from it, with an ensemble of LayerNorm critics whose target is the minimum
of a random subset (``offpolicy.critics``) and a temperature learned to a target entropy. The acting policy is a
tanh-squashed Gaussian (``actor.SquashedGaussianActor``); the update is ``trainer.SACTrainer``. Options: the
``offpolicy`` group of ``--help``, shared with TD3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sfengine.algorithms import register_algorithm
from sfengine.algorithms.offpolicy import off_policy_algorithm
from sfengine.config import Config, ConfigError

if TYPE_CHECKING:
    from sfengine.env.spaces import ActionSpec, ObsSpec

# The critics (and the temperature) at CleanRL's 1e-3 rather than the 3e-4 of SB3 and RLPD: HalfCheetah-v5 at 150k
# env steps 5,381 against 4,363 (2 seeds each), sparse_reach to 0.9 success in a third of the env steps
# and level on Hopper-v5 (benchmarks/README.md, "Hopper-v5 and sparse_reach with the critics at 1e-3"). TD3 keeps
# 3e-4, with which its LIBERO runs were made.
SAC_DEFAULTS = {"continuous_log_std": "state_dependent", "critic_learning_rate": 1e-3}


def default_target_entropy(dim: int, residual_scale: float = 1.0) -> float:
    """The entropy SAC's temperature holds unless --target_entropy says: -1 a dimension (SB3's and CleanRL's), and
    for a residual policy, whose log-density is the correction's in a box --residual_scale times the env's, that
    target moved by the box's shrink, log(scale) a dimension. Left at -1 a dimension, a correction within 0.1
    half-ranges could not reach it (at most log 0.2 a dimension on a unit box): the temperature grew tenfold every
    few seconds and the critics diverged."""
    return dim * (-1.0 + math.log(residual_scale))


def most_entropy(half_ranges: Sequence[float]) -> float:
    """The entropy of the uniform distribution over the box (each half-range): more than any squashed Gaussian in
    it has."""
    return sum(math.log(2 * half) for half in half_ranges)


def check_target_entropy(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> None:
    """A target entropy the policy cannot reach in its box would have the temperature grow without bound."""
    options = cfg.algorithm_options
    scale = options.residual_scale if options.residual_over else 1.0
    box = [(high - low) / 2 * scale for low, high in zip(action_spec.low, action_spec.high, strict=True)]
    most = most_entropy(box)
    target = options.target_entropy or default_target_entropy(action_spec.dim, scale)
    if target >= most:
        given = f"--target_entropy={target:g}" if options.target_entropy else f"the default target entropy {target:.2f}"
        where = "the correction's box (--residual_scale)" if options.residual_over else "the env's action box"
        raise ConfigError(
            f"{given} is more than SAC's policy can have in {where}: at most {most:.2f}, so its temperature would "
            f"grow without bound; give --target_entropy below {most:.2f}"
        )


register_algorithm(
    "sac",
    off_policy_algorithm(
        trainer="sfengine.algorithms.sac.trainer:SACTrainer",
        actor="sfengine.algorithms.sac.actor:SquashedGaussianActor",
        residual="sfengine.algorithms.sac.actor:ResidualSAC",
        title="SAC",
        own_defaults=SAC_DEFAULTS,
        own_check=check_target_entropy,
    ),
)
