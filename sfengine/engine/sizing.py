"""The worker layout chosen from the machine: options given as ``auto`` are resolved here, once, at start.

An env may register a sizer with ``register_env(name, factory, sizer=...)``: it knows what its envs cost (the
LIBERO suites size workers, envs and simulator caches by memory). Other envs get one rollout worker per core
the run may use, with 8 envs each. The chosen values and the reason are printed, and config.json records them,
so a resumed run keeps them. ``sfengine.evaluate`` sizes its own layout (``evaluation=True``): it runs no
learner, and its episode queue keeps each env on one task at a time, so an env needs fewer simulators.

    cfg = parse_config(["--env=libero_spatial"])  # its preset says num_workers: auto, ...
    print(resolve_auto_options(cfg, sizer, tasks))  # "auto: num_workers=2, ... (2 cores, ...)"
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from sfengine.config import AUTO, Config, auto_options, option_table, validate
from sfengine.env.multitask import TaskInfo

DEFAULT_ENVS_PER_WORKER = 8
# The options that shape sampling. An algorithm's own layout (``Algorithm.layout``: SAC's on a cheap env) applies
# only where none of them is given by the env's preset, a saved run, --cfg or the command line.
SAMPLER_LAYOUT = ("num_workers", "num_envs_per_worker", "worker_num_splits", "async_rl", "rollout")


@dataclass(frozen=True)
class Machine:
    cores: int  # cores this process may run on
    available_gb: float  # memory available to new processes

    @classmethod
    def here(cls, ranks_on_machine: int = 1) -> Machine:
        """This machine's share for one rank: ranks started together on a machine split it evenly."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        available_gb = psutil.virtual_memory().available / 2**30
        return cls(max(cores // ranks_on_machine, 1), available_gb / ranks_on_machine)


# sizer(cfg, machine, tasks, evaluation) sets the options of cfg still at AUTO and returns the reason for the
# choice, in a few words. evaluation: the layout is for sfengine.evaluate, whose envs keep to one task at a time.
Sizer = Callable[[Config, Machine, TaskInfo | None, bool], str]


def size_by_cores(cfg: Config, machine: Machine, tasks: TaskInfo | None, evaluation: bool = False) -> str:
    """For envs that declare no cost: one rollout worker per core, 8 envs each (split evenly)."""
    s = cfg.sampler
    if s.num_workers == AUTO:
        s.num_workers = machine.cores
    if s.num_envs_per_worker == AUTO:
        s.num_envs_per_worker = max(DEFAULT_ENVS_PER_WORKER // s.worker_num_splits, 1) * s.worker_num_splits
    return f"{machine.cores} cores; one rollout worker per core"


def resolve_auto_options(
    cfg: Config, sizer: Sizer | None, tasks: TaskInfo | None, machine: Machine | None = None, evaluation: bool = False
) -> str | None:
    """Choose every ``auto`` option of cfg in place, validate the result, and return a line saying what was
    chosen and why (None when nothing was ``auto``)."""
    chosen = auto_options(cfg)
    if not chosen:
        return None
    reason = (sizer or size_by_cores)(cfg, machine or Machine.here(), tasks, evaluation)
    for name in auto_options(cfg):  # options the sizer has no opinion on keep their defaults
        cfg.set(name, option_table()[name].default)
    validate(cfg)
    values = ", ".join(f"{name}={cfg.get(name)}" for name in chosen)
    return f"auto: {values} ({reason})"


def env_step_seconds(env, reset_options: dict | None, budget_sec: float = 0.05, max_steps: int = 64) -> float:
    """The median time of one random step of ``env`` (reset already), over up to ``max_steps`` steps within about
    ``budget_sec``; an episode that ends is reset with ``reset_options``."""
    times = []
    started = time.perf_counter()
    while len(times) < max_steps and (not times or time.perf_counter() - started < budget_sec):
        action = env.action_space.sample()
        before = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        times.append(time.perf_counter() - before)
        if terminated or truncated:
            env.reset(options=reset_options)
    return statistics.median(times)
