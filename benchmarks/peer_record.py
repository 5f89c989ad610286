"""What every learning-benchmark run leaves behind, whichever system ran it: one JSON file per (system, env, seed).

    {"system": "cleanrl", "env": "Hopper-v5", "seed": 1, "env_steps": 1000000, "wall_sec": 812.4, "fps": 1231,
     "final_return": 2310.5, "curve": [[env_steps, seconds, return of the last 100 episodes], ...]}

``final_return`` is the mean return of the last 100 finished episodes, raw rewards (no normalisation or scaling).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

WINDOW = 100  # episodes averaged, for the curve points and the final return


class EpisodeLog:
    """Collects finished episodes' raw returns as a peer trains, and writes the run's JSON at the end."""

    def __init__(self, system: str, env: str, seed: int):
        self.system, self.env, self.seed = system, env, seed
        self.started = time.perf_counter()
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.curve: list[list[float]] = []

    def episode(self, env_steps: int, episode_return: float) -> None:
        self.recent.append(float(episode_return))
        seconds = time.perf_counter() - self.started
        self.curve.append([env_steps, round(seconds, 3), sum(self.recent) / len(self.recent)])

    def write(self, path: str | Path, env_steps: int, settings: dict) -> dict:
        wall_sec = time.perf_counter() - self.started
        record = {
            "system": self.system,
            "env": self.env,
            "seed": self.seed,
            "env_steps": env_steps,
            "wall_sec": round(wall_sec, 1),
            "fps": round(env_steps / wall_sec),
            "final_return": sum(self.recent) / max(1, len(self.recent)),
            "settings": settings,
            "curve": self.curve,
        }
        write_json(path, record)
        return record


def write_json(path: str | Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def peer_main(system: str, train: Callable[[str, int, int, str], dict], description: str) -> None:
    """The command line every peer shares: ``--env --seed --env_steps --threads --out``."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--env", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env_steps", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = train(args.env, args.seed, args.env_steps, args.out)
    print(f"{system} {args.env} seed {args.seed}: return {record['final_return']:.1f} in {record['wall_sec']:.0f} s")
