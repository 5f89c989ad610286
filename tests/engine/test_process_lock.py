"""The cross-process lock: it excludes, it survives a holder's SIGKILL, and it leaves nothing in /dev/shm."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import torch

from helpers import leaked_shm
from sfengine.engine.process_lock import ProcessLock

SPAWN = multiprocessing.get_context("spawn")


def add_many(lock: ProcessLock, counter: torch.Tensor, times: int, start) -> None:
    start.wait(60)  # all at once: spawned processes start a second apart, longer than the loop takes
    for _ in range(times):
        with lock:
            value = int(counter[0])  # read, then write: without exclusion, concurrent increments get lost
            counter[0] = value + 1


def hold_forever(lock: ProcessLock, ready) -> None:
    lock.acquire()
    ready.send(True)
    time.sleep(600)


@pytest.mark.slow
def test_increments_from_three_processes_are_never_lost():
    lock, counter = ProcessLock(), torch.zeros(1, dtype=torch.int64).share_memory_()
    start = SPAWN.Barrier(4)
    processes = [SPAWN.Process(target=add_many, args=(lock, counter, 20_000, start)) for _ in range(3)]
    for process in processes:
        process.start()
    add_many(lock, counter, 20_000, start)
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    assert int(counter[0]) == 4 * 20_000


def test_a_holder_killed_by_sigkill_releases_the_lock_and_leaves_no_shm_entry():
    shm_before = set(os.listdir("/dev/shm"))
    lock = ProcessLock()
    ready_in, ready_out = SPAWN.Pipe(duplex=False)  # a pipe, not an Event: an Event is made of semaphores
    holder = SPAWN.Process(target=hold_forever, args=(lock, ready_out))
    holder.start()
    assert ready_in.poll(60) and ready_in.recv()
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    started = time.monotonic()
    with lock:  # a multiprocessing.Lock would stay held by the dead process forever
        pass
    assert time.monotonic() - started < 5
    with open("/proc/self/maps") as f:  # a named semaphore would be mapped by this process, which holds the lock
        mapped_here = {line.split()[-1].removeprefix("/dev/shm/") for line in f if "/dev/shm/sem." in line}
    assert not mapped_here - shm_before
    assert leaked_shm(shm_before) == set()  # nor left behind by the killed holder
