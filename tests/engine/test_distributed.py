"""Two ranks under torchrun on CPU (gloo): a real multi-rank run of the engine, each rank with its own rollout
workers, inference worker and learner."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest
import torch

from helpers import (
    leaked_shm,
    read_summary,
    received_assignments,
    shm_entries,
    train_command,
    write_recording_script,
)
from sfengine.engine.checkpoint import load_latest_checkpoint
from sfengine.engine.distributed import RankInfo, rank_device
from sfengine.tasks.scheduler import TaskSchedule, shard_pairs
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS


def torchrun(script, train_dir, experiment: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """2 ranks of ``script`` (a file that runs sfengine.train's main; None: the module itself)."""
    program = ["-m", "sfengine.train"] if script is None else [str(script)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *program]
    return subprocess.run(
        [*launcher, *train_command(train_dir, experiment, *args)[3:]], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_two_ranks_train_in_lockstep_each_on_its_own_shard_of_tasks(tmp_path, train_dir):
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs)
    args = ["--env=recorded_toy", "--num_workers=1", "--num_envs_per_worker=4", "--worker_num_splits=2"]
    args += ["--batch_size=256", "--num_batches_per_epoch=1", "--train_for_env_steps=16000"]
    result = torchrun(script, train_dir, "ranks", *args)
    assert result.returncode == 0, result.stderr[-4000:]

    summary = read_summary(train_dir, "ranks")
    assert summary["world_size"] == 2 and summary["env_steps"] >= 16000
    # Both ranks contributed equally (the learners take one batch from each rank per step).
    assert summary["rank_env_steps"][0] == summary["rank_env_steps"][1] > 0
    assert sum(summary["rank_env_steps"]) == summary["env_steps"]
    # Every exchange, the last one after the final update included, found the same weights on both ranks.
    assert summary["ranks_in_sync"] is True
    # Rank 0 reports the episodes of both ranks: success rates of all 4 tasks, two of which only rank 1 plays.
    assert set(summary["per_task_success"]) == {f"toy_task_{t}" for t in range(NUM_TASKS)}

    # Task i goes to rank i % 2, and each rank's envs received exactly the start of its shard's sequence.
    for rank, tasks in ((0, {0, 2}), (1, {1, 3})):
        seen = received_assignments(logs, f"rank{rank}_*.txt")
        assert {assignment.task for assignment in seen} == tasks
        schedule = TaskSchedule(shard_pairs([NUM_INIT_STATES] * NUM_TASKS, rank, 2))
        count = sum(seen.values())
        assert count >= 2 * schedule.cycle_length
        assert seen == Counter(schedule.at(p) for p in range(count))

    checkpoint = load_latest_checkpoint(train_dir / "ranks")
    assert len(checkpoint["task_sequence"]["ranks"]) == 2  # one sequence per rank, both saved
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())


@pytest.mark.slow
def test_off_policy_ranks_take_the_same_gradient_steps_when_their_env_steps_differ(train_dir):
    # Episodes of sparse_reach end inside chunks of 3 actions, so the ranks sample different env steps a batch;
    # each gradient step all-reduces, so each rank must still take as many as the other (else both wait forever).
    args = ["--algo=sac", "--env=sparse_reach", "--action_chunk=3", "--num_workers=1", "--num_envs_per_worker=2"]
    args += ["--rollout=16", "--batch_size=64", "--hidden_sizes=32,32", "--critic_hidden_sizes=32,32"]
    args += ["--learning_starts=500", "--train_for_env_steps=3000", "--hang_timeout_sec=30", "--replay_ratio=0.25"]
    result = torchrun(None, train_dir, "offpolicy_ranks", *args)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = read_summary(train_dir, "offpolicy_ranks")
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    assert summary["env_steps"] >= 3000 and min(summary["rank_env_steps"]) > 1000
    checkpoint = load_latest_checkpoint(train_dir / "offpolicy_ranks")
    trainer = checkpoint["sac"]  # the algorithm's state
    # Each rank took a quarter of a gradient step per env step of its own (the ranks' mean), counted over the run.
    assert trainer["env_steps_seen"] == summary["env_steps"]
    learned_from = trainer["env_steps_seen"] - trainer["learning_from"]
    assert abs(trainer["critic_steps"] - 0.25 * learned_from / 2) <= 1


