"""The tuner, on the synthetic env whose best layout can be computed: a 2 ms step that keeps its core busy
gains from one rollout worker per core and from nothing beyond the cores."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from sfengine.config import parse_config
from sfengine.engine.sizing import Machine
from sfengine.tune import main


@pytest.mark.slow
def test_tuner_finds_one_worker_per_core_for_a_cpu_bound_env_and_writes_a_loadable_preset(tmp_path):
    command = [sys.executable, "-m", "sfengine.tune", "--env=synthetic", "--synthetic_step_ms=2"]
    out = tmp_path / "presets" / "tuned"  # created: a folder that does not exist yet is made
    command += ["--budget_seconds=20", f"--out={out}"]  # the worker counts, the first stage
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "computes" in result.stdout  # the probe saw a CPU-bound env, so no layout had more workers than cores
    preset = out / "tuned_synthetic.yaml"
    chosen = yaml.safe_load(preset.read_text())
    assert chosen["num_workers"] == Machine.here().cores
    assert chosen["synthetic_step_ms"] == "2"
    cfg = parse_config([f"--cfg={preset}", f"--train_dir={tmp_path}"])
    assert cfg.env.env == "synthetic" and cfg.sampler.num_workers == chosen["num_workers"]
    assert "| 1 |" in result.stdout  # the ranked table


def test_an_out_folder_that_cannot_be_made_is_refused_before_the_search_starts(tmp_path, capsys):
    # Found out after the search had spent its budget, it cost the whole search and ended in a traceback.
    (tmp_path / "a_file").write_text("")
    assert main(["--env=CartPole-v1", f"--out={tmp_path / 'a_file' / 'presets'}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no probe, no search
    assert captured.err.count("\n") == 1 and "--out=" in captured.err and "give a writable directory" in captured.err
