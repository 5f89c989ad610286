"""Critic-free group advantages through the real engine: 3 rollout worker processes x 2 splits, G = 4, on
``multitask_reach`` (its observation is the point and the goal, so a step tells its task; the start of an episode
tells its init state). A user script wraps the trainer to record every training batch it receives."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import read_summary, run_train, train_command
from sfengine.reporting.events import read_scalars
from sfengine_envs.sparse_reach import REACH_INIT_STATES, REACH_TASKS, START_RADIUS

GROUP_SIZE = 4
RECORDING_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from sfengine.algorithms.ppo import trainer as ppo_trainer
    from sfengine.train import main

    real = ppo_trainer.PPOTrainer._train_on_groups


    def recording(self, batch):
        n, size = batch.num_steps, batch.outcomes.shape[1]
        record = {{
            "obs": batch.obs["obs"][:n].tolist(),
            "episodes": batch.episodes[:n].tolist(),
            "groups": batch.groups[: batch.num_groups].tolist(),
            "outcomes": batch.outcomes[: batch.num_groups].tolist(),
            "env_steps": batch.env_steps,
            "dropped": batch.dropped_groups,
        }}
        with open({log!r}, "a") as f:
            f.write(json.dumps(record) + "\\n")
        return real(self, batch)


    # Top level: spawned processes import this module too, so the learner process records as well.
    ppo_trainer.PPOTrainer._train_on_groups = recording

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def run_recorded(
    tmp_path: Path, train_dir: Path, *args: str, env: str = "multitask_reach"
) -> tuple[list[dict], subprocess.CompletedProcess]:
    log = tmp_path / "batches.jsonl"
    script = tmp_path / "record_batches.py"
    script.write_text(RECORDING_SCRIPT.format(log=str(log)))
    command = train_command(train_dir, "groups", f"--env={env}", "--advantage=rloo", *args)
    command[1:3] = [str(script)]  # the script instead of -m sfengine.train
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()], result


LAYOUT = [
    "--num_workers=3",
    "--num_envs_per_worker=4",
    "--worker_num_splits=2",
    f"--task_group_size={GROUP_SIZE}",
    "--rollout=16",  # episodes (up to 40 steps) span several trajectories and end inside them
    "--batch_size=160",
    "--num_batches_per_epoch=2",
    "--train_for_env_steps=12000",
]


def assignment_of(first_obs: list[float]) -> tuple[int, int]:
    """(task, init state) of an episode from its first observation (point, goal)."""
    x, y, goal_x, goal_y = first_obs
    task = round(np.arctan2(goal_y, goal_x) / (2 * np.pi) * REACH_TASKS) % REACH_TASKS
    init_state = round(np.arctan2(y, x) / (2 * np.pi) * REACH_INIT_STATES) % REACH_INIT_STATES
    assert np.hypot(x, y) == pytest.approx(START_RADIUS, abs=1e-6)  # really the first step of its episode
    return task, init_state


def check_whole_groups(batches: list[dict]) -> list[int]:
    """Every batch holds whole groups of G complete episodes of one (task, init state); return the groups."""
    trained = []
    for batch in batches:
        obs, episodes = np.array(batch["obs"]), np.array(batch["episodes"])
        for j, group in enumerate(batch["groups"]):
            assignments = set()
            for member in range(GROUP_SIZE):
                steps = obs[episodes == j * GROUP_SIZE + member]
                assert len(steps) >= 1, f"group {group} lacks member {member}"
                assignments.add(assignment_of(steps[0]))  # steps arrive in the episode's order
                assert len(steps) <= 40  # one episode: at most the step limit
            assert len(assignments) == 1, f"group {group} mixes {assignments}"
            trained.append(group)
        assert sum(episodes < len(batch["groups"]) * GROUP_SIZE) == len(episodes)
    return trained


@pytest.mark.slow
def test_batches_are_whole_groups_of_one_assignment_none_split_or_lost(tmp_path, train_dir):
    batches, _ = run_recorded(tmp_path, train_dir, *LAYOUT)
    assert len(batches) >= 3
    trained = check_whole_groups(batches)
    assert len(trained) == len(set(trained)), "a group reached two batches"
    # None lost: at the stop, only groups still being played (at most one per env) may be missing.
    missing = set(range(max(trained))) - set(trained)
    assert len(missing) <= 12, sorted(missing)
    # Env steps counted are the steps trained (nothing was dropped without --dynamic_sampling).
    assert all(batch["env_steps"] == len(batch["obs"]) and not batch["dropped"] for batch in batches)
    summary = read_summary(train_dir, "groups")
    assert summary["env_steps"] == sum(batch["env_steps"] for batch in batches)


@pytest.mark.slow
def test_dynamic_sampling_drops_uniform_groups_and_counts_them(tmp_path, train_dir):
    # The untrained policy's groups of 4 come out uniform (all four fail or all succeed) about one time in five: a run
    # drops 10-19 groups against 52-56 trained. A learning rate of 1e-9 keeps the policy as it starts for the whole
    # run, so that share does not depend on how far it learned by the time each batch was gathered.
    args = [*LAYOUT, "--group_outcome=success", "--dynamic_sampling=true", "--learning_rate=1e-9"]
    batches, result = run_recorded(tmp_path, train_dir, *args)
    check_whole_groups(batches)
    for batch in batches:
        for outcomes in batch["outcomes"]:
            assert len(set(outcomes)) > 1, outcomes  # no uniform group is trained on
    dropped = sum(batch["dropped"].get("uniform", 0) for batch in batches)
    assert dropped >= 3, dropped
    # The dropped groups' steps still count as env steps: 4 episodes of 1 to 40 steps each per dropped group.
    dropped_steps = sum(batch["env_steps"] - len(batch["obs"]) for batch in batches)
    assert GROUP_SIZE * dropped <= dropped_steps <= GROUP_SIZE * 40 * dropped, (dropped_steps, dropped)
    assert "groups dropped" in result.stdout


@pytest.mark.slow
def test_when_every_group_is_uniform_the_run_still_counts_its_steps_and_stops_on_time(train_dir):
    # Two-step episodes cannot reach the goal (0.4 away, 0.1 a step): every group fails all its episodes and
    # --dynamic_sampling drops them all. Empty batches carry their env steps to the learner, so the run stops at
    # its budget instead of sampling on forever.
    args = [*LAYOUT[:-1], "--group_outcome=success", "--dynamic_sampling=true", "--max_episode_steps=2"]
    result = run_train(
        train_dir,
        "uniform",
        "--env=multitask_reach",
        "--advantage=rloo",
        *args,
        "--train_for_env_steps=6000",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "uniform")
    assert 6000 <= summary["env_steps"] <= 6000 + 320 + 12 * 2 * GROUP_SIZE, summary  # within a batch of the budget
    assert summary["policy_version"] == 0  # nothing to train on, so no update
    dropped = [point.value for point in read_scalars(train_dir / "uniform")["train/groups_dropped_fraction"]]
    assert dropped and all(value == 1.0 for value in dropped)


@pytest.mark.slow
def test_a_single_task_env_groups_episodes_that_start_from_the_same_seed(tmp_path, train_dir):
    # CartPole has no tasks: the G episodes of a group reset with one seed, so they start in the same state.
    args = [f"--task_group_size={GROUP_SIZE}", "--train_for_env_steps=6000"]
    batches, _ = run_recorded(tmp_path, train_dir, *args, env="CartPole-v1")
    assert json.loads((train_dir / "groups" / "config.json").read_text())["env"]["env"] == "CartPole-v1"
    starts = []
    for batch in batches:
        obs, episodes = np.array(batch["obs"]), np.array(batch["episodes"])
        for j in range(len(batch["groups"])):
            first = {tuple(obs[episodes == j * GROUP_SIZE + member][0]) for member in range(GROUP_SIZE)}
            assert len(first) == 1, first  # every member starts where the others do
            starts.append(first.pop())
    assert len(starts) >= 4 and len(set(starts)) == len(starts)  # and each group somewhere else
