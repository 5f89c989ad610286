"""TD3 (``--algo=td3``): twin delayed deep deterministic policy gradient from a replay, on the same base as SAC
(``sfengine.algorithms.offpolicy``): a deterministic squashed actor acting with Gaussian exploration noise
(``actor.DeterministicActor``), target policy smoothing, the actor and its target updated every second critic step
(``trainer.TD3Trainer``). Options: the ``offpolicy`` group of ``--help``, shared with SAC."""

from __future__ import annotations

from sfengine.algorithms import register_algorithm
from sfengine.algorithms.offpolicy import off_policy_algorithm

# The TD3 paper's policy delay: the actor and its target move every second critic step.
register_algorithm(
    "td3",
    off_policy_algorithm(
        trainer="sfengine.algorithms.td3.trainer:TD3Trainer",
        actor="sfengine.algorithms.td3.actor:DeterministicActor",
        residual="sfengine.algorithms.td3.actor:ResidualTD3",
        title="TD3",
        own_defaults={"actor_delay": 2},
    ),
)
