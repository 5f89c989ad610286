"""The throughput harness in its quick mode: every row runs and the JSON has every field."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_run_of_every_row_writes_json_markdown_and_plot(tmp_path):
    # --baseline_ref=HEAD: the engine rows also run from a temporary checkout of a revision (before/after).
    command = [sys.executable, "-m", "benchmarks.throughput", "--env=synthetic", "--synthetic_step_ms=1"]
    command += ["--baseline_ref=HEAD", "--with_workers_acting"]
    command += ["--seconds=1", "--warmup=0.5", "--startup=20", "--with_training", "--with_diy", f"--out={tmp_path}"]
    command += ["--num_workers=2", "--num_envs_per_worker=4", "--batch_size=256", "--num_batches_per_epoch=1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    stem = "throughput_synthetic_2x4"
    report = json.loads((tmp_path / f"{stem}.json").read_text())
    engine_rows = {f"{row}{layout}" for row in ("sampling", "training") for layout in ("", "_workers_act")}
    assert set(report["rows"]) == {"limit", "diy", *engine_rows, "sampling@HEAD", "training@HEAD"}
    for name, row in report["rows"].items():
        assert row["fps"] > 0 and row["peak_rss_mb"] > 0 and row["cpu_percent"] > 0, name
    # The limit of 8 envs at 1 ms each on this machine's cores, and the engine rows' time split.
    assert report["rows"]["limit"]["fps"] < 8 * 1000 * 1.05
    assert "env_step" in report["rows"]["sampling"]["time_split"]
    # Rollout workers that act themselves report their acting as the inference share.
    assert re.search(r"inference [1-9]", report["rows"]["sampling_workers_act"]["time_split"]), report["rows"]
    assert (tmp_path / f"{stem}.png").stat().st_size > 1000
    assert "ratio to limit" in (tmp_path / f"{stem}.md").read_text()
    worktrees = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, cwd=REPO).stdout
    assert len(worktrees.splitlines()) == 1  # the baseline's checkout is gone
