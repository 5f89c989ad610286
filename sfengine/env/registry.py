"""Where env names come from: sfengine's registry first, then any gymnasium id.

A user adds an env from their own script with ``register_env``:

    import gymnasium as gym
    from sfengine import register_env

    def make_my_env(ctx):  # ctx: EnvContext (worker, env index, seed)
        return gym.make("MountainCar-v0")

    register_env("my_mountain_car", make_my_env)

An env with settings of its own declares them as a dataclass of ``sfengine.config.option`` fields and registers
it with the factory; they are then flat on the command line, grouped under the env in ``--help``, validated,
saved in config.json, and handed to the factory as ``ctx.options``:

    @dataclass
    class MyEnvOptions:
        group: ClassVar[str] = "my_env"  # its heading in --help and its key in config.json
        my_env_goal_radius: float = option(0.05, "my env: success radius in metres")

        def validate(self, auto: set[str]) -> None:  # optional; raise ConfigError with a one-line fix
            ...

    register_env("my_env", make_my_env, options=MyEnvOptions)  # --my_env_goal_radius=0.1

Factories must be module-level functions: rollout workers are spawned processes and receive the factory by
pickling, which a lambda or a locally defined function cannot survive.
"""

from __future__ import annotations

import difflib
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from sfengine.config import Config, ConfigError, EnvConfig, declare_env_options, load_builtin_envs
from sfengine.engine.sizing import Sizer


@dataclass(frozen=True)
class EnvContext:
    """What a factory knows about the env it builds."""

    name: str
    worker_index: int
    env_index: int  # index of this env within its rollout worker
    seed: int
    max_episode_steps: int = 0  # 0: the env's own limit
    env_config: EnvConfig | None = None  # the engine's env options (seed, task sampling, ...)
    render_size: int = 0  # > 0: evaluation records videos, so ``render()`` must return rgb frames (about this size)
    options: Any = None  # the options the env declared with register_env(..., options=), None if it declared none


def env_context(cfg: Config, worker_index: int, env_index: int, seed: int, render_size: int = 0) -> EnvContext:
    """The context of one env of this run."""
    return EnvContext(
        cfg.env.env,
        worker_index,
        env_index,
        seed,
        cfg.env.max_episode_steps,
        cfg.env,
        render_size,
        cfg.own_env_options,
    )


EnvFactory = Callable[[EnvContext], gym.Env]

_REGISTRY: dict[str, EnvFactory] = {}
_SIZERS: dict[str, Sizer] = {}
_DEMONSTRATORS: dict[str, Callable[[], Any]] = {}


def register_env(
    name: str,
    factory: EnvFactory,
    sizer: Sizer | None = None,
    options: type | None = None,
    demonstrator: Callable[[], Any] | None = None,
) -> None:
    """Make ``--env=<name>`` build envs with ``factory(ctx: EnvContext) -> gymnasium.Env``. ``sizer`` (see
    ``sfengine.engine.sizing``) chooses the options set to ``auto`` for this env from what its envs cost. ``options``:
    the dataclass of the env's own options (see the module docstring); the factory gets them as ``ctx.options``.
    ``demonstrator``: a module-level callable returning a scripted expert for ``python -m sfengine.demos``, an
    object with ``reset(env)`` after each env reset and ``act(env) -> action``, reading the (unwrapped) env's
    privileged state; ``reset`` raises ValueError for a task it cannot solve."""
    if not callable(factory):
        raise TypeError(f"register_env({name!r}, ...): factory must be callable")
    if options is not None:
        declare_env_options(name, options)
    _REGISTRY[name] = factory
    if sizer is not None:
        _SIZERS[name] = sizer
    if demonstrator is not None:
        _DEMONSTRATORS[name] = demonstrator


def env_sizer(name: str) -> Sizer | None:
    """The sizer registered with env ``name``, if any."""
    load_builtin_envs()
    return _SIZERS.get(name)


def env_demonstrator(name: str) -> Callable[[], Any] | None:
    """The demonstrator factory registered with env ``name``, if any."""
    load_builtin_envs()
    return _DEMONSTRATORS.get(name)


def make_gymnasium_env(ctx: EnvContext) -> gym.Env:
    """Build a gymnasium env by id, without the passive checker (it costs time on every step)."""
    kwargs = {"max_episode_steps": ctx.max_episode_steps} if ctx.max_episode_steps > 0 else {}
    if ctx.render_size:
        kwargs["render_mode"] = "rgb_array"
    return gym.make(ctx.name, disable_env_checker=True, **kwargs)


def resolve_env_factory(name: str) -> EnvFactory:
    """Return the factory for ``name`` or raise ConfigError listing the known envs."""
    load_builtin_envs()
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
