"""One assignment sequence per rank, shared by every rollout worker and split, checked from what the envs
actually received through the real engine (multi-process rollout workers on a fast multi-task env)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from helpers import read_summary, received_assignments, train_command, write_recording_script
from sfengine.engine.checkpoint import load_latest_checkpoint
from sfengine.tasks.scheduler import TaskSchedule, shard_pairs
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS

# A user script beside the recording script of helpers.py (``recorded.py``, imported from the same directory): its
# env records assignments like ``recorded_toy``, but task 0's episodes always fail and every other task's succeed.
TASK_0_FAILS_SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym

    from recorded import make_recorded_toy
    from sfengine import register_env
    from sfengine.train import main


    class TaskZeroAlwaysFails(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if "success" in info:
                info = {**info, "success": self.env.unwrapped.task != 0}
            return obs, reward, terminated, truncated, info


    def make_task_0_fails_toy(ctx):
        return TaskZeroAlwaysFails(make_recorded_toy(ctx))


    register_env("task_0_fails_toy", make_task_0_fails_toy)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def handed_out(start: int, count: int, group_size: int) -> Counter:
    schedule = TaskSchedule(shard_pairs([NUM_INIT_STATES] * NUM_TASKS, 0, 1), group_size)
    return Counter(schedule.at(p) for p in range(start, start + count))


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.slow
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


@pytest.mark.slow
def test_curriculum_through_the_workers_favours_the_failing_task_and_keeps_each_tasks_init_states_cycling(
    tmp_path, train_dir
):
    script, logs = tmp_path / "task_0_fails.py", tmp_path / "logs"
    write_recording_script(tmp_path / "recorded.py", logs)
    script.write_text(TASK_0_FAILS_SCRIPT)
    args = ["--env=task_0_fails_toy", "--num_workers=2", "--num_envs_per_worker=4", "--task_sampling=curriculum"]
    args += ["--batch_size=512", "--num_batches_per_epoch=1", "--train_for_env_steps=8000"]
    command = [sys.executable, str(script), *train_command(train_dir, "curriculum", *args)[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = received_assignments(logs)
    resets = Counter(assignment.task for assignment in seen.elements())
    # The workers report every episode's outcome to the rank's sequence: once task 0's window is full of failures
    # its weight is 21 against 1 for each other task, so it gets most resets (a quarter if no outcome arrived).
    assert resets[0] > 0.6 * sum(resets.values())
    for task in range(NUM_TASKS):
        states = Counter({a.init_state: n for a, n in seen.items() if a.task == task})
        draws = sum(states.values())
        assert draws > 0  # a task that succeeds is still visited
        # The task's k draws went to init states 0, 1, ..., 4, 0, 1, ...: its first k positions, whatever order
        # the envs reset in.
        assert states == Counter(s % NUM_INIT_STATES for s in range(draws))


@pytest.mark.slow
def test_tasks_option_trains_on_the_chosen_tasks_only_with_every_init_state_cycling(tmp_path, train_dir):
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs)
    args = ["--env=recorded_toy", "--num_workers=2", "--num_envs_per_worker=4", "--tasks=1,3"]
    args += ["--batch_size=512", "--num_batches_per_epoch=1", "--train_for_env_steps=4000"]
    command = [sys.executable, str(script), *train_command(train_dir, "some_tasks", *args)[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = received_assignments(logs)
    # The sequence of a two-task env: tasks 1 and 3 in turn, each cycling through its init states.
    expected = TaskSchedule(shard_pairs([0, NUM_INIT_STATES, 0, NUM_INIT_STATES], 0, 1))
    assert seen == Counter(expected.at(p) for p in range(sum(seen.values())))
    assert {a.task for a in seen} == {1, 3}

    bad = subprocess.run([*command[:-1], "--tasks=1,7"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--tasks: the env has tasks 0..3, not [7]" in bad.stderr
