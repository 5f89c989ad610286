"""One assignment sequence per rank, shared by every rollout worker and split, checked from what the envs
actually received through the real engine (multi-process rollout workers on a fast multi-task env)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import read_summary, received_assignments, train_command, write_recording_script
from sfengine.checkpoint import load_latest_checkpoint
from sfengine.scheduler import TaskSchedule, shard_pairs
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS


def handed_out(start: int, count: int, group_size: int) -> Counter:
    schedule = TaskSchedule(shard_pairs([NUM_INIT_STATES] * NUM_TASKS, 0, 1), group_size)
    return Counter(schedule.at(p) for p in range(start, start + count))


@pytest.mark.parametrize("group_size", [1, 3])
def test_all_workers_and_splits_draw_from_one_exact_sequence_that_resumes(tmp_path, train_dir, group_size):
    script = tmp_path / "recorded.py"
    first_logs, second_logs = tmp_path / "first", tmp_path / "second"
    args = ["--env=recorded_toy", "--num_workers=3", "--num_envs_per_worker=4", "--worker_num_splits=2"]
    args += ["--batch_size=512", "--num_batches_per_epoch=1", f"--task_group_size={group_size}"]

    def train(log_dir: Path, env_steps: int) -> None:
        write_recording_script(script, log_dir)
        command = [sys.executable, str(script), *train_command(train_dir, "seq", *args)[3:]]
        result = subprocess.run(
            [*command, f"--train_for_env_steps={env_steps}"], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]

    train(first_logs, 12_000)
    first = received_assignments(first_logs)
    count = sum(first.values())
    assert count > 3 * NUM_TASKS * NUM_INIT_STATES * group_size  # several cycles, over 12 envs in 3 processes
    # Exactly the first `count` positions of the rank's sequence: no pair twice too often, none skipped.
    assert first == handed_out(0, count, group_size)

    # The final checkpoint is saved while the workers stop: envs may still draw a few positions after it.
    position = load_latest_checkpoint(train_dir / "seq")["task_sequence"]["ranks"][0]["position"]
    assert count - 12 <= position <= count
    train(second_logs, 24_000)  # resumes from the checkpoint
    second = received_assignments(second_logs)
    assert second == handed_out(position, sum(second.values()), group_size)
    assert read_summary(train_dir, "seq")["env_steps"] >= 24_000


def test_curriculum_through_the_workers_keeps_each_tasks_init_states_cycling(tmp_path, train_dir):
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs)
    args = ["--env=recorded_toy", "--num_workers=2", "--num_envs_per_worker=4", "--task_sampling=curriculum"]
    args += ["--batch_size=512", "--num_batches_per_epoch=1", "--train_for_env_steps=8000"]
    command = [sys.executable, str(script), *train_command(train_dir, "curriculum", *args)[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = received_assignments(logs)
    for task in range(NUM_TASKS):
        states = Counter({a.init_state: n for a, n in seen.items() if a.task == task})
        draws = sum(states.values())
        assert draws > 0
        # The task's k draws went to init states 0, 1, ..., 4, 0, 1, ...: its first k positions, whatever order
        # the envs reset in.
        assert states == Counter(s % NUM_INIT_STATES for s in range(draws))
