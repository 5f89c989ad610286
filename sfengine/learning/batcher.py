"""Batcher: gathers finished trajectories into training batches, in a thread of the learner process.

    TrajectoriesReady(ids) --> pending ids --(enough for a batch and a free batch slot)--> copy into the slot
        --> buffers_released_<owner>(ids) back to each owning rollout worker
        --> training_batch_ready(slot) to the learner;  batch_released(slot) makes the slot free again

Two batch slots: one is trained on while the next is filled. Trajectory buffers are freed right after the
copy, so rollout workers never wait for a training step to finish.
"""

from __future__ import annotations

import time
from collections import deque

import torch
from signal_slot.signal_slot import signal

from sfengine.engine.buffers import SharedBuffers, TrajectoryBuffers
from sfengine.engine.event_loop import Component
from sfengine.engine.messages import BuffersReleased, TrajectoriesReady


def buffers_released_signal(worker: int) -> str:
    return f"buffers_released_{worker}"


def release_buffers(batcher: Component, buffers: SharedBuffers, buffer_ids: list[int]) -> None:
    """Give buffers back to their owning rollout workers, each with its lend count: the count is marked returned
    in shared memory first, so a worker respawned meanwhile finds it free and ignores this message."""
    lends = buffers.lends.numpy()  # a view made in this process (one made before the spawn would be a copy)
    by_owner: dict[int, list[int]] = {}
    for buffer_id in buffer_ids:
        by_owner.setdefault(buffers.owner_of(buffer_id), []).append(buffer_id)
    for owner, owned in by_owner.items():
        counts = tuple(int(n) for n in lends[owned, 0])
        lends[owned, 1] = counts
        batcher.emit(buffers_released_signal(owner), BuffersReleased(tuple(owned), counts))


class Batcher(Component):
    def __init__(self, event_loop, buffers: SharedBuffers, trajectories_per_batch: int):
        super().__init__(event_loop, "batcher")
        self.buffers = buffers
        self.trajectories_per_batch = trajectories_per_batch
        self.pending: deque[int] = deque()
        self.batch_slots: list[TrajectoryBuffers] = []
        self.free_slots: deque[int] = deque()
        self.busy_sec = 0.0

    @signal
    def training_batch_ready(self): ...

    @signal
    def failed(self): ...  # (reason: str) its loop ended on an exception; see LearnerWorker._run_batcher

    def set_batch_slots(self, slots: list[TrajectoryBuffers]) -> None:
        """The learner allocates the slots (on its device) before the batcher starts."""
        self.batch_slots = slots
        self.free_slots = deque(range(len(slots)))

    def on_trajectories_ready(self, message: TrajectoriesReady) -> None:
        self.pending.extend(message.buffer_ids)
        self._assemble()

    def on_batch_released(self, slot: int) -> None:
        self.free_slots.append(slot)
        self._assemble()

    def _assemble(self) -> None:
        while len(self.pending) >= self.trajectories_per_batch and self.free_slots:
            started = time.perf_counter()
            slot = self.free_slots.popleft()
            # In buffer order, not arrival order: a synchronous run's batch then holds its trajectories in the same
            # rows from run to run, and trains the same weights (docs/training.md, "Repeatable runs").
            ids = sorted(self.pending.popleft() for _ in range(self.trajectories_per_batch))
            self.batch_slots[slot].copy_rows_(self.buffers.trajectories, torch.tensor(ids))
            release_buffers(self, self.buffers, ids)
            self.busy_sec += time.perf_counter() - started
            self.training_batch_ready.emit(slot)
