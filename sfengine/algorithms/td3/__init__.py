"""TD3 (``--algo=td3``): twin delayed deep deterministic policy gradient from a replay, on the same base as SAC
(``sfengine.algorithms.offpolicy``): a deterministic squashed actor acting with Gaussian exploration noise
(``actor.DeterministicActor``), target policy smoothing, the actor and its target updated every second critic step
(``trainer.TD3Trainer``). Options: the ``offpolicy`` group of ``--help``, shared with SAC."""

from __future__ import annotations

from sfengine.algorithms import TRAJECTORIES, Algorithm, register_algorithm
from sfengine.algorithms.offpolicy import check, describe, set_defaults, status, validate
from sfengine.algorithms.offpolicy.options import OffPolicyOptions
from sfengine.algorithms.td3.actor import DeterministicActor
from sfengine.algorithms.td3.trainer import TD3Trainer
from sfengine.config import Config


def defaults(cfg: Config, given: set[str]) -> None:
    set_defaults(cfg, given, {"actor_delay": 2})  # the TD3 paper's policy delay


register_algorithm(
    "td3",
    Algorithm(
        trainer=TD3Trainer,
        options=OffPolicyOptions,
        validate=validate,
        defaults=defaults,
        critic=False,
        batch=TRAJECTORIES,
        final_obs=True,
        model=DeterministicActor.build,
        check=check,
        title="TD3",
        describe=describe,
        status=status,
    ),
)
