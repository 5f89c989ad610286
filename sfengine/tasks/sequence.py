"""The rank's one assignment sequence, shared by every rollout worker and split of the rank.

``round_robin`` (default): a ``TaskSchedule`` maps a position to a (task, init state); the position lives in
shared memory and each one is handed out exactly once, under a lock, to whichever env resets next:

    worker 0 split 1 env 0 resets -> position 17 -> (task 7, init state 1)
    worker 1 split 0 env 1 resets -> position 18 -> (task 8, init state 1)

So after ``k`` cycles of the schedule have been handed out on a rank, every pair of its shard was used exactly
``k x G`` times, whatever the number of workers, envs and splits.

``curriculum``: the task is drawn with probability proportional to (its failures among its last ``window``
episodes + 1), and the init state comes from that task's circular cursor, so within each task every init state
is still used once before any is reused. Rollout workers record each episode's outcome here.

An episode cut short by the death of its rollout worker is handed out again (``hand_out_again``): the next draws
return it, with its position, before the sequence moves on (see sfengine.engine.respawn). A worker can die inside a draw,
so a draw is recorded by its caller before it counts, and counts by one store (the position, or the number of
episodes waiting): whatever instruction the kill lands on, ``hand_out_again`` can tell which of an env's two
records (the episode it holds, the one it was drawing) is its latest draw.

The state (position, cursors, recent outcomes, episodes to hand out again) is saved in checkpoints, and a resumed
run continues it. A draw costs one uncontended lock, once per episode.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sfengine.engine.process_lock import ProcessLock
from sfengine.tasks.scheduler import Assignment, TaskSchedule, curriculum_weights
from sfengine.tasks.seeding import SEED_STRIDE, curriculum_draw_seed

NO_OUTCOME = -1  # an empty slot of the recent-outcomes window
# Single-task envs with group advantages: the sequence deals seeds as "init states"; a group's G episodes reset
# with the same one. Offset far above the evaluation's seeds 0..N-1, so training never replays them.
GROUP_SEEDS_PER_RANK = 10_000
GROUP_SEED_OFFSET = 1_000_000_000


Episode = tuple[int, int, int]  # (task, init state, position in the sequence)


def single_task_group_seed(base_seed: int, init_state: int) -> int:
    """The reset seed of a single-task group's episodes; ``init_state`` counts groups on all ranks."""
    return GROUP_SEED_OFFSET + base_seed * SEED_STRIDE * GROUP_SEEDS_PER_RANK + init_state


