"""Read back the scalars a run wrote to TensorBoard, without TensorBoard: for curves, benchmarks and tests.

    curves = read_scalars(Path("train_dir/my_run"))
    steps, returns = zip(*[(p.step, p.value) for p in curves["episodes/episode_return_mean"]])

An event file is a sequence of records ``length (uint64) | crc (4 bytes) | Event protobuf | crc (4 bytes)``; the
checksums are not verified (the files are our own, and a run still writing may end in a partial record, which is
skipped).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from tensorboardX.proto import event_pb2


class ScalarPoint(NamedTuple):
    wall_time: float  # seconds since the epoch
    step: int  # env steps
    value: float


def read_scalars(experiment_dir: Path) -> dict[str, list[ScalarPoint]]:
    """Every scalar of ``<experiment_dir>/tensorboard``, by tag, in the order written (files by name)."""
    curves: dict[str, list[ScalarPoint]] = {}
    for path in sorted((Path(experiment_dir) / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            start, end = offset + 12, offset + 12 + length
            if end + 4 > len(data):
                break
            event = event_pb2.Event.FromString(data[start:end])
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    curves.setdefault(value.tag, []).append(
                        ScalarPoint(event.wall_time, event.step, float(value.simple_value))
                    )
            offset = end + 4
    return curves
