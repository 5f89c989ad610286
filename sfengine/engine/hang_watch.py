"""Hung components: a rollout or inference worker that stops reporting, or a learner stuck inside one update or
save, is named and its stack printed; a worker is then respawned (sfengine.engine.respawn), a stuck learner ends
the run.

Every rollout and inference worker reports once a second from its event loop. One stuck inside a slot (an env
whose ``step`` never returns, a simulator deadlock, a blocked device call) stops reporting, and without a watch
the run would sit there, every other component waiting on it, forever. The runner asks ``HangWatch`` each tick:

    worker reports  --heard_from(name)-->  HangWatch  --hung()-->  runner: SIGUSR1 to the process (its stack goes
                                                                    to stderr), error line, respawn (or stop with
                                                                    exit code 1 past --max_respawns)

A rollout worker writes, in shared memory, which env it is stepping and each env's (task, init state), so the
error names the env even though the hung process can no longer say anything itself. A worker is watched for
silence from its first report, which it sends as soon as its start-up is over; its start-up (building LIBERO
simulators or a large model can take minutes) has a timeout of its own, ``--startup_timeout_sec`` or
``STARTUP_TIMEOUT_FACTOR`` times the longest start-up so far, whichever is longer (``startup_hung``): a worker
whose env never finishes building, at the run's start or after a respawn, is named and respawned like a silent
one; so is the training evaluator (``--eval_every_env_steps``), which builds envs of its own at its start. While
the run stops, a worker found hung is ended rather than respawned: training is over. One worker frozen inside a
queue operation silences others (the reader of the inbox it keeps locked, a writer blocked on it): the runner names
the frozen one, not those waiting for it (``Supervision._culprit``), and their silences count again from its
respawn, which frees them (``restart_silences``).

The learner is silent whenever no batch is ready (a slow env), so silence says nothing about it: it marks in shared
memory when its start-up and each update or save begin and end, and each gradient step
(``SharedBuffers.learner_clock``); it is hung when an update or save goes without a gradient step far longer than
its longest update so far, or its start-up lasts longer than ``--startup_timeout_sec`` (``learner_hung``). It
cannot save then: the run ends with the last checkpoint it wrote.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from torch import Tensor

from sfengine.config import Config
from sfengine.engine.buffers import NO_ENV, SplitState
from sfengine.engine.event_loop import EngineProcess

WATCHED_WORKERS = ("rollout_worker_", "inference_worker_")
# Start-ups watched (``startup_hung``): the workers', and the training evaluator's, which builds envs of its own.
WATCHED_STARTUPS = (*WATCHED_WORKERS, "evaluator_process")
LEARNER_TIMEOUT_FACTOR = 10  # a learner update or save is hung after this many times its longest so far
# While a run stops, a worker counts as hung only once silent this long (and --hang_timeout_sec).
STOPPING_SILENCE_SEC = 10.0
# A worker's start-up is hung after this many times the longest start-up so far (a respawned worker builds what the
# first ones built; a loaded machine makes it slower, not tenfold).
STARTUP_TIMEOUT_FACTOR = 3
# The runner's loop looks every 0.1 s; a longer gap means it could not (see HangWatch.looked).
RUNNER_GAP_SEC = 1.0


class HangWatch:
    def __init__(
        self,
        cfg: Config,
        splits: SplitState,
        task_names: list[str] | None = None,
        learner_clock: Tensor | None = None,
    ):
        self.timeout, self.startup_timeout = cfg.run.hang_timeout_sec, cfg.run.startup_timeout_sec
        self.splits, self.task_names, self.learner_clock = splits, task_names, learner_clock
        self.num_splits = cfg.sampler.worker_num_splits
        self.last_heard: dict[str, float] = {}
        self.up_since: dict[str, float] = {}  # worker -> its first report since its latest start: start-up over
        self.longest_startup = 0.0
        self.last_look: float | None = None

    def looked(self) -> None:
        """The runner's loop looks now. If it could not for a while (it waited on an inbox that a frozen worker held,
        or its process was not scheduled), it heard no one meanwhile: the silences are counted from the gap's end,
        so that its own wait is not blamed on the workers whose reports were queued for it."""
        now = time.monotonic()
        gap, self.last_look = now - (self.last_look or now), now
        if gap > RUNNER_GAP_SEC:
            for name in self.last_heard:
                self.last_heard[name] += gap

    def heard_from(self, component: str) -> None:
        self.last_heard[component] = time.monotonic()
        self.up_since.setdefault(component, self.last_heard[component])

    def forget(self, component: str) -> None:
        """A respawned component is watched again from its first report, as at the start."""
        self.last_heard.pop(component, None)
        self.up_since.pop(component, None)

    def silent_for(self, component: str) -> float:
        """Seconds since ``component`` last reported (0 if it has not yet)."""
        heard = self.last_heard.get(component)
        return 0.0 if heard is None else time.monotonic() - heard

    def restart_silences(self, begun_after: float) -> None:
        """The silences begun after ``begun_after`` count from now: a worker was respawned that they may have been
        waiting on. One begun earlier is the silent worker's own."""
        now = time.monotonic()
        for name, heard in self.last_heard.items():
            if heard > begun_after:
                self.last_heard[name] = now

    def startup_hung(self, processes: Sequence[EngineProcess]) -> tuple[str, str] | None:
        """A running rollout or inference worker or training evaluator of ``processes`` not yet heard from since its
        latest start, for longer than the start-up timeout (``--startup_timeout_sec`` or ``STARTUP_TIMEOUT_FACTOR``
        times the longest start-up so far, whichever is longer): (its name, what it is stuck in), or None."""
        if not self.startup_timeout:
            return None
        workers = {p.name.removesuffix("_process"): p for p in processes if p.name.startswith(WATCHED_STARTUPS)}
        for name, process in workers.items():
            if name in self.up_since:
                self.longest_startup = max(self.longest_startup, self.up_since[name] - process.started_at)
        timeout = max(self.startup_timeout, STARTUP_TIMEOUT_FACTOR * self.longest_startup)
        now = time.monotonic()
        for name, process in workers.items():
            starting = now - process.started_at
            if name not in self.up_since and starting > timeout and process.is_alive():
                return name, (
                    f"{name} is still in its start-up after {starting:.1f} s, over its timeout of {timeout:.1f} s "
                    f"(the longer of --startup_timeout_sec and {STARTUP_TIMEOUT_FACTOR}x the longest start-up so "
                    f"far, {self.longest_startup:.1f} s)"
                )
        return None

    def hung(self, among: Collection[str] | None = None, stopping: bool = False) -> str | None:
        """The watched component (of ``among``, if given) silent the longest, if longer than the timeout, or None."""
        silent = self.silent(among, stopping)
        return silent[0] if silent else None

    def silent(self, among: Collection[str] | None = None, stopping: bool = False) -> list[str]:
        """The watched components (of ``among``, if given) silent for longer than the timeout, the longest silent
        first. While the run stops the silence must also pass STOPPING_SILENCE_SEC: a worker that took the stop
        goes quiet as its process ends, which can take a second or two."""
        if not self.timeout:
            return []
        now, timeout = time.monotonic(), max(self.timeout, STOPPING_SILENCE_SEC) if stopping else self.timeout
        silent = [name for name, heard in self.last_heard.items() if now - heard > timeout]
        return sorted((name for name in silent if among is None or name in among), key=self.last_heard.__getitem__)

    def learner_hung(self) -> str | None:
        """What the learner is stuck in, if it has been inside one update or save for longer than its own timeout:
        ``--hang_timeout_sec`` or ``LEARNER_TIMEOUT_FACTOR`` times its longest so far, whichever is longer (a first
        update that compiles, or a large model's save, may take a while), or in its start-up for longer than
        ``--startup_timeout_sec``. A learner waiting for a batch is not hung: the rollout side is watched for
        that."""
        if self.learner_clock is None:
            return None
        # One read: the learner may end its update between two, and a second read of 0 would look like decades.
        started, longest, starting, last_step = (float(v) for v in self.learner_clock.tolist())
        if not started:
            return None
        busy = time.time() - started
        if starting:
            if not self.startup_timeout or busy <= self.startup_timeout:
                return None
            return (
                f"learner has been in its start-up (its model, trainer, replay, a base policy) for {busy:.0f} s, "
                f"over --startup_timeout_sec={self.startup_timeout:g}"
            )
        if not self.timeout:
            return None
        timeout = max(self.timeout, LEARNER_TIMEOUT_FACTOR * longest)
        # Counted from its latest gradient step: a long update that keeps stepping (a learner starved of CPU by
        # other work on the machine, many steps to a batch) is slow, not hung.
        quiet = time.time() - max(started, last_step)
        if quiet <= timeout:
            return None
        return (
            f"learner has been inside one update or save for {busy:.0f} s, {quiet:.0f} s of it without a gradient "
            f"step, over its timeout of {timeout:.0f} s (the longer of --hang_timeout_sec and "
            f"{LEARNER_TIMEOUT_FACTOR}x its longest update or save so far, {longest:.2f} s)"
        )

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
