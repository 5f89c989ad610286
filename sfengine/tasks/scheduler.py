"""Which (task, init state) a multi-task env plays next. Pure: no env, no process.

Sharding over ranks: task ``i`` goes to rank ``i % world_size`` (9 tasks, 2 ranks: rank 0 gets tasks
[0, 2, 4, 6, 8], rank 1 gets [1, 3, 5, 7]). When there are more ranks than tasks, whole tasks would leave
ranks idle, so the (task, init state) pairs are dealt round-robin instead.

On a rank, the sequence turns round-robin over the rank's tasks, and each task keeps a circular init-state
cursor. One cycle hands out every pair of the shard exactly once (a task with fewer init states simply drops
out of the later rounds of the cycle), so after ``k`` cycles every pair was used exactly ``k`` times. With a
group size ``G`` each pair is handed out ``G`` times in a row.

With a failure-weighted curriculum (``sfengine.tasks.sequence``), the task is drawn with probability
``curriculum_weights`` instead of in turn, and each task still keeps its circular init-state cursor.

The round-robin sequence is a function of one integer, the position, which makes it trivial to checkpoint and to share:

    schedule = TaskSchedule(shard_pairs([10], rank=0, world_size=1))
    [schedule.at(p).init_state for p in range(4)]      # [0, 1, 2, 3]
    [schedule.at(p).init_state for p in range(8, 12)]  # [8, 9, 0, 1]
"""

from __future__ import annotations

from typing import NamedTuple


class Assignment(NamedTuple):
    task: int
    init_state: int


def shard_pairs(init_states_per_task: list[int], rank: int, world_size: int) -> dict[int, list[int]]:
    """The (task -> init states) this rank owns. Tasks with no init states (left out of a run or an evaluation)
    take no part: the others are dealt as if they were the env's only tasks."""
    present = [task for task, count in enumerate(init_states_per_task) if count]
    if len(present) < len(init_states_per_task):
        compact = shard_pairs([init_states_per_task[task] for task in present], rank, world_size)
        return {present[index]: states for index, states in compact.items()}
    num_tasks = len(init_states_per_task)
    if world_size <= num_tasks:
        return {task: list(range(init_states_per_task[task])) for task in range(rank, num_tasks, world_size)}
    shard: dict[int, list[int]] = {}
    index = 0
    for task, count in enumerate(init_states_per_task):
        for init_state in range(count):
            if index % world_size == rank:
                shard.setdefault(task, []).append(init_state)
            index += 1
    return shard


class TaskSchedule:
    def __init__(self, shard: dict[int, list[int]], group_size: int = 1):
        if not shard or any(not states for states in shard.values()):
            raise ValueError("a schedule needs at least one task with at least one init state")
        self.shard = shard
        self.tasks = tasks = sorted(shard)
        rounds = max(len(shard[task]) for task in tasks)
        # One cycle: round r hands out init state r of every task that has one.
        self.cycle = [Assignment(task, shard[task][r]) for r in range(rounds) for task in tasks if r < len(shard[task])]
        self.group_size = group_size
        self.position = 0

    @property
    def cycle_length(self) -> int:
        return len(self.cycle) * self.group_size

    def at(self, position: int) -> Assignment:
        return self.cycle[(position // self.group_size) % len(self.cycle)]

    def next(self) -> Assignment:
        assignment = self.at(self.position)
        self.position += 1
        return assignment

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def curriculum_weights(recent_failures: list[int]) -> list[float]:
    """Task weights of the failure-weighted curriculum: (failures in the task's recent window + 1). A task never
    failed recently keeps weight 1, so it is still visited."""
    return [failures + 1.0 for failures in recent_failures]
