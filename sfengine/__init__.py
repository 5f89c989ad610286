"""sfengine: high-throughput asynchronous reinforcement learning.

Public entry points: ``python -m sfengine.train``, ``sfengine.register_env``, ``sfengine.register_model`` and
``sfengine.register_algorithm`` (with ``Algorithm`` and the ``Trainer`` base).

The names below are imported when first used, not with the package: ``python -m sfengine.train`` reads its options
before torch is imported (``sfengine.config.check_command_line``), and importing them means torch.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Algorithm": "sfengine.algorithms",
    "register_algorithm": "sfengine.algorithms",
    "EnvContext": "sfengine.env.registry",
    "register_env": "sfengine.env.registry",
    "Trainer": "sfengine.learning.trainer",
    "ActorCritic": "sfengine.models.actor_critic",
    "register_model": "sfengine.models.actor_critic",
}

__all__ = ["Algorithm", "ActorCritic", "EnvContext", "Trainer", "register_algorithm", "register_env", "register_model"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'sfengine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
