"""Starting, watching and ending a run's component processes; training (``sfengine.engine.runner``) and evaluation
(``sfengine.evaluation.evaluator``) share them.

A runner (any ``Component`` with ``_watch``, ``_status``, ``interrupts`` and ``processes``) starts its processes with
``run_until_stopped``, which returns once its loop has stopped and leaves no process alive, whatever happened.
"""

from __future__ import annotations

import os
import signal as os_signal

from signal_slot.signal_slot import Timer

from sfengine.engine.event_loop import Component, EngineEventLoop, EngineProcess
from sfengine.engine.fork_server import stop_fork_server
from sfengine.engine.respawn import DeadHolderWatch

STOP_TIMEOUT_SEC = 60.0


def start_watch_and_status_timers(runner: Component) -> None:
    """A runner's two clocks: ``_watch`` every 0.1 s (stop conditions, dead or hung processes) and ``_status``
    every --report_every_sec."""
    runner.watch_timer = Timer(runner.event_loop, 0.1)
    runner.watch_timer.timeout.connect(runner._watch)
    runner.status_timer = Timer(runner.event_loop, max(runner.cfg.run.report_every_sec, 0.5))
    runner.status_timer.timeout.connect(runner._status)


def terminate_processes(processes: list[EngineProcess]) -> None:
    """Kill the components still alive. They ignore SIGTERM (it is the runner's to act on, see
    ``ignore_interrupts``), so one that did not stop when asked gets SIGKILL."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(5.0)


def component_loops(
    serial: bool, runner_loop: EngineEventLoop, mp_context, processes: list[EngineProcess], seed: tuple[int, ...]
):
    """``loop_for(name)``: the event loop a component named ``name`` lives on; a process of its own (appended to
    ``processes``, its random streams seeded from ``seed`` and its name), or the runner's loop in serial mode."""

    def loop_for(name: str):
        if serial:
            return runner_loop
        process = EngineProcess(f"{name}_process", mp_context, seed)
        processes.append(process)
        return process.event_loop

    return loop_for


def run_until_stopped(runner: Component, runner_loop: EngineEventLoop, processes: list[EngineProcess]) -> None:
    """Start the component processes and run the runner's loop until it stops; every process is gone after it,
    whatever happened. SIGINT/SIGTERM go to ``runner.interrupts`` meanwhile (see install_signal_handlers), and a
    DeadHolderWatch frees the runner's respawner's inboxes a dead process left locked, and ends a process frozen
    inside one for twice --hang_timeout_sec, until the end."""
    previous_handlers = install_signal_handlers(runner)
    respawner = getattr(runner, "respawner", None)
    frozen_after = 2 * runner.cfg.run.hang_timeout_sec
    watch = None if respawner is None else DeadHolderWatch(respawner.inboxes, processes, frozen_after)
    try:
        try:
            for process in processes:
                process.start()
            runner_loop.exec()
        except BaseException:
            terminate_processes(processes)
            raise
        finally:
            for signum, handler in previous_handlers.items():
                os_signal.signal(signum, handler)
        for process in processes:
            process.join(STOP_TIMEOUT_SEC)
        terminate_processes(processes)
    finally:
        if watch is not None:
            watch.stop()
    stop_fork_server()


def install_signal_handlers(runner: Component) -> dict:
    """First SIGINT/SIGTERM: stop cleanly (checkpoint, join, summary). Second: kill the children and exit now."""

    def handler(signum, _frame):
        runner.interrupts += 1
        if runner.interrupts == 1:
            print(f"\n{os_signal.Signals(signum).name}: saving a checkpoint and stopping (again to force)", flush=True)
            return
        print("forced exit: killing every component", flush=True)
        for p in runner.processes:
            if p.is_alive():
                p.kill()
        forced_summary = getattr(runner, "forced_summary", None)
        if forced_summary is not None:
            try:
                forced_summary(f"forced by a second {os_signal.Signals(signum).name}", 130)
            except Exception:  # noqa: BLE001 - the exit is forced: nothing may hold it
                pass
        os._exit(130)

    previous = {}
    for signum in (os_signal.SIGINT, os_signal.SIGTERM):
        previous[signum] = os_signal.signal(signum, handler)
    return previous


class StopSignals:
    """For the one-process commands (``sfengine.demos``, ``sfengine.pretrain``): within ``with``, a SIGINT or
    SIGTERM only sets a flag, which the command checks where stopping is safe (between jobs, after an optimiser
    step) and acts on with ``raise_if_requested``. Outside, the previous handlers are back.

    A flag, not an exception raised from the handler: that exception would surface wherever the main thread
    happens to be, and inside a weakref callback or a destructor Python prints it and carries on.

    >>> with StopSignals() as stop:
    ...     for batch in batches:
    ...         step(batch)
    ...         stop.raise_if_requested()  # Interrupted, naming the signal
    """

    class Interrupted(Exception):
        """A SIGINT or SIGTERM asked the command to stop."""

    def __init__(self):
        self.signal_name: str | None = None  # the first signal received
        self.previous: dict = {}

    def __enter__(self) -> StopSignals:
        for signum in (os_signal.SIGINT, os_signal.SIGTERM):
            self.previous[signum] = os_signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            os_signal.signal(signum, handler)

    def _handler(self, signum, _frame) -> None:
        self.signal_name = self.signal_name or os_signal.Signals(signum).name

    def raise_if_requested(self) -> None:
        if self.signal_name is not None:
            raise StopSignals.Interrupted(self.signal_name)