@dataclass
class SharedTaskSequence:
    schedule: TaskSchedule
    position: Tensor  # int64 [1]: assignments handed out
    lock: ProcessLock  # leaves nothing in /dev/shm, and a holder that dies releases it
    curriculum: bool = False
    init_cursors: Tensor | None = None  # curriculum: int64 [tasks of the shard], draws of each task so far
    outcomes: Tensor | None = None  # curriculum: int8 [tasks, window], 1 failure, 0 success, NO_OUTCOME empty
    outcome_slots: Tensor | None = None  # curriculum: int64 [tasks], the next slot of each task's window
    last: Tensor | None = None  # curriculum: int64 [2], the last assignment, repeated for a group of size G
    seed: int = 0
    # int64 [capacity, 3]: (task, init state, position) of episodes to hand out again, the first ``replay_count``
    replays: Tensor | None = None
    replay_count: Tensor | None = None  # int64 [1]

    @classmethod
    def allocate(
        cls, schedule: TaskSchedule, curriculum: bool = False, window: int = 20, seed: int = 0, envs: int = 64
    ) -> SharedTaskSequence:
        """``envs``: the envs drawing from it, the most episodes that can be waiting to be handed out again."""
        num_tasks = len(schedule.tasks)
        sequence = cls(schedule, torch.zeros(1, dtype=torch.int64).share_memory_(), ProcessLock(), curriculum)
        sequence.replays = torch.zeros((envs, 3), dtype=torch.int64).share_memory_()
        sequence.replay_count = torch.zeros(1, dtype=torch.int64).share_memory_()
        if curriculum:
            sequence.init_cursors = torch.zeros(num_tasks, dtype=torch.int64).share_memory_()
            sequence.outcomes = torch.full((num_tasks, window), NO_OUTCOME, dtype=torch.int8).share_memory_()
            sequence.outcome_slots = torch.zeros(num_tasks, dtype=torch.int64).share_memory_()
            sequence.last = torch.zeros(2, dtype=torch.int64).share_memory_()
            sequence.seed = seed
        return sequence

    def next(self) -> Assignment:
        return self.next_with_position()[0]

    def next_with_position(self, record: Callable[[Assignment, int], None] | None = None) -> tuple[Assignment, int]:
        """The next assignment and its position in the sequence: positions ``g*G .. g*G + G - 1`` are group ``g``,
        G episodes of one (task, init state). ``record(assignment, position)`` runs under the lock before the
        draw counts: a process killed before the draw counts has drawn nothing, one killed after it has recorded
        it (see ``hand_out_again``)."""
        with self.lock:
            if count := int(self.replay_count[0]):
                task, init_state, position = self.replays[count - 1].tolist()
                assignment = Assignment(task, init_state)
                if record is not None:
                    record(assignment, position)
                self.replay_count[0] = count - 1
                return assignment, position
            position = int(self.position[0])
            assignment = self._assignment_at(position)
            if record is not None:
                record(assignment, position)
            self.position[0] = position + 1
            return assignment, position

    def hand_out_again(self, envs: list[tuple[Episode, Episode]]) -> list[Episode]:
        """The episodes that a dead worker's envs were playing, handed out again: the next draws return them
        before any new position, so every position is still played to its end once. Each env gives two records
        (task, init state, position), position -1 for none: the episode it held, and the draw it recorded last;
        the draw is the env's episode if it counted (the worker died after the draw, before the env took it).
        Returns the episodes handed out again."""
        with self.lock:
            waiting = set(self.replays[: int(self.replay_count[0]), 2].tolist())
            next_position = int(self.position[0])
            episodes = []
            for held, drawn in envs:
                counted = 0 <= drawn[2] < next_position and drawn[2] not in waiting
                latest = drawn if counted and drawn[2] != held[2] else held
                if latest[2] >= 0:
                    episodes.append(latest)
            self._wait(episodes)
        return episodes

    def _wait(self, episodes: list[Episode]) -> None:
        """Episodes to hand out before any new position; called under the lock."""
        count = int(self.replay_count[0])
        if count + len(episodes) > len(self.replays):
            raise RuntimeError(f"{count + len(episodes)} episodes to hand out again, room for {len(self.replays)}")
        if episodes:
            self.replays[count : count + len(episodes)] = torch.tensor(episodes, dtype=torch.int64)
        self.replay_count[0] = count + len(episodes)

    def _assignment_at(self, position: int) -> Assignment:
        """The assignment at ``position``; called under the lock."""
        if not self.curriculum:
            return self.schedule.at(position)
        if position % self.schedule.group_size:
            return Assignment(int(self.last[0]), int(self.last[1]))
        recent_failures = (self.outcomes == 1).sum(dim=1).tolist()
        # Seeded by the position: the same state draws the same task, in any process.
        index = random.Random(curriculum_draw_seed(self.seed, position)).choices(
            range(len(recent_failures)), weights=curriculum_weights(recent_failures)
        )[0]
        task = self.schedule.tasks[index]
        states = self.schedule.shard[task]
        assignment = Assignment(task, states[int(self.init_cursors[index]) % len(states)])
        self.init_cursors[index] += 1
        self.last[0], self.last[1] = assignment
        return assignment

    def record(self, task: int, success: bool) -> None:
        """An episode of ``task`` ended: its outcome enters the task's window (curriculum only)."""
        if not self.curriculum:
            return
        index = self.schedule.tasks.index(task)
        with self.lock:
            slot = int(self.outcome_slots[index])
            self.outcomes[index, slot % self.outcomes.shape[1]] = 0 if success else 1
            self.outcome_slots[index] = slot + 1

    def state_dict(self) -> dict:
        with self.lock:
            state = {"position": int(self.position[0])}
            state["replays"] = self.replays[: int(self.replay_count[0])].tolist()
            if self.curriculum:
                for name in ("init_cursors", "outcomes", "outcome_slots", "last"):
                    state[name] = getattr(self, name).tolist()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state; curriculum fields whose shape no longer fits start afresh."""
        self.position[0] = int(state["position"])
        replays = state.get("replays", [])[: len(self.replays)]
        self.replay_count[0] = len(replays)
        if replays:
            self.replays[: len(replays)] = torch.tensor(replays, dtype=torch.int64)
        if not self.curriculum:
            return
        for name in ("init_cursors", "outcomes", "outcome_slots", "last"):
            saved = torch.tensor(state.get(name, []), dtype=getattr(self, name).dtype)
            if saved.shape == getattr(self, name).shape:
                getattr(self, name).copy_(saved)
