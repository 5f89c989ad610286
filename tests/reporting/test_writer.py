"""The runner's TensorBoard writer: every thread it needs runs from its start, and its scalars reach the file."""

from __future__ import annotations

import threading
import time

from sfengine.reporting.events import read_scalars
from sfengine.reporting.writer import TensorBoardWriter


def test_the_writer_starts_every_thread_it_needs_before_the_first_scalar(tmp_path):
    # A thread that starts once a run is under way can meet a SIGUSR1 stack dump (faulthandler, every thread),
    # which crashed the process; tensorboardX's event queue started its feeder thread at the first scalar.
    writer = TensorBoardWriter(str(tmp_path / "tensorboard"))
    started = set(threading.enumerate())
    try:
        for step in range(3):
            writer.add_scalar("train/loss", float(step), step)
        deadline = time.time() + 10
        while not writer.queue.empty() and time.time() < deadline:  # the first ones are written by now
            time.sleep(0.01)
        assert set(threading.enumerate()) <= started
    finally:
        writer.close()
    assert [point.value for point in read_scalars(tmp_path)["train/loss"]] == [0.0, 1.0, 2.0]


def test_a_writer_whose_disk_failed_closes_at_once(tmp_path):
    # On a full disk tensorboardX's thread dies and its queue fills: this writer's thread blocks in its add_scalar
    # for good, and close() waited its whole timeout (10 s) at every stop. The blocked write is made here by hand.
    writer = TensorBoardWriter(str(tmp_path / "tensorboard"))
    release = threading.Event()
    writer.writer.add_scalar = lambda *args, **kwargs: release.wait()
    try:
        writer.add_scalar("train/loss", 1.0, 0)
        deadline = time.time() + 10
        while not writer.queue.empty() and time.time() < deadline:  # the thread has taken it, and blocks
            time.sleep(0.01)
        writer._fail("its writer thread died (the line above says why)")  # as add_scalar finds a dead thread
        started = time.perf_counter()
        writer.close()
        assert time.perf_counter() - started < 1.0
        assert writer.failure.startswith("its writer thread died")
    finally:
        release.set()
