"""Where env names come from: sfengine's registry first, then any gymnasium id.

A user adds an env from their own script with ``register_env``:

    import gymnasium as gym
    from sfengine import register_env

    def make_my_env(ctx):  # ctx: EnvContext (worker, env index, seed)
        return gym.make("MountainCar-v0")

    register_env("my_mountain_car", make_my_env)

Factories must be module-level functions: rollout workers are spawned processes and receive the factory by
pickling, which a lambda or a locally defined function cannot survive.
"""

from __future__ import annotations

import difflib
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

from sfengine.config import ConfigError, EnvConfig
from sfengine.sizing import Sizer


@dataclass(frozen=True)
class EnvContext:
    """What a factory knows about the env it builds."""

    name: str
    worker_index: int
    env_index: int  # index of this env within its rollout worker
    seed: int
    max_episode_steps: int = 0  # 0: the env's own limit
    env_config: EnvConfig | None = None  # every --env option, for factories that take settings
    render_size: int = 0  # > 0: evaluation records videos, so ``render()`` must return rgb frames (about this size)


EnvFactory = Callable[[EnvContext], gym.Env]

_REGISTRY: dict[str, EnvFactory] = {}
_SIZERS: dict[str, Sizer] = {}


def register_env(name: str, factory: EnvFactory, sizer: Sizer | None = None) -> None:
    """Make ``--env=<name>`` build envs with ``factory(ctx: EnvContext) -> gymnasium.Env``. ``sizer`` (see
    ``sfengine.sizing``) chooses the options set to ``auto`` for this env from what its envs cost."""
    if not callable(factory):
        raise TypeError(f"register_env({name!r}, ...): factory must be callable")
    _REGISTRY[name] = factory
    if sizer is not None:
        _SIZERS[name] = sizer


def env_sizer(name: str) -> Sizer | None:
    """The sizer registered with env ``name``, if any."""
    _load_builtin_envs()
    return _SIZERS.get(name)


def make_gymnasium_env(ctx: EnvContext) -> gym.Env:
    """Build a gymnasium env by id, without the passive checker (it costs time on every step)."""
    kwargs = {"max_episode_steps": ctx.max_episode_steps} if ctx.max_episode_steps > 0 else {}
    if ctx.render_size:
        kwargs["render_mode"] = "rgb_array"
    return gym.make(ctx.name, disable_env_checker=True, **kwargs)


def _load_builtin_envs() -> None:
    import sfengine_envs  # noqa: F401  (registers the built-in envs)


def resolve_env_factory(name: str) -> EnvFactory:
    """Return the factory for ``name`` or raise ConfigError listing the known envs."""
    _load_builtin_envs()
    if name in _REGISTRY:
        factory = _REGISTRY[name]
    elif name in gym.registry:
        factory = make_gymnasium_env
    else:
        known = sorted(_REGISTRY) + sorted(k for k in gym.registry if "/" not in k)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(
            f"unknown env '{name}': {hint}known envs are {', '.join(known[:25])}, ... (any gymnasium id, or "
            "one added with sfengine.register_env)"
        )
    try:
        pickle.dumps(factory)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f"the factory for env '{name}' cannot be sent to spawned rollout workers ({exc}); define it as a "
            "module-level function, not a lambda or a nested function"
        ) from None
    return factory
