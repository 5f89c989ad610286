"""An evaluation's results: one row per episode, a table per task, and the files they are written to.

    <experiment>/eval/<checkpoint>/results.json   per-task and overall figures, the settings, every episode
    <experiment>/eval/<checkpoint>/results.csv    one row per episode: task, init state, success, return, length
    <experiment>/eval/<checkpoint>/results.md     the per-task table (also printed)

Success rates carry a 95% Wilson score interval: with 50 episodes a task at 0.9 is known only to about
[0.79, 0.96], which is what a reader needs to compare two checkpoints.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

from sfengine.engine.messages import EpisodeStats
from sfengine.evaluation.episode_queue import SINGLE_TASK
from sfengine.reporting.reporter import json_text

Z_95 = 1.959964


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``(0, 1)`` without data)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 or n successes the bound is exactly 0 or 1; the formula leaves rounding error there.
    return (0.0 if successes == 0 else center - half), (1.0 if successes == n else center + half)


@dataclass
class GroupResult:
    """The figures of one task, or of all episodes."""

    name: str
    instruction: str
    episodes: int
    successes: int | None  # None when the env reports no success
    return_mean: float
    length_mean: float

    @property
    def success_rate(self) -> float | None:
        return None if self.successes is None or not self.episodes else self.successes / self.episodes

    def as_dict(self) -> dict:
        result = dict(vars(self), success_rate=self.success_rate)
        if self.successes is not None:
            result["success_ci95"] = list(wilson_interval(self.successes, self.episodes))
        return result


def summarize(name: str, instruction: str, episodes: list[EpisodeStats]) -> GroupResult:
    n = len(episodes)
    reported = [e.success for e in episodes if not math.isnan(e.success)]
    return GroupResult(
        name,
        instruction,
        n,
        int(sum(reported)) if reported and len(reported) == n else None,
        sum(e.episode_return for e in episodes) / n if n else math.nan,
        sum(e.length for e in episodes) / n if n else math.nan,
    )


class EvalReport:
    """Per-task and overall results of an evaluation."""

    def __init__(
        self,
        episodes: list[EpisodeStats],
        task_names: list[str] | None,
        instructions: list[str] | None = None,
        env_name: str = "",
    ):
        self.episodes = sorted(episodes, key=lambda e: (e.task, e.init_state))
        self.task_names = task_names or []
        self.env_name = env_name
        instructions = instructions or []
        self.tasks: list[GroupResult] = []
        if self.task_names:
            by_task: dict[int, list[EpisodeStats]] = {}
            for episode in self.episodes:
                by_task.setdefault(episode.task, []).append(episode)
            for task, task_episodes in sorted(by_task.items()):
                instruction = instructions[task] if task < len(instructions) else ""
                self.tasks.append(summarize(self.task_names[task], instruction, task_episodes))
        self.overall = summarize("overall", "", self.episodes)

    def task_name(self, task: int) -> str:
        return self.env_name if task == SINGLE_TASK else self.task_names[task]

    def markdown(self) -> str:
        def success(group: GroupResult) -> str:
            if group.successes is None:
                return "n/a"
            low, high = wilson_interval(group.successes, group.episodes)
            return f"{group.success_rate:.3f} [{low:.2f}, {high:.2f}]"

        lines = [
            "| task | instruction | episodes | success [95% CI] | mean return | mean length |",
            "|---|---|---|---|---|---|",
        ]
        for group in (*self.tasks, self.overall):
            name = f"**{group.name}**" if group is self.overall else group.name
            lines.append(
                f"| {name} | {group.instruction} | {group.episodes} | {success(group)} | "
                f"{group.return_mean:.2f} | {group.length_mean:.1f} |"
            )
        return "\n".join(lines)

    def write(self, directory: Path, settings: dict) -> None:
        """results.json, results.csv and results.md in ``directory``, each written whole or not at all."""
        directory.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        data = {
            **settings,
            "overall": self.overall.as_dict(),
            "tasks": [group.as_dict() for group in self.tasks],
            "episodes": rows,
        }
        write_atomic(directory / "results.json", json_text(data))
        tmp = directory / ".results.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["task", "task_index", "init_state", "success", "return", "length"])
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, directory / "results.csv")
        write_atomic(directory / "results.md", self.markdown() + "\n")

    def rows(self) -> list[dict]:
        """One dict per episode, as results.json and results.csv hold them."""
        return [self._row(e) for e in self.episodes]

    def _row(self, episode: EpisodeStats) -> dict:
        return {
            "task": self.task_name(episode.task),
            "task_index": episode.task,
            "init_state": episode.init_state,
            "success": None if math.isnan(episode.success) else bool(episode.success),
            "return": episode.episode_return,
            "length": episode.length,
        }


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
