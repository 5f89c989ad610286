"""The finite set of episodes an evaluation runs, handed out once each to whichever env resets next.

    multi-task env (2 tasks x 3 init states, --episodes_per_init=1, --video_per_task=1):
        (0,0,video) (0,1) (0,2) (1,0,video) (1,1) (1,2)  then None: the env that draws None stops
    single-task env (--eval_episodes=3): seeds 0, 1, 2 (task -1)

Envs keep to one task while it has episodes left (``SharedEpisodeQueue``), so a LIBERO env builds a task's
simulator about once, where a round-robin order would switch simulators at every episode. Under torchrun each
rank takes its shard (``sfengine.tasks.scheduler.shard_pairs``; single-task seeds are dealt round-robin).

A draw moves a shared cursor under an uncontended lock (``ProcessLock``), once per episode, so however many
workers, envs and splits draw, every episode of the set is run exactly once. Each draw is marked with the worker that
made it: when a worker dies or hangs, the evaluation's runner hands the episodes it drew and never reported out
again (``hand_out_again``), to be drawn before any other, so a respawn loses none.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sfengine.engine.process_lock import ProcessLock
from sfengine.env.multitask import TaskInfo, selected_init_states
from sfengine.tasks.scheduler import shard_pairs

SINGLE_TASK = -1


class EvalEpisode(NamedTuple):
    task: int  # SINGLE_TASK for an ordinary env
    init_state: int  # multi-task envs: the init state; single-task envs: the seed of the episode's reset
    video: bool  # record this episode as an mp4
    position: int = -1  # its place in the evaluation's queue, where it was drawn from (-1: not drawn)


def evaluated_init_states(tasks: TaskInfo, only_tasks: list[int], init_states: int) -> list[int]:
    """Init states per task that an evaluation covers: 0 for the tasks left out, at most ``init_states`` (0: all)
    for the others. Raises ValueError naming a task index the env does not have."""
    counts = selected_init_states(tasks, only_tasks, "--eval_tasks")
    return [min(count, init_states) if init_states else count for count in counts]


def evaluation_episodes(
    tasks: TaskInfo | None,
    rank: int,
    world_size: int,
    episodes_per_init: int = 1,
    eval_episodes: int = 10,
    video_per_task: int = 0,
    only_tasks: list[int] | None = None,
    init_states: int = 0,
) -> list[EvalEpisode]:
    """This rank's episodes: every (task, init state) of its shard ``episodes_per_init`` times, task by task; or,
    for a single-task env, its share of the seeds 0..eval_episodes-1. ``only_tasks`` and ``init_states`` narrow
    the set (see ``evaluated_init_states``). The first episode of each of the first ``video_per_task`` init
    states of a task (the first seeds of a single-task env) is recorded."""
    if tasks is None:
        seeds = range(rank, eval_episodes, world_size)
        return [EvalEpisode(SINGLE_TASK, seed, seed < video_per_task) for seed in seeds]
    counts = evaluated_init_states(tasks, only_tasks or [], init_states)
    # The evaluated tasks are dealt to the ranks as a training run deals all of them (whole tasks, or pairs when
    # there are more ranks than tasks), so every rank gets a share of a narrowed evaluation too.
    episodes = []
    for task, states in sorted(shard_pairs(counts, rank, world_size).items()):
        for init_state in states:
            for repeat in range(episodes_per_init):
                episodes.append(EvalEpisode(task, init_state, repeat == 0 and init_state < video_per_task))
    return episodes


class SharedEpisodeQueue:
    """The evaluation's episodes in shared memory; each is handed out once, then ``next`` returns None.

    Episodes are grouped by task, and an env keeps to its task while that task has episodes left; an env without
    one (at start, or when its task ran out) joins the task with the most episodes left. A LIBERO env therefore
    builds about one simulator per task it helps with, where handing out the episodes in plain order would make
    every env build every task's simulator (2-4 s each): on 10 tasks x 50 init states with 8 envs, about 10 + 8
    builds instead of 80."""

    def __init__(self, episodes: list[EvalEpisode]):
        ordered = sorted(episodes, key=lambda e: e.task)  # stable: each task's episodes keep their order
        self.episodes = torch.tensor([list(map(int, e[:3])) for e in ordered], dtype=torch.int64).reshape(-1, 3)
        self.tasks = sorted({e.task for e in ordered})
        starts = [next(i for i, e in enumerate(ordered) if e.task == task) for task in self.tasks]
        self.ends = torch.tensor([*starts[1:], len(ordered)], dtype=torch.int64)
        self.cursors = torch.tensor(starts, dtype=torch.int64).share_memory_()  # each task's next episode
        self.drawn_by = torch.full((len(ordered),), -1, dtype=torch.int64).share_memory_()  # the drawing worker
        # Positions handed out again (a dead or hung worker's), drawn before any new one: [count, *positions].
        self.again = torch.full((len(ordered) + 1,), -1, dtype=torch.int64).share_memory_()
        self.again[0] = 0
        self.episodes.share_memory_()
        self.lock = ProcessLock()

    def __len__(self) -> int:
        return len(self.episodes)

    def next(self, current_task: int = SINGLE_TASK, worker: int = -1) -> EvalEpisode | None:
        """The next episode for an env of rollout worker ``worker`` playing ``current_task``: one handed out again
        first (of its task if there is one), then ``current_task``'s next if it has one left, else the next of the
        task with the most left. The episode carries its ``position``."""
        if not self.tasks:
            return None
        with self.lock:
            slot, index = self._waiting_slot(current_task), -1
            if slot >= 0:
                position = int(self.again[1 + slot])
            else:
                remaining = self.ends - self.cursors
                index = self.tasks.index(current_task) if current_task in self.tasks else -1
                if index < 0 or remaining[index] == 0:
                    index = int(remaining.argmax())
                    if remaining[index] == 0:
                        return None
                position = int(self.cursors[index])
            # Marked before the draw counts: a worker killed in between has it handed out again (and, if drawn
            # anew meanwhile, played twice and counted once), never lost.
            self.drawn_by[position] = worker
            if slot >= 0:
                count = int(self.again[0])
                self.again[1 + slot] = self.again[count]  # the last fills the gap: their order does not matter
                self.again[0] = count - 1
            else:
                self.cursors[index] = position + 1
        task, init_state, video = self.episodes[position].tolist()
        return EvalEpisode(task, init_state, bool(video), position)

    def _waiting_slot(self, current_task: int) -> int:
        """The slot of a position handed out again, of ``current_task`` if one is, else the first; -1 if none."""
        count = int(self.again[0])
        if not count:
            return -1
        same_task = (self.episodes[self.again[1 : count + 1], 0] == current_task).nonzero()
        return int(same_task[0, 0]) if len(same_task) else 0

    def hand_out_again(self, worker: int, reported: set[int]) -> list[EvalEpisode]:
        """The episodes rollout worker ``worker`` drew whose results never reached the runner (not in ``reported``):
        handed out again, ahead of every other. Call it once the worker is dead, before its successor starts.
        Returns them, for the log."""
        with self.lock:
            drawn = (self.drawn_by == worker).nonzero().flatten().tolist()
            waiting = set(self.again[1 : int(self.again[0]) + 1].tolist())
            lost = [position for position in drawn if position not in reported and position not in waiting]
            count = int(self.again[0])
            if lost:
                self.again[count + 1 : count + 1 + len(lost)] = torch.tensor(lost, dtype=torch.int64)
            self.again[0] = count + len(lost)
        episodes = [self.episodes[position].tolist() for position in lost]
        return [EvalEpisode(task, state, bool(video), p) for (task, state, video), p in zip(episodes, lost)]

    def record(self, task: int, success: bool) -> None:
        """Outcomes go to the evaluation's report, not to a curriculum."""


def training_evaluation_episodes(
    tasks: TaskInfo | None, evaluation: int, per_task: int = 0, eval_episodes: int = 10
) -> list[EvalEpisode]:
    """The episodes of the ``evaluation``-th evaluation during training (every task, on rank 0). With
    ``per_task`` > 0 each task plays that many init states, continuing from where the previous evaluation
    stopped, so that over evaluations every init state is seen (5 states, 2 per evaluation: [0,1], [2,3], [4,0]).
    Single-task envs replay the seeds 0..eval_episodes-1, so evaluations compare like with like."""
    if tasks is None:
        return [EvalEpisode(SINGLE_TASK, seed, False) for seed in range(eval_episodes)]
    episodes = []
    for task, count in enumerate(tasks.init_states_per_task):
        if not per_task or per_task >= count:
            states = range(count)
        else:
            states = [(evaluation * per_task + j) % count for j in range(per_task)]
        episodes.extend(EvalEpisode(task, init_state, False) for init_state in states)
    return episodes
