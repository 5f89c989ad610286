"""sfengine: high-throughput asynchronous reinforcement learning.

Public entry points: ``python -m sfengine.train`` and ``sfengine.register_env``.
"""

from sfengine.env_registry import EnvContext, register_env

__all__ = ["EnvContext", "register_env"]
__version__ = "0.1.0"
