"""A cross-process mutex that leaves nothing behind, whatever kills the processes that share it.

``multiprocessing.Lock`` under the spawn start method is a named POSIX semaphore (``/dev/shm/sem.mp-*``). Only
the resource tracker unlinks it, so a process tree killed as a whole (SIGKILL from torchrun, a job scheduler or
a benchmark timeout) leaves it in ``/dev/shm`` for good; and a process that dies holding it blocks every other
process forever.

``ProcessLock`` is a POSIX record lock (``fcntl.lockf``) on an anonymous in-memory file (``memfd_create``):

    runner:   memfd (no name anywhere) --fd passed to each child at spawn--> rollout workers, learner, ...
    acquire:  threading.Lock (threads of this process), then lockf(LOCK_EX) (the other processes)

The kernel drops a process's record locks when it exits, however it exits, and frees the file with its last
descriptor. A record lock belongs to the process, so a thread lock orders the threads within one process.

One caveat of record locks: closing *any* descriptor of the file releases the process's lock, so a process
holds one ``ProcessLock`` object per lock (pickling one into a child does exactly that).
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from multiprocessing import reduction


class ProcessLock:
    """``with lock:`` excludes every other thread and process holding a copy of this lock.

    >>> lock = ProcessLock()
    >>> with lock:
    ...     pass
    """

    def __init__(self, fd: int | None = None):
        self._fd = os.memfd_create("sfengine-lock", os.MFD_CLOEXEC) if fd is None else fd
        self._threads = threading.Lock()
        weakref.finalize(self, os.close, self._fd)

    def acquire(self) -> None:
        self._threads.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def release(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def __enter__(self) -> ProcessLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self):
        # At a spawn, DupFd hands the child a duplicate of the descriptor; elsewhere it goes over a Unix socket.
        return _rebuild, (reduction.DupFd(self._fd),)


def _rebuild(duplicate) -> ProcessLock:
    return ProcessLock(duplicate.detach())
