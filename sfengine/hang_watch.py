"""Hung workers: a rollout or inference worker that stops reporting is named, its stack printed, and the run ends.

Every rollout and inference worker reports once a second from its event loop. One stuck inside a slot (an env
whose ``step`` never returns, a simulator deadlock, a blocked device call) stops reporting, and without a watch
the run would sit there, every other component waiting on it, forever. The runner asks ``HangWatch`` each tick:

    worker reports  --heard_from(name)-->  HangWatch  --hung()-->  runner: SIGUSR1 to the process (its stack goes
                                                                    to stderr), error line, stop with exit code 1

A rollout worker writes, in shared memory, which env it is stepping and each env's (task, init state), so the
error names the env even though the hung process can no longer say anything itself. Start-up is not watched
(building LIBERO simulators can take minutes): a worker is watched from its first report, which it sends as
soon as its start-up is over.
"""

from __future__ import annotations

import time

from sfengine.buffers import NO_ENV, SplitState
from sfengine.config import Config


class HangWatch:
    def __init__(self, cfg: Config, splits: SplitState, task_names: list[str] | None = None):
        self.timeout = cfg.run.hang_timeout_sec
        self.splits, self.task_names = splits, task_names
        self.num_splits = cfg.sampler.worker_num_splits
        self.last_heard: dict[str, float] = {}

    def heard_from(self, component: str) -> None:
        self.last_heard[component] = time.monotonic()

    def hung(self) -> str | None:
        """The first watched component silent for longer than the timeout, or None."""
        if not self.timeout:
            return None
        now = time.monotonic()
        return next((name for name, heard in self.last_heard.items() if now - heard > self.timeout), None)

    def describe(self, component: str) -> str:
        """What the component was doing, as far as shared memory tells: for a rollout worker, the env it is in."""
        silent = f"{component} sent no report for {time.monotonic() - self.last_heard[component]:.0f} s"
        if not component.startswith("rollout_worker_"):
            return silent
        worker = int(component.rsplit("_", 1)[1])
        for split in range(self.num_splits):
            row = worker * self.num_splits + split
            env = int(self.splits.stepping_env[row])
            if env == NO_ENV:
                continue
            envs_per_split = self.splits.assignments.shape[1]
            where = f"env {split * envs_per_split + env} (split {split})"  # its index in its worker, as in EnvContext
            task, init_state = (int(v) for v in self.splits.assignments[row, env])
            if task >= 0:
                name = f" '{self.task_names[task]}'" if self.task_names else ""
                where += f", task {task}{name}, init state {init_state}"
            return f"{silent}; stuck in {where}"
        return f"{silent}; not inside an env step or reset"