DYING_RANK_SCRIPT = """
import os
import sys

import gymnasium as gym

from sfengine import register_env
from sfengine.train import main


class DiesOnRankOne(gym.Wrapper):
    # On rank 1, the rollout worker process dies outright after 300 steps of this env, as a segfault would.

    steps = 0

    def step(self, action):
        DiesOnRankOne.steps += 1
        if os.environ.get("RANK") == "1" and DiesOnRankOne.steps == 300:
            os._exit(3)
        return self.env.step(action)


def make_mortal_cartpole(ctx):
    return DiesOnRankOne(gym.make("CartPole-v1"))


register_env("mortal_cartpole", make_mortal_cartpole)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_rank_that_fails_takes_the_whole_job_down_with_a_clear_message(tmp_path, train_dir):
    script = tmp_path / "mortal.py"
    script.write_text(DYING_RANK_SCRIPT)
    args = ["--env=mortal_cartpole", "--num_workers=1", "--num_envs_per_worker=2", "--worker_num_splits=2"]
    # No respawn: the worker would die again after 300 steps each time, until --max_respawns stopped the rank.
    args += ["--batch_size=256", "--num_batches_per_epoch=1", "--train_for_env_steps=100000000", "--max_respawns=0"]
    started, shm_before = time.time(), shm_entries()
    result = torchrun(script, train_dir, "dies", *args, timeout=400)
    assert result.returncode != 0
    assert time.time() - started < 300  # ended, not hung
    assert "[rank 1]" in result.stderr and "a component process died: rollout_worker_0" in result.stderr
    # The surviving rank's learner loses its peer in the exchange; its runner sees that and ends the rank itself,
    # though torchrun's SIGTERM asked it to wait for an agreed stop: torchrun need not SIGKILL it.
    assert "[rank 0] a component process died: learner_process" in result.stderr
    assert "SIGKILL" not in result.stderr, result.stderr[-3000:]
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    # torchrun kills the surviving rank's process tree: nothing of either rank may stay in /dev/shm.
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_ranks_whose_torchrun_is_killed_alone_save_and_stop(tmp_path, train_dir):
    # SIGKILL (or the OOM killer) reaches torchrun's agent only: its ranks must not train on without it for the
    # rest of the run, holding the machine, but stop as after a SIGTERM, each saying why, with a checkpoint.
    args = ["--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=4", "--train_for_env_steps=100000000"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    shm_before, output = shm_entries(), tmp_path / "output.txt"
    with output.open("w") as out:
        agent = subprocess.Popen([*launcher, *train_command(train_dir, "orphans", *args)[2:]], stdout=out, stderr=out)
    ranks: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while "learner: ppo" not in output.read_text() and agent.poll() is None and time.time() < deadline:
            time.sleep(0.5)  # a status line with the learner's statistics: it has trained
        ranks = psutil.Process(agent.pid).children()
        assert len(ranks) == 2 and "learner: ppo" in output.read_text(), output.read_text()[-3000:]
        agent.kill()
        agent.wait()
        _, alive = psutil.wait_procs(ranks, timeout=90)  # no longer this test's children: their exit codes are lost
        assert not alive, output.read_text()[-3000:]
    finally:
        for process in [*ranks, *psutil.Process().children(recursive=True)]:
            if process.is_running():
                process.kill()
    text = output.read_text()
    for rank in (0, 1):
        assert f"[rank {rank}] stopping: torchrun (pid {agent.pid}) exited" in text
    summary = read_summary(train_dir, "orphans")
    assert summary["stop_reason"] == f"torchrun (pid {agent.pid}) exited" and summary["exit_code"] == 0
    assert summary["ranks_in_sync"] is True
    assert load_latest_checkpoint(train_dir / "orphans")["env_steps"] == summary["env_steps"]
    assert leaked_shm(shm_before) == set()


def test_the_ranks_on_a_machine_spread_over_its_gpus(monkeypatch):
    # nccl refuses two ranks on one GPU: torchrun's 8 ranks on two machines of 4 GPUs take GPUs 0-3 on each. (The
    # GPU count is the one thing faked here; a CUDA device object needs no GPU.)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    ranks = [RankInfo(rank, 8, 4, rank % 4) for rank in range(8)]
    assert [rank_device("cuda", info) for info in ranks] == [torch.device("cuda", i % 4) for i in range(8)]
    assert rank_device("cpu", ranks[3]) == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert rank_device("cuda") == torch.device("cuda", 2)  # from torchrun's environment
