"""``python -m sfengine.plot``: curves of one run, or of several side by side, from the TensorBoard files a run
writes (through the engine's own writer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sfengine.reporting.events import read_scalars
from sfengine.reporting.writer import TensorBoardWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(experiment_dir: Path, returns: list[float]) -> None:
    writer = TensorBoardWriter(str(experiment_dir / "tensorboard"))
    for i, value in enumerate(returns):
        writer.add_scalar("episodes/episode_return_mean", value, 1000 * (i + 1))
        writer.add_scalar("perf/fps_60s", 500.0, 1000 * (i + 1))
    writer.close()


def plot(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sfengine.plot", f"--train_dir={tmp_path}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_one_run_and_two_side_by_side_are_drawn_from_their_tensorboard_files(tmp_path):
    write_run(tmp_path / "first", [1.0, 2.0, 4.0])
    write_run(tmp_path / "second", [3.0, 5.0])
    curves = read_scalars(tmp_path / "first")
    assert [(p.step, p.value) for p in curves["episodes/episode_return_mean"]] == [(1000, 1), (2000, 2), (3000, 4)]

    result = plot(tmp_path, "--experiment=first")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"written {tmp_path / 'first' / 'curves.png'}" in result.stdout
    assert (tmp_path / "first" / "curves.png").read_bytes().startswith(PNG_MAGIC)

    result = plot(tmp_path, "--experiment=first", "--experiment=second")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "compare_first_vs_second.png").read_bytes().startswith(PNG_MAGIC)
    assert not list(tmp_path.rglob(".*.tmp.png"))  # written whole, then moved into place


def test_a_run_without_records_is_one_line_and_exit_2(tmp_path):
    write_run(tmp_path / "first", [1.0])
    result = plot(tmp_path, "--experiment=first", "--experiment=missing")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"sfengine.plot: error: no TensorBoard records in {tmp_path / 'missing' / 'tensorboard'}; "
        "check --train_dir and --experiment"
    ]
    assert not list(tmp_path.rglob("*.png"))


def test_help_is_answered_before_torch_is_imported(tmp_path):
    # tensorboardX's package imports torch (seconds): the event reader is imported when a run is read.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sfengine.plot", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    modules = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert result.returncode == 0 and "--experiment" in result.stdout
    assert "sfengine" in modules and "torch" not in modules, sorted(m for m in modules if "torch" in m)
