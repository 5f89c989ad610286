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
