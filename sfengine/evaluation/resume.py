"""Continuing an evaluation that was cut short: ``sfengine.evaluate ... --resume``.

An evaluation stopped by Ctrl-C, a job's time limit, or a worker past ``--max_respawns`` writes the episodes that
finished, with ``"complete": false`` (sfengine.evaluate); a single-rank one also writes them at each progress line,
so one killed outright (SIGKILL, a lost node) leaves what it had played a few seconds before. The same command with
``--resume`` plays only the episodes missing from it and writes the merged results, so a LIBERO evaluation of 500
episodes cut at 472 costs 28 more, not 500:

    results.json (472 rows, complete: false) --kept--+
    this command's episodes (500) ---- minus kept ---+--> 28 to play --> results.json (500 rows, complete: true)

Episodes are matched by (task, init state), or by seed for a single-task env: each kept row cancels one episode of
the command's list, whose order (and which episodes record a video) is otherwise unchanged.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from sfengine.engine.messages import EpisodeStats
from sfengine.evaluation.episode_queue import SINGLE_TASK, EvalEpisode


class Partial(NamedTuple):
    """What an earlier evaluation in the same folder left: its episodes, and whether it had every one."""

    episodes: list[EpisodeStats]
    complete: bool
    wall_sec: float


def load_partial(out_dir: Path, settings: dict) -> Partial:
    """The evaluation written to ``out_dir``. Raises ValueError (bad input: one line, exit 2) when there is none,
    or when it was made with other ``settings`` (the env, the policy version, the kind of actions, episodes per
    init)."""
    path = out_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"--resume: no evaluation to resume in {out_dir} (no results.json); leave out --resume")
    try:
        data = json.loads(path.read_text())
        rows = data["episodes"]
    except (ValueError, KeyError) as exc:
        raise ValueError(f"--resume: {path} is not an evaluation's results ({exc}); leave out --resume") from None
    for name, value in settings.items():
        if data.get(name) != value:
            raise ValueError(
                f"--resume: {path} was made with {name}={data.get(name)!r}, this command asks for {value!r}; "
                "give the options it was made with, or leave out --resume to start over"
            )
    episodes = [
        EpisodeStats(
            row["return"],
            row["length"],
            math.nan if row["success"] is None else float(row["success"]),
            row["task_index"],
            row["init_state"],
        )
        for row in rows
    ]
    return Partial(episodes, bool(data.get("complete")), float(data.get("wall_sec", 0.0)))


def episode_key(episode: EvalEpisode | EpisodeStats) -> tuple[int, int]:
    return episode.task, episode.init_state


def check_fits(kept: list[EpisodeStats], every_episode: list[EvalEpisode]) -> None:
    """Raise ValueError if the kept episodes are not a part of the episodes this command asks for (every rank's):
    an evaluation made with other --eval_tasks, --eval_init_states, --episodes_per_init or --eval_episodes."""
    extra = Counter(map(episode_key, kept)) - Counter(map(episode_key, every_episode))
    if not extra:
        return
    task, init_state = min(extra)
    what = f"seed {init_state}" if task == SINGLE_TASK else f"task {task}, init state {init_state}"
    raise ValueError(
        f"--resume: the evaluation holds {sum(extra.values())} episode(s) this command does not ask for ({what}); "
        "give the --eval_tasks, --eval_init_states, --episodes_per_init or --eval_episodes it was made with, or "
        "leave out --resume to start over"
    )


def still_to_play(episodes: list[EvalEpisode], kept: list[EpisodeStats]) -> list[EvalEpisode]:
    """``episodes`` (a rank's share, in order) less those already played: each kept episode cancels the first
    episode of ``episodes`` with its (task, init state) not yet cancelled."""
    left = Counter(map(episode_key, kept))
    remaining = []
    for episode in episodes:
        key = episode_key(episode)
        if left[key]:
            left[key] -= 1
        else:
            remaining.append(episode)
    return remaining
