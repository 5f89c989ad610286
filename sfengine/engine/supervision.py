"""Supervision of a run's processes, the runner's watch every second: the clock and OS signals, processes that
died (respawned within --max_respawns, else the run stops naming the cause), hung ones (their stack printed, then
respawned, or the run stopped for a hung learner), and at the stop the stragglers (ended after
STOP_TIMEOUT_SEC; a worker still in its start-up after STARTING_STOP_GRACE_SEC).

``Supervision`` is a part of the ``Runner`` (sfengine.engine.runner), kept apart so that each reads as one job: it uses
the runner's processes, respawner, hang watch and stop policy (``request_stop``, ``_stop_every_rank``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal as os_signal
import time
from collections.abc import Collection

import psutil

from sfengine.engine.checkpoint import list_checkpoints
from sfengine.engine.event_loop import Component, EngineProcess, death_reason, unrespawnable
from sfengine.engine.hang_watch import HangWatch
from sfengine.engine.lifecycle import (
    STOP_TIMEOUT_SEC,
    terminate_processes,
)
from sfengine.engine.respawn import InboxLockHeld, lock_owner
from sfengine.evaluation.training_evaluator import EVALUATOR_PROCESS

log = logging.getLogger(__name__)

# A worker still in its start-up when the run stops (building LIBERO simulators can take minutes, and reads no
# signal) holds no trajectories yet: it is ended this long into the stop rather than waited for STOP_TIMEOUT_SEC.
STARTING_STOP_GRACE_SEC = 5.0
# A worker that dies before its first report (its env cannot be built, say) is respawned no sooner than this after
# its start: forked in milliseconds, it would otherwise die and be respawned hundreds of times a second.
RESPAWN_PAUSE_SEC = 1.0
# A watched worker silent this long has missed two reports: one stopped, or holding an inbox's lock, is frozen in a
# queue operation, and one that went quiet up to this long before another may have been blocked by it all the same.
HOLDER_SILENCE_SEC = 2.0


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger's stop): it runs no code until continued."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.NoSuchProcess:
        return False


def print_stack(process: EngineProcess) -> None:
    """Have a hung process print its own stack to stderr (SIGUSR1, see EngineProcess)."""
    with contextlib.suppress(ProcessLookupError):  # it died meanwhile: nothing to print
        os.kill(process.pid, os_signal.SIGUSR1)
        time.sleep(0.5)  # the stack dump is written by the hung process itself


def end_hung_worker(process: EngineProcess, processes: list[EngineProcess], hang_watch: HangWatch) -> None:
    """End a hung worker that is not respawned (training's stop, past --max_respawns; an evaluation) at once: a hung
    process reads no stop, and waiting STOP_TIMEOUT_SEC for it gains nothing."""
    ended = [process]
    if process.name.startswith("inference_worker"):
        # A process stopped or killed inside a queue operation holds that queue's lock for good (the queues'
        # mutexes are not robust), and an inference worker writes into the rollout workers' inboxes several
        # thousand times a second: a stop sent there could block the runner forever. Rollout workers have
        # nothing to save and nothing to do without actions, so they end with it; the learner saves as usual.
        ended += [p for p in processes if p.name.startswith("rollout_worker_") and p.is_alive()]
    for victim in ended:
        victim.kill()
        Component.abandoned_inboxes.append(victim.event_loop.signal_queue)
        hang_watch.forget(victim.name.removesuffix("_process"))


# The processes a run replaces when they die: the workers, and the training evaluator (its evaluation under way is
# lost; training never waits for it).
RESPAWNED = ("rollout_worker_", "inference_worker_", EVALUATOR_PROCESS.removesuffix("_process"))


def respawn_paused(process: EngineProcess, reported: Collection[str]) -> bool:
    """A worker that died before its first report (not in ``reported``), within RESPAWN_PAUSE_SEC of its start:
    respawned later."""
    component = process.name.removesuffix("_process")
    young = time.monotonic() - getattr(process, "started_at", 0.0) < RESPAWN_PAUSE_SEC
    return young and component not in reported and component.startswith(RESPAWNED)


class Supervision:
    """The watch of the runner's processes (mixed into ``Runner``)."""

    def _watch(self) -> None:
        """Conditions no component can signal: the clock, OS signals, processes that died; then the shutdown."""
        run = self.cfg.run
        if self.hang_watch is not None:
            self.hang_watch.looked()
        if self.stop_reason is None:
            if self.respawner is not None and not self.interrupts:
                self.respawner.chaos_victim(self.processes)
            # Deaths first: a stop waiting for the other ranks' agreement must still see this rank's learner die
            # (as it does when another rank's death breaks the exchange), or it would wait for good.
            dead = [p for p in self.processes if not p.is_alive() and not self._pausing(p)]
            if dead:
                self._dead(dead)
            elif run.train_for_seconds and time.time() - self.stats.started >= run.train_for_seconds:
                self._stop_every_rank(f"trained for {run.train_for_seconds:g} s")
            elif self.interrupts:
                self._stop_every_rank("interrupted by a signal")
            elif gone := self.launcher.gone():
                self._stop_every_rank(gone)
            elif self.hang_watch is not None and (hung := self._culprit()):
                self._stop_hung(hung)
            elif self.hang_watch is not None and (stuck := self._learner_stuck()):
                self._stop_hung_learner(stuck)
            elif self.hang_watch is not None and (starting := self.hang_watch.startup_hung(self.processes)):
                self._stop_hung(*starting, option="--startup_timeout_sec")
            return
        training = [p for p in self.processes if p.name != EVALUATOR_PROCESS]
        training_done = all(not p.is_alive() for p in training) if training else self.stats.final_learner_report
        if training_done:
            self._check_the_learners_end()
            if self.final_evaluation is None or self.final_evaluation.over(self):
                self.event_loop.stop()
        elif starting := self._still_starting():
            names = ", ".join(p.name.removesuffix("_process") for p in starting)
            log.warning("%s still starting as the run stops; ending it (it holds no trajectories yet)", names)
            terminate_processes(starting)
        elif self.hang_watch is not None and (hung := self._hung_while_stopping()):
            self._end_hung_while_stopping(*hung)
        elif time.time() - self.stop_started > STOP_TIMEOUT_SEC:
            self._terminate_the_stragglers()
            self.event_loop.stop()

    def _check_the_learners_end(self) -> None:
        """A learner process that ended without its final report (killed in its final save by the OOM killer, a
        crash in its stop) took the weights trained since its last checkpoint with it: the run says so and exits
        with 1. Once, and not where the runner said it already (the learner's death stopped the run, or the runner
        ended it as hung or as a straggler)."""
        learner = next((p for p in self.processes if p.name == "learner_process"), None)
        if learner is None or self.learner_end_said or self.stats.final_learner_report or not learner.exitcode:
            return
        self.learner_end_said = True
        code = learner.exitcode
        how = f"signal {os_signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        saved = list_checkpoints(self.cfg.experiment_dir)
        kept = f"the last checkpoint is {saved[-1].name}" if saved else "no checkpoint was written"
        log.error("the learner ended by %s before its final checkpoint; %s; exit code 1", how, kept)
        self.stop_reason = f"{self.stop_reason or 'stopped'}; the learner ended by {how} before its final checkpoint"
        self.exit_code = max(self.exit_code, 1)

    def _still_starting(self) -> list[EngineProcess]:
        """Rollout and inference workers alive and never heard from, STARTING_STOP_GRACE_SEC into the stop."""
        if time.time() - self.stop_started < STARTING_STOP_GRACE_SEC:
            return []
        workers = ("rollout_worker_", "inference_worker_")
        return [
            p
            for p in self.processes
            if p.name.startswith(workers) and p.is_alive() and p.name.removesuffix("_process") not in self.reported
        ]

    def _terminate_the_stragglers(self) -> None:
        """Components still running STOP_TIMEOUT_SEC into the stop are terminated. Only the learner's failing to
        stop costs anything (its final checkpoint), so only that changes the exit code: workers stuck in an env or
        a device call, once training is over, do not make a finished run a failed one."""
        # The evaluator is not one: it goes on during training's stop (FinalEvaluation), and is ended with them.
        stragglers = [p for p in self.processes if p.is_alive() and p.name != EVALUATOR_PROCESS]
        names = ", ".join(p.name.removesuffix("_process") for p in stragglers)
        learner = any(p.name == "learner_process" for p in stragglers)
        log.error(
            "components did not stop within %.0f s: %s; terminating them%s",
            STOP_TIMEOUT_SEC,
            names,
            "; the learner's final checkpoint may be missing" if learner else "",
        )
        if learner:
            self.exit_code, self.learner_end_said = 1, True
        terminate_processes(self.processes)

    def _pausing(self, process: EngineProcess) -> bool:
        return respawn_paused(process, self.reported)

    def _dead(self, dead: list[EngineProcess]) -> None:
        """Respawn dead rollout and inference workers and the training evaluator; any other death, or one past
        --max_respawns, stops the run."""
        for process in dead:
            component = process.name.removesuffix("_process")
            refusal = self._respawn_refusal(component) or unrespawnable(process)
            if refusal is None:
                lost = "; the evaluation under way is lost" if process.name == EVALUATOR_PROCESS else ""
                log.error("%s died (exit code %s); respawning it%s", component, process.exitcode, lost)
                self._respawn(process)
                continue
            learner = process.name == "learner_process"
            self.learner_end_said |= learner
            log.error(
                "a component process died: %s (exit code %s); %s; stopping the run%s",
                process.name,
                process.exitcode,
                refusal,
                f"; {self._last_checkpoint()}" if learner else "",
            )
            self.request_stop(death_reason(process), exit_code=1)
            return

    def _respawn_refusal(self, component: str) -> str | None:
        """Why ``component`` is not respawned, or None if it is."""
        if not component.startswith(RESPAWNED):
            return "only rollout and inference workers and the evaluator are respawned"
        if self.respawner is None:
            return "respawning needs worker processes"
        return self.respawner.refusal(component)

    def _respawn(self, process: EngineProcess) -> None:
        component = process.name.removesuffix("_process")
        # One quiet before its end (frozen, hung) may have blocked workers on an inbox it held, which its end frees:
        # the silences begun when its did (or after) count from now, or one could be named before its next report
        # reaches the runner. Not after the death of one that was reporting (a crash, a chaos kill): respawns one
        # after another would keep restarting a hung worker's silence.
        quiet_since = self.hang_watch.last_heard.get(component)
        if quiet_since is not None and time.monotonic() - quiet_since > HOLDER_SILENCE_SEC:
            self.hang_watch.restart_silences(begun_after=quiet_since - HOLDER_SILENCE_SEC)
        self.hang_watch.forget(component)
        self.reported.discard(component)
        try:
            positions = self.respawner.respawn(process, self.processes)
        except InboxLockHeld as error:
            log.error("%s cannot be respawned: %s; stopping the run", component, error)
            self.request_stop(f"respawn failed: {component}", exit_code=1)
            return
        if positions:
            self.episodes_dropped.emit(tuple(positions))
        if component.startswith("inference_worker_"):
            self.inference_respawned.emit(int(component.rsplit("_", 1)[1]))

    def _culprit(self, among: dict | None = None, stopping: bool = False) -> str | None:
        """The silent worker to name and respawn, of those past the timeout (and in ``among``, if given). A worker
        frozen inside a queue operation silences others: a writer frozen inside a reader's inbox keeps its lock (the
        reader waits for it), a reader frozen inside its own inbox blocks its writers, and a reader stopped while
        waiting on its inbox's condition variable leaves a writer that signals it stuck inside, holding the lock.
        So a worker whose process is stopped (SIGSTOP, a debugger) is frozen for certain: while one has been quiet
        for HOLDER_SILENCE_SEC, only stopped ones are named. Otherwise a worker whose inbox's lock another watched
        worker holds waits for that one; while a holder has been quiet for HOLDER_SILENCE_SEC only holders are named;
        and a holder comes first, then the longest silent. Respawning the frozen one frees the others; respawning
        one it silenced instead would drop that one's episodes and blame its env for nothing."""
        silent = self.hang_watch.silent(among, stopping)
        if silent and self._learner_process_stopped():
            return None  # the workers wait on it (a put into an inbox it holds): its own rule names it
        if silent and self.respawner is not None and self.respawner.enabled:
            names = {p.name.removesuffix("_process"): p for p in self.processes}
            watched = {names[name].pid: name for name in self.hang_watch.last_heard if name in names}
            holders = {watched.get(lock_owner(queue)) for queue in self.respawner.inboxes} - {None}
            holders = holders if among is None else holders & set(among)
            inbox_holder = {name: watched.get(lock_owner(p.event_loop.signal_queue)) for name, p in names.items()}
            quiet = {name for name in watched.values() if self.hang_watch.silent_for(name) > HOLDER_SILENCE_SEC}
            quiet = quiet if among is None else quiet & set(among)
            if stopped := {name for name in quiet if process_stopped(names[name].pid)}:
                return next((name for name in silent if name in stopped), None)
            silent = [name for name in silent if inbox_holder.get(name) in (None, name)]
            if quiet & holders:
                # A holder gone quiet is frozen inside a queue operation; a worker blocked on that inbox (a put to
                # it) is silent too, and may have reported last a little earlier: only holders are named now.
                silent = [name for name in silent if name in holders]
            silent.sort(key=lambda name: name not in holders)  # stable: the longest silent first within each
        return silent[0] if silent else None

    def _stop_hung(self, component: str, description: str = "", option: str = "--hang_timeout_sec") -> None:
        """Print the hung component's stack (SIGUSR1, see EngineProcess) and what it was doing, then respawn it;
        past --max_respawns, end it and stop the run: the others save a checkpoint and exit as usual."""
        process = next(p for p in self.processes if p.name == f"{component}_process")
        description = description or self.hang_watch.describe(component)
        print_stack(process)
        refusal = self._respawn_refusal(component)
        if refusal is None:
            log.error("%s (hung?); its stack is above; respawning it (%s)", description, option)
            self._respawn(process)
            return
        log.error("%s (hung?); its stack is above; %s; stopping the run (%s)", description, refusal, option)
        self._end_hung_worker(process)
        self.request_stop(f"hung: {component}", exit_code=1)

    def _end_hung_worker(self, process: EngineProcess) -> None:
        end_hung_worker(process, self.processes, self.hang_watch)

    def _learner_stuck(self) -> str | None:
        """What the learner is stuck in (``HangWatch.learner_hung``: one update or save for too long), or that its
        process has been stopped outright (SIGSTOP, a debugger) for longer than --hang_timeout_sec: stopped between
        updates, it is in none, and the rollout side only waits for buffers, so nothing else would name it."""
        if stuck := self.hang_watch.learner_hung():
            return stuck
        timeout = self.cfg.run.hang_timeout_sec
        if not timeout or not self._learner_process_stopped():
            self.learner_stopped_since = None
            return None
        now = time.monotonic()
        since = self.learner_stopped_since = getattr(self, "learner_stopped_since", None) or now
        if now - since <= timeout:
            return None
        return (
            f"learner_process has been stopped (SIGSTOP, a debugger) for {now - since:.0f} s, over --hang_timeout_sec"
        )

    def _learner_process_stopped(self) -> bool:
        """Whether the learner's process is stopped outright (SIGSTOP, a debugger)."""
        learner = next((p for p in self.processes if p.name == "learner_process"), None)
        return learner is not None and learner.is_alive() and process_stopped(learner.pid)

    def _last_checkpoint(self) -> str:
        """Where a run whose learner ended goes on from: its last checkpoint, named."""
        saved = list_checkpoints(self.cfg.experiment_dir)
        return f"the last checkpoint is {saved[-1].name}" if saved else "no checkpoint was written yet"

    def _stop_hung_learner(self, description: str) -> None:
        """Print the stuck learner's stack, end it, and stop the run with exit code 1; the checkpoint to resume
        from is the last one it wrote before it hung."""
        process = next(p for p in self.processes if p.name == "learner_process")
        stack = "it is stopped, so it printed no stack" if process_stopped(process.pid) else "its stack is above"
        print_stack(process)
        log.error("%s (hung?); %s; stopping the run; %s", description, stack, self._last_checkpoint())
        process.kill()
        self.learner_end_said = True
        Component.abandoned_inboxes.append(process.event_loop.signal_queue)
        self.request_stop("hung: learner", exit_code=1)
        self.exit_code = 1  # also when it hung in the final save, after the stop had begun

    def _hung_while_stopping(self) -> tuple[str, EngineProcess | None] | None:
        """A worker still running but silent past --hang_timeout_sec, or a learner stuck in its final update or
        save, while the run stops: (what it is stuck in, the worker's process or None for the learner)."""
        running = {p.name.removesuffix("_process"): p for p in self.processes if p.is_alive()}
        # Only a running learner not ended yet: one ended keeps its clock's open update (and may show alive for a
        # moment after its kill), and would be ended every tick.
        if "learner" in running and not self.learner_end_said and (stuck := self._learner_stuck()):
            return stuck, None
        component = self._culprit(among=running, stopping=True)
        return (self.hang_watch.describe(component), running[component]) if component else None

    def _end_hung_while_stopping(self, description: str, process: EngineProcess | None) -> None:
        """A component hung as the run stops is not waited for (STOP_TIMEOUT_SEC) nor respawned: its stack is
        printed and it is ended. A worker's end costs the run nothing, training is over, so the exit code stays;
        a learner's costs the final checkpoint, so the run exits with 1."""
        if process is None:
            self._stop_hung_learner(description)
            return
        print_stack(process)
        log.error("%s (hung?); its stack is above; ending it, as the run is stopping (--hang_timeout_sec)", description)
        self._end_hung_worker(process)
