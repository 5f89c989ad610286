"""The tuner, on the synthetic env whose best layout can be computed: a 2 ms step that keeps its core busy
gains from one rollout worker per core and from nothing beyond the cores."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from sfengine.config import parse_config
from sfengine.engine.sizing import Machine


@pytest.mark.slow
def test_tuner_finds_one_worker_per_core_for_a_cpu_bound_env_and_writes_a_loadable_preset(tmp_path):
    command = [sys.executable, "-m", "sfengine.tune", "--env=synthetic", "--synthetic_step_ms=2"]
    command += ["--budget_seconds=20", f"--out={tmp_path}"]  # the worker counts, the first stage
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "computes" in result.stdout  # the probe saw a CPU-bound env, so no layout had more workers than cores
    preset = tmp_path / "tuned_synthetic.yaml"
    chosen = yaml.safe_load(preset.read_text())
    assert chosen["num_workers"] == Machine.here().cores
    assert chosen["synthetic_step_ms"] == "2"
    cfg = parse_config([f"--cfg={preset}", f"--train_dir={tmp_path}"])
    assert cfg.env.env == "synthetic" and cfg.sampler.num_workers == chosen["num_workers"]
    assert "| 1 |" in result.stdout  # the ranked table
