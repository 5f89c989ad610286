"""``python -m sfengine.demos``: the scripted demonstrators' successful episodes, recorded into one HDF5 file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import requires_libero, start
from sfengine.demos import read_demos


def record(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "sfengine.demos", f"--train_dir={tmp_path}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_reach_demos_are_successful_episodes_of_every_task_with_the_actions_taken(tmp_path):
    output = tmp_path / "reach.hdf5"
    result = record(
        tmp_path, "--env=multitask_reach", "--demos_per_task=3", "--demo_action_noise=0.2", f"--demos_output={output}"
    )
    assert result.returncode == 0, result.stderr
    demo_set = read_demos(output)
    assert demo_set.env == "multitask_reach"
    assert sorted(d.task for d in demo_set.demos) == sorted(list(range(8)) * 3)
    for demo in demo_set.demos:
        assert demo.dones[-1] == 1 and demo.rewards[-1] == 1.0 and demo.rewards[:-1].sum() == 0
        # Replaying the recorded actions from the recorded start reproduces the episode: each action is the one
        # executed, and each observation the one it was chosen from.
        position, goal = demo.obs["obs"][0, :2].astype(np.float64), demo.obs["obs"][0, 2:]
        for t, action in enumerate(demo.actions):
            np.testing.assert_allclose(demo.obs["obs"][t, :2], position, atol=1e-5)
            position = np.clip(position + 0.1 * action, -1, 1)
        assert np.linalg.norm(position - goal) < 0.16
    # With noise the demos differ from the noiseless expert's straight line.
    assert len({len(d) for d in demo_set.demos}) > 1
    report = json.loads(output.with_suffix(".json").read_text())
    assert report["success_rate"] == 1.0 and [t["successes"] for t in report["tasks"]] == [3] * 8


@pytest.mark.slow
def test_a_single_task_env_recorded_by_two_processes_reports_its_task_once(tmp_path):
    # Its demos are split over the processes, one report each: the file's report listed task 0 twice (10 + 10).
    output = tmp_path / "reach.hdf5"
    result = record(tmp_path, "--env=sparse_reach", "--demos_per_task=6", "--num_workers=2", f"--demos_output={output}")
    assert result.returncode == 0, result.stderr
    (task,) = json.loads(output.with_suffix(".json").read_text())["tasks"]
    assert task["task"] == 0 and task["successes"] == len(read_demos(output).demos) == 6
    assert task["attempts"] == task["successes"] + len(task["failed_init_states"])


@pytest.mark.slow
def test_failed_episodes_are_counted_and_left_out(tmp_path):
    # Five steps leave the expert one to spare (the goal is 4 full steps away), so noise makes it fail at times.
    output = tmp_path / "noisy.hdf5"
    args = ["--env=multitask_reach", "--max_episode_steps=5", "--demos_per_task=2", "--demo_action_noise=1"]
    result = record(tmp_path, *args, f"--demos_output={output}")
    assert result.returncode == 0, result.stderr
    report = json.loads(output.with_suffix(".json").read_text())
    assert sum(t["attempts"] for t in report["tasks"]) > sum(t["successes"] for t in report["tasks"])
    assert all(t["attempts"] == t["successes"] + len(t["failed_init_states"]) for t in report["tasks"])
    demos = read_demos(output).demos
    assert len(demos) == sum(t["successes"] for t in report["tasks"])
    assert all(d.dones[-1] == 1 and d.rewards[-1] == 1.0 for d in demos)
    for task in report["tasks"]:  # a demo's init state is one its task tried and did not fail from
        kept = [d.init_state for d in demos if d.task == task["task"]]
        assert not set(kept) & set(task["failed_init_states"])


@pytest.mark.slow
def test_a_recording_stopped_by_sigterm_leaves_no_scratch_folder_no_file_and_no_process(tmp_path):
    output = tmp_path / "stopped.hdf5"
    command = [sys.executable, "-m", "sfengine.demos", f"--train_dir={tmp_path}", "--env=multitask_reach"]
    # Attempts enough that the recording cannot finish before the signal: only the stop can end it.
    command += ["--demos_per_task=100000", "--demo_attempts_per_task=100000", "--num_workers=2"]
    command += [f"--demos_output={output}"]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # killed if the test fails
    deadline = time.monotonic() + 120
    # The pool records into shards in a scratch folder beside the output, each a temporary file until its job
    # ends: stop the recording once the shards are being written.
    while not list(tmp_path.glob(".demos_*/.job_*.tmp")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    assert list(tmp_path.glob(".demos_*/.job_*.tmp")), "the recording never started its shards"
    children = [
        int(pid)
        for pid in subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    ]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert "interrupted by SIGTERM; nothing written" in stderr
    assert not list(tmp_path.glob(".demos_*")) and not output.exists()
    assert children
    while [pid for pid in children if os.path.exists(f"/proc/{pid}")] and time.monotonic() < deadline:
        time.sleep(0.1)  # the pool's processes end as their parent's pipes close
    assert not [pid for pid in children if os.path.exists(f"/proc/{pid}")]


@pytest.mark.slow
def test_bad_demo_requests_are_one_line_errors(tmp_path):
    for args, words in (
        (["--env=multitask_reach", "--demos_per_task=0"], "--demos_per_task=0"),
        (["--env=CartPole-v1"], "no scripted demonstrator"),
        (["--env=multitask_reach", "--demo_tasks=9"], "task 9 does not exist"),
    ):
        result = record(tmp_path, *args)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], result.stderr
    assert not (tmp_path / "demos").exists()


@requires_libero
@pytest.mark.slow
def test_libero_object_demonstrator_picks_and_places_from_its_first_init_states(tmp_path):
    output = tmp_path / "object.hdf5"
    result = record(
        tmp_path,
        "--env=libero_object",
        "--demo_tasks=7",
        "--demos_per_task=2",
        "--demo_attempts_per_task=2",
        "--num_workers=1",
        f"--demos_output={output}",
    )
    assert result.returncode == 0, result.stderr
    assert "2 demos in 2 episodes (100% success)" in result.stdout
    demos = read_demos(output).demos
    assert [(d.task, d.init_state) for d in demos] == [(7, 0), (7, 1)]
    for demo in demos:
        assert demo.instruction == "pick up the milk and place it in the basket"
        assert len(demo) < 280 and demo.dones[-1] == 1
        assert demo.states.shape[0] == len(demo) and demo.obs["proprio"].shape == (len(demo), 39)
        assert np.all(np.abs(demo.actions) <= 1.0)
        # The gripper closed on the milk and opened again over the basket.
        assert demo.actions[:, 6].max() == 1.0 and demo.actions[-1, 6] == -1.0
