"""sfengine: high-throughput asynchronous reinforcement learning.

Public entry points: ``python -m sfengine.train``, ``sfengine.register_env``, ``sfengine.register_model`` and
``sfengine.register_algorithm`` (with ``Algorithm`` and the ``Trainer`` base).
"""

from sfengine.algorithms import Algorithm, register_algorithm
from sfengine.env.registry import EnvContext, register_env
from sfengine.learning.trainer import Trainer
from sfengine.models.actor_critic import ActorCritic, register_model

__all__ = ["Algorithm", "ActorCritic", "EnvContext", "Trainer", "register_algorithm", "register_env", "register_model"]
__version__ = "0.1.0"
