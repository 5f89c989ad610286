"""One reset and one step of a freshly built env, checked against gymnasium's API and the env's own spaces, in the
main process before any other starts: an env that breaks the API is one line and exit 2, not thousands of env
failures in the workers (a ``step`` that returns 4 values), a respawn loop (an observation that does not fit its
space) or a dead process named without the cause (a ``reset`` that raises).

    reset(seed, options)  -> (obs, info)                                     obs fits observation_space, info a dict
    step(a sample of the action space) -> (obs, reward, terminated, truncated, info)   reward a number, flags bools
"""

from __future__ import annotations

import contextlib
import faulthandler
import numbers
import signal
import sys
import threading
import traceback
from collections.abc import Iterator

import numpy as np

from sfengine.env.spaces import DEFAULT_OBS_KEY, ObsSpec, obs_as_dict


class EnvAPIError(ValueError):
    """The env broke gymnasium's API or its own spaces; the message is one line that names the fix."""


class EnvHang(BaseException):
    """The env did not return from a call within the time limit (``time_limit``): a BaseException, so that an env's
    own ``except Exception`` does not swallow it."""


HARD_LIMIT_GRACE_SEC = 60  # past the limit, a hang in native code that never returns to Python ends the process


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise EnvHang where the block is if it lasts over ``seconds`` (0: no limit), after printing the stack it was
    in: an env that hangs in the start's check (``probe_env``) or in its close at the stop (``EnvGroup.close``) is
    named with its stack instead of holding the command, or the stop, for good. A hang in native code that never
    returns to Python ends the process HARD_LIMIT_GRACE_SEC later with every thread's stack (faulthandler, exit code
    1). Only in the main thread (SIGALRM); elsewhere, no limit."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        traceback.print_stack(frame, file=sys.stderr)
        raise EnvHang

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    with contextlib.suppress(AttributeError, ValueError, OSError):  # (a standard error without a file: no dump)
        faulthandler.dump_traceback_later(seconds + HARD_LIMIT_GRACE_SEC, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def check_env_api(env, obs_spec: ObsSpec, seed: int, options: dict | None) -> None:
    """Reset ``env`` and play one random action; raise EnvAPIError at the first thing that does not fit."""
    try:
        result = env.reset(seed=seed, options=options)
    except Exception as exc:  # noqa: BLE001 - whatever the env raises, the run cannot start
        raise EnvAPIError(f"reset() raised {first_line(exc)}") from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvAPIError(
            f"reset() returned {describe(result)}; gymnasium's API returns (obs, info): return obs, {{}} from it"
        )
    check_obs(result[0], obs_spec, "reset()")
    check_info(result[1], "reset()")
    try:
        result = env.step(env.action_space.sample())
    except Exception as exc:  # noqa: BLE001
        raise EnvAPIError(f"step() raised {first_line(exc)} on an action sampled from its action_space") from None
    if not (isinstance(result, tuple) and len(result) == 5):
        count = f"{len(result)} values" if isinstance(result, tuple) else describe(result)
        raise EnvAPIError(
            f"step() returned {count}; gymnasium's API returns 5: (obs, reward, terminated, truncated, info) (the "
            "old gym API's done is terminated or truncated: a time limit is a truncation)"
        )
    obs, reward, terminated, truncated, info = result
    check_obs(obs, obs_spec, "step()")
    check_info(info, "step()")
    if not isinstance(np.asarray(reward).item() if np.ndim(reward) == 0 else None, numbers.Real):
        raise EnvAPIError(f"step() returned the reward {describe(reward)}; give one number a step")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool | np.bool_):
            raise EnvAPIError(f"step() returned {name}={describe(flag)}; give a bool")


def check_info(info, where: str) -> None:
    """The engine reads ``success`` (and a time limit's details) from the info: it must be a dict."""
    if not isinstance(info, dict):
        raise EnvAPIError(f"{where} returned the info {describe(info)}; gymnasium's API gives a dict: return {{}}")


def check_obs(obs, obs_spec: ObsSpec, where: str) -> None:
    observed = obs_as_dict(obs)
    if set(observed) != set(obs_spec.shapes):
        raise EnvAPIError(
            f"{where} returned an observation with keys {sorted(observed)}; its observation_space has "
            f"{sorted(obs_spec.shapes)}: make them agree"
        )
    for key, expected in obs_spec.shapes.items():
        shape = tuple(np.shape(observed[key]))
        if shape != tuple(expected):
            named = f" '{key}'" if key != DEFAULT_OBS_KEY else ""
            raise EnvAPIError(
                f"{where} returned an observation{named} of shape {shape}; its observation_space says "
                f"{tuple(expected)}: make them agree"
            )


def describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
