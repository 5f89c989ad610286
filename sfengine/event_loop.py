"""signal-slot-mp event loops with one addition: hooks that run after each batch of received signals.

The inference worker needs this to batch: its slot only records a request, and the hook runs one forward
pass over every request that arrived in the same batch of signals. Without it, each request would get its own
forward pass, or the loop would have to poll.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

from signal_slot.signal_slot import EventLoop, EventLoopObject, EventLoopProcess


class EngineEventLoop(EventLoop):
    def __init__(self, unique_loop_name: str, serial_mode: bool = False):
        super().__init__(unique_loop_name, serial_mode)
        self.after_signals: list[Callable[[], None]] = []

    def _loop_iteration(self) -> bool:
        keep_running = super()._loop_iteration()
        for hook in self.after_signals:
            hook()
        return keep_running


class EngineProcess(EventLoopProcess):
    """An EventLoopProcess whose loop is an EngineEventLoop. Children never own the terminal: the runner
    coordinates shutdown, so a Ctrl-C must reach only the runner (see ``ignore_interrupts``)."""

    def __init__(self, name: str, mp_context: multiprocessing.context.BaseContext):
        self._process = mp_context.Process(target=self._target, name=name, daemon=False)
        self._init_func = None
        self._args, self._kwargs = (), {}
        self.event_loop = EngineEventLoop(f"{name}_evt_loop")
        EventLoopObject.__init__(self, self.event_loop, name)

    def _target(self):
        ignore_interrupts()
        super()._target()


def ignore_interrupts() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_own_loop(component: EventLoopObject) -> None:
    """Stop the component's loop if it runs in a process of its own. In serial mode every component shares the
    runner's loop, and only the runner may stop it (after the learner's final report)."""
    if component.event_loop.process is not None:
        component.event_loop.stop()
