"""sfengine: high-throughput asynchronous reinforcement learning.

Public entry points: ``python -m sfengine.train``, ``sfengine.register_env`` and ``sfengine.register_model``.
"""

from sfengine.env_registry import EnvContext, register_env
from sfengine.models.actor_critic import ActorCritic, register_model

__all__ = ["ActorCritic", "EnvContext", "register_env", "register_model"]
__version__ = "0.1.0"
