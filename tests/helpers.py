"""Test helpers: run the real CLI in a subprocess and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def train_command(train_dir: Path, experiment: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sfengine.train",
        f"--train_dir={train_dir}",
        f"--experiment={experiment}",
        "--report_every_sec=2",
        *args,
    ]


def run_train(train_dir: Path, experiment: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        train_command(train_dir, experiment, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def read_summary(train_dir: Path, experiment: str) -> dict:
    return json.loads((train_dir / experiment / "summary.json").read_text())
