"""Continuing an evaluation that was cut short: ``sfengine.evaluate ... --resume``.

An evaluation stopped by Ctrl-C, a job's time limit, or a worker past ``--max_respawns`` writes the episodes that
finished, with ``"complete": false`` (sfengine.evaluate). A new evaluation empties results.json before any rank
plays (``start_over``), and writes the episodes at each progress line, so one killed outright (SIGKILL, a lost node)
leaves what it had played a few seconds before: rank 0 (the only one, or the first under torchrun) rewrites
results.json with its episodes, and every other rank writes those it played to its own
``progress.rank<R>.<pid>.<ms>.json`` (rank 0 merges them at the end and removes them). The same command with
``--resume`` plays only the episodes missing from all of them and writes the merged results, so a LIBERO evaluation
of 500 episodes cut at 472 costs 28 more, not 500:

    results.json (complete: false) + progress.rank*.json --kept--+
    this command's episodes (500) ---------- minus kept ----------+--> 28 to play --> results.json (500, complete)

Episodes are matched by (task, init state), or by seed for a single-task env: each kept row cancels one episode of
the command's list, whose order (and which episodes record a video) is otherwise unchanged.
"""

from __future__ import annotations

import json
import math
import os
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
    progress_files: list[Path]  # ranks' files among them, to remove once results.json holds their episodes


PROGRESS_GLOB = "progress.rank*.json"


def progress_path(out_dir: Path, rank: int, started: float) -> Path:
    """Where a rank of a multi-rank evaluation writes the episodes it has played: a name of its own process and
    start, so that a resumed evaluation killed again adds a file instead of overwriting what the first one left."""
    return out_dir / f"progress.rank{rank}.{os.getpid()}.{int(started * 1000)}.json"


def remove_progress(paths: list[Path]) -> None:
    """Remove ranks' progress files whose episodes results.json now holds (or a new evaluation's stale ones)."""
    for path in paths:
        path.unlink(missing_ok=True)


def progress_files(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob(PROGRESS_GLOB))


def load_partial(out_dir: Path, settings: dict) -> Partial:
    """The evaluation written to ``out_dir``: results.json and the ranks' progress files, merged. Raises
    ValueError (bad input: one line, exit 2) when there is none, or when one was made with other ``settings`` (the
    env, the policy version, the kind of actions, episodes per init)."""
    results = out_dir / "results.json"
    progress = progress_files(out_dir)
    paths = ([results] if results.is_file() else []) + progress
    if not paths:
        raise ValueError(f"--resume: no evaluation to resume in {out_dir} (no results.json); leave out --resume")
    episodes, complete, wall = [], True, 0.0
    for path in paths:
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
        episodes += [
            EpisodeStats(
                row["return"],
                row["length"],
                math.nan if row["success"] is None else float(row["success"]),
                row["task_index"],
                row["init_state"],
            )
            for row in rows
        ]
        # A progress file says complete: false; the ranks ran side by side, so the longest wall is the evaluation's.
        complete = complete and bool(data.get("complete"))
        wall = max(wall, float(data.get("wall_sec", 0.0)))
    return Partial(episodes, complete, wall, progress)


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
