"""sfengine.evaluate on a LIBERO suite: real simulators, the per-task table and mp4s of the agentview camera."""

from __future__ import annotations

import csv
import json
from collections import Counter

import imageio.v3 as iio
import pytest

from helpers import evaluate

pytest.importorskip("libero", reason="the libero extra is not installed: pip install -e '.[libero]'")

from sfengine.config import parse_config, save_config  # noqa: E402
from sfengine.engine.checkpoint import save_checkpoint  # noqa: E402
from sfengine.env.registry import resolve_env_factory  # noqa: E402
from sfengine.train import build_model, probe_env  # noqa: E402


@pytest.mark.slow
def test_libero_evaluation_of_2_tasks_x_3_init_states_writes_table_csv_and_videos(tmp_path):
    train_dir = tmp_path / "train_dir"
    cfg = parse_config(["--env=libero_spatial", f"--train_dir={train_dir}", "--experiment=spatial"])
    obs_spec, action_spec, tasks = probe_env(cfg, resolve_env_factory(cfg.env.env))
    model = build_model(cfg, obs_spec, action_spec, None)  # an untrained policy: any policy will do
    cfg.experiment_dir.mkdir(parents=True)
    save_config(cfg, cfg.experiment_dir / "config.json")
    state = {"model": model.state_dict(), "optimizer": {}, "env_steps": 0, "policy_version": 0}
    save_checkpoint(cfg.experiment_dir, state, keep=1)

    result = evaluate(
        f"--train_dir={train_dir}",
        "--experiment=spatial",
        "--eval_tasks=0,1",
        "--eval_init_states=3",
        "--max_episode_steps=20",
        "--video_per_task=1",
        "--video_size=64",
        "--num_workers=2",
        "--num_envs_per_worker=2",
        "--libero_sim_cache=2",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (eval_dir,) = (cfg.experiment_dir / "eval").iterdir()
    with open(eval_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert Counter((int(r["task_index"]), int(r["init_state"])) for r in rows) == Counter(
        (task, init_state) for task in (0, 1) for init_state in range(3)
    )
    assert all(r["success"] in ("True", "False") and int(r["length"]) <= 20 for r in rows)

    results = json.loads((eval_dir / "results.json").read_text())
    assert [t["name"] for t in results["tasks"]] == tasks.task_names[:2]
    assert [t["instruction"] for t in results["tasks"]] == tasks.instructions[:2]
    table = (eval_dir / "results.md").read_text()
    for task in results["tasks"]:
        assert task["instruction"] in table and task["name"] in table
        low, high = task["success_ci95"]
        assert low <= task["success_rate"] <= high
    assert table in result.stdout  # the table is also printed

    # One video per task (its first init state), each with the episode's frames at the asked size.
    lengths = {(r["task"], int(r["init_state"])): int(r["length"]) for r in rows}
    videos = sorted((eval_dir / "videos").glob("*.mp4"))
    assert len(videos) == 2
    for video, task_name in zip(videos, sorted(tasks.task_names[:2])):
        assert video.name.startswith(f"{task_name}__init000__")
        frames = iio.imread(video)
        assert frames.shape == (lengths[(task_name, 0)] + 1, 64, 64, 3)
        assert frames.std() > 10  # a rendered scene, not a blank frame
