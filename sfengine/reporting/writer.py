"""TensorBoard scalars that can never block the caller: the runner's loop (status line, stop conditions) and a
command's training loop (sfengine.pretrain) hand each scalar to a bounded queue and go on.

    add_scalar --put_nowait--> queue --a thread of its own--> tensorboardX's SummaryWriter --> its thread --> disk

tensorboardX writes from a thread of its own; when that thread dies (a full disk: "No space left on device"),
every later write waits forever on its full queue, and so does ``close()``. Here only this writer's thread can be
caught there: once the write path fails (tensorboardX's thread dead, an exception, or this queue full), later
scalars are dropped and counted, the reason is logged once, and ``close()`` gives up at once (after
``CLOSE_TIMEOUT_SEC`` where the failure comes in the close itself).
The run goes on; ``failure`` and ``dropped`` say what was lost (status line and summary.json).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from tensorboardX import SummaryWriter
from tensorboardX.proto.event_pb2 import Event

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_SEC = 10.0
_STOP = object()


def report_thread_deaths_in_one_line() -> None:
    """tensorboardX's writer thread dies by an exception (a full disk): log it in one line, not a traceback; the
    writer then says what it means for the run. Other threads' deaths keep the usual report."""
    previous = threading.excepthook
    if getattr(previous, "sfengine", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__module__.startswith("tensorboardX"):
            log.error("TensorBoard's writer thread died: %s: %s", args.exc_type.__name__, args.exc_value)
        else:
            previous(args)

    hook.sfengine = True
    threading.excepthook = hook


class TensorBoardWriter:
    def __init__(self, logdir: str, flush_secs: int = 10, queue_size: int = 100_000):
        self.logdir = logdir
        self.writer = SummaryWriter(logdir, flush_secs=flush_secs)
        # tensorboardX's event queue starts a feeder thread at its first event. Given one here, in the start-up, no
        # thread starts once the run is under way: a SIGUSR1 stack dump (faulthandler, every thread) that met one
        # starting crashed the process. The event is the file's version record, which every event file begins with.
        self.writer.file_writer.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.queue: queue.Queue = queue.Queue(queue_size)
        self.dropped = 0
        self.failure: str | None = None
        self.thread = threading.Thread(target=self._drain, name="tensorboard_writer", daemon=True)
        self.thread.start()
        report_thread_deaths_in_one_line()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.failure is None and not self._tensorboard_thread_alive():
            self._fail("its writer thread died (the line above says why)")
        if self.failure is not None:
            self.dropped += 1
            return
        try:
            self.queue.put_nowait((tag, value, step))
        except queue.Full:
            self.dropped += 1
            self._fail(f"{self.queue.maxsize} scalars wait unwritten (a disk that stalls?)")

    def close(self, timeout: float = CLOSE_TIMEOUT_SEC) -> None:
        """Write what waits and close the file, within ``timeout`` seconds; after that, give up (logged). Where the
        write path has failed already, nothing more would be written: give up at once (this writer's thread may be
        stuck in tensorboardX's full queue, and the stop would wait the whole timeout for it)."""
        if self.failure is not None:
            self._abandon()
            return
        try:
            self.queue.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread is stuck; the join below gives up
        self.thread.join(timeout)
        if self.thread.is_alive():
            self._fail(f"it did not close within {timeout:.0f} s")
            self._abandon()

    def _drain(self) -> None:
        while (item := self.queue.get()) is not _STOP:
            if self.failure is not None:
                self.dropped += 1
                continue
            try:
                self.writer.add_scalar(*item)
            except Exception as exc:  # noqa: BLE001 - any failure of the disk or the library: stop writing, say why
                self.dropped += 1
                self._fail(f"{type(exc).__name__}: {exc}")
        if self.failure is None:
            try:
                self.writer.close()
            except Exception as exc:  # noqa: BLE001
                self._fail(f"closing failed: {type(exc).__name__}: {exc}")
        else:
            self._abandon()

    def _event_writer(self):
        file_writer = getattr(self.writer, "file_writer", None)
        return getattr(file_writer, "event_writer", None)

    def _tensorboard_thread_alive(self) -> bool:
        worker = getattr(self._event_writer(), "_worker", None)
        return worker is None or worker.is_alive()

    def _abandon(self) -> None:
        """Let the process exit without waiting on tensorboardX's queue, which nothing will empty, and without its
        exit-time close, which would flush to the failed disk again."""
        event_writer = self._event_writer()
        events = getattr(event_writer, "_event_queue", None)
        if events is not None and hasattr(events, "cancel_join_thread"):
            events.cancel_join_thread()
        if event_writer is not None and hasattr(event_writer, "_closed"):
            event_writer._closed = True

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.error("TensorBoard in %s: writes stopped, %s; the run goes on without them", self.logdir, reason)
