"""The contract of a multi-task env (a LIBERO suite, for example), as the engine sees it.

A multi-task env exposes, on ``env.unwrapped``:

    num_tasks: int
    task_names: list[str]
    num_init_states(task: int) -> int
    instruction(task: int) -> str  (optional: the task's language instruction, shown in evaluation tables)

and accepts ``reset(options={"task": t, "init_state": i})``. The rollout worker draws these assignments from a
``TaskSchedule`` and reports each episode's task, so success is tracked per task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym


@dataclass(frozen=True)
class TaskInfo:
    task_names: list[str]
    init_states_per_task: list[int]
    instructions: list[str] = field(default_factory=list)  # empty when the env gives none


def selected_init_states(tasks: TaskInfo, only_tasks: list[int], option: str) -> list[int]:
    """Init states per task, 0 for the tasks outside ``only_tasks`` (all tasks when it is empty). Raises
    ValueError naming ``option`` for a task index the env does not have."""
    num_tasks = len(tasks.init_states_per_task)
    if unknown := [t for t in only_tasks if not 0 <= t < num_tasks]:
        raise ValueError(f"{option}: the env has tasks 0..{num_tasks - 1}, not {unknown}")
    return [
        count if not only_tasks or task in only_tasks else 0 for task, count in enumerate(tasks.init_states_per_task)
    ]


def task_info(env: gym.Env) -> TaskInfo | None:
    """The tasks of a multi-task env, or None for an ordinary env."""
    base = env.unwrapped
    if not hasattr(base, "num_tasks") or not hasattr(base, "num_init_states"):
        return None
    names = list(getattr(base, "task_names", [f"task_{t}" for t in range(base.num_tasks)]))
    instructions = [str(base.instruction(t)) for t in range(base.num_tasks)] if hasattr(base, "instruction") else []
    return TaskInfo(names, [int(base.num_init_states(t)) for t in range(base.num_tasks)], instructions)
