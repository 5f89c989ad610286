"""sfengine.evaluate end to end: real rollout and inference workers, real checkpoints, real files."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from itertools import product
from pathlib import Path

import gymnasium as gym
import imageio.v3 as iio
import psutil
import pytest
import torch

from helpers import (
    evaluate,
    leaked_shm,
    received_assignments,
    run_train,
    shm_entries,
    start,
    write_inference_fault_script,
    write_recording_script,
)
from sfengine.config import AUTO, parse_config
from sfengine.engine.checkpoint import load_latest_checkpoint
from sfengine.env.spaces import DEFAULT_OBS_KEY, action_spec_from_space, obs_spec_from_space
from sfengine.evaluate import relayout
from sfengine.models.actor_critic import ActorCritic
from sfengine.tasks.scheduler import Assignment
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS

ALL_PAIRS = [Assignment(t, i) for t, i in product(range(NUM_TASKS), range(NUM_INIT_STATES))]


def trained(tmp_path_factory, experiment: str, env: str, env_steps: int, *layout: str) -> Path:
    """The train_dir of a short run that left a checkpoint (any policy will do for these tests)."""
    train_dir = tmp_path_factory.mktemp(experiment) / "train_dir"
    result = run_train(
        train_dir, experiment, f"--env={env}", f"--train_for_env_steps={env_steps}", "--num_workers=1", *layout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return train_dir


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    return trained(tmp_path_factory, "toy", "multitask_toy", 4000)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    return trained(tmp_path_factory, "cp", "CartPole-v1", 20000, "--num_envs_per_worker=4")


def read_rows(eval_dir: Path) -> list[dict]:
    with open(eval_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def only_eval_dir(train_dir: Path, experiment: str) -> Path:
    (eval_dir,) = (train_dir / experiment / "eval").iterdir()
    return eval_dir


@pytest.mark.slow
def test_every_pair_runs_exactly_once_whatever_the_worker_layout(toy_run, tmp_path):
    """20 pairs on 3 workers x 4 envs x 2 splits (12 envs, so the last round leaves envs idle), then each pair 3
    times (60 episodes): per the envs' own record, each ran exactly as often as asked, none missed."""
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs, module="evaluate")
    layout = ["--num_workers=3", "--num_envs_per_worker=4", "--worker_num_splits=2", "--env=recorded_toy"]
    before = shm_entries()
    result = evaluate(f"--train_dir={toy_run}", "--experiment=toy", *layout, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert received_assignments(logs, "*.ended") == Counter(ALL_PAIRS)
    # No env started an episode it did not finish, and the table's rows are those episodes.
    assert received_assignments(logs, "*.txt") == Counter(ALL_PAIRS)
    rows = read_rows(only_eval_dir(toy_run, "toy"))
    assert Counter(Assignment(int(r["task_index"]), int(r["init_state"])) for r in rows) == Counter(ALL_PAIRS)
    assert not leaked_shm(before)

    for path in logs.iterdir():
        path.unlink()
    result = evaluate(f"--train_dir={toy_run}", "--experiment=toy", "--episodes_per_init=3", *layout, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert received_assignments(logs, "*.ended") == Counter({pair: 3 for pair in ALL_PAIRS})
    results = json.loads((only_eval_dir(toy_run, "toy") / "results.json").read_text())
    assert results["complete"] and results["overall"]["episodes"] == 60 == results["expected_episodes"]
    assert [task["episodes"] for task in results["tasks"]] == [3 * NUM_INIT_STATES] * NUM_TASKS


@pytest.mark.slow
def test_two_torchrun_ranks_split_the_pairs_and_rank_0_merges_them(toy_run, tmp_path):
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs, module="evaluate")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--env=recorded_toy", "--num_workers=1"]
    result = subprocess.run([*launcher, *args, "--report_every_sec=2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # Task i is rank i % 2's: each rank ran its shard, and together every pair exactly once.
    for rank in (0, 1):
        ended = received_assignments(logs, f"rank{rank}_*.ended")
        assert ended == Counter(pair for pair in ALL_PAIRS if pair.task % 2 == rank)
    results = json.loads((only_eval_dir(toy_run, "toy") / "results.json").read_text())
    assert results["world_size"] == 2 and results["complete"]
    assert Counter((e["task_index"], e["init_state"]) for e in results["episodes"]) == Counter(ALL_PAIRS)


@pytest.mark.slow
def test_single_task_env_runs_seeds_0_to_n_with_the_mode_reproducibly(cartpole_run):
    args = [f"--train_dir={cartpole_run}", "--experiment=cp", "--eval_episodes=5", "--num_workers=2"]
    first = evaluate(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    eval_dir = only_eval_dir(cartpole_run, "cp")
    rows = read_rows(eval_dir)
    assert sorted(int(r["init_state"]) for r in rows) == [0, 1, 2, 3, 4]
    assert {r["success"] for r in rows} == {""}  # CartPole reports no success: the column is empty
    # The mode and the seeds fix every episode: another layout gives the same returns, seed by seed, also with the
    # rollout worker acting itself (no inference process).
    second = evaluate(*args[:-1], "--num_workers=1", "--num_envs_per_worker=2", "--num_inference_workers=0")
    assert second.returncode == 0, second.stderr[-3000:]
    assert {r["init_state"]: r["return"] for r in read_rows(eval_dir)} == {r["init_state"]: r["return"] for r in rows}
    assert "mean return" in first.stdout and str(eval_dir) in first.stdout
    # The layout is the evaluation's own: what this command line gives, the rest sized afresh (8 envs per worker,
    # not the 4 the run trained with).
    assert "2 rollout workers x 8 envs" in first.stdout and "1 rollout workers x 2 envs" in second.stdout
    # And they are the episodes a user replays by hand: the checkpoint's mode, CartPole reset with seed k.
    assert {int(r["init_state"]): float(r["return"]) for r in rows} == replay_by_hand(cartpole_run, "cp", range(5))


def replay_by_hand(train_dir: Path, experiment: str, seeds) -> dict[int, float]:
    cfg = parse_config([f"--train_dir={train_dir}", f"--experiment={experiment}"])
    env = gym.make(cfg.env.env)
    model = ActorCritic(obs_spec_from_space(env.observation_space), action_spec_from_space(env.action_space), cfg.model)
    model.load_state_dict(load_latest_checkpoint(cfg.experiment_dir)["model"])
    returns = {}
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            with torch.inference_mode():
                action = model.act({DEFAULT_OBS_KEY: torch.as_tensor(obs)[None]}, deterministic=True).actions[0]
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + reward, terminated or truncated
        returns[seed] = total
    return returns


@pytest.mark.slow
def test_sampled_actions_are_evaluated_into_a_folder_of_their_own_beside_the_modes(toy_run):
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--num_workers=1"]
    mode = evaluate(*args)
    assert mode.returncode == 0, mode.stderr[-3000:]
    (mode_dir,) = (toy_run / "toy" / "eval").iterdir()
    mode_results = (mode_dir / "results.json").read_text()
    # Tested against the mode's evaluation of the same pairs (--compare_to, its folder).
    sampled = evaluate(*args, "--eval_deterministic=false", f"--compare_to={mode_dir}")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    sampled_dir = mode_dir.with_name(mode_dir.name + "_sampled")
    by_pair = [
        {
            (e["task_index"], e["init_state"]): e["success"]
            for e in json.loads((d / "results.json").read_text())["episodes"]
        }
        for d in (mode_dir, sampled_dir)
    ]
    gained = sum(now and not by_pair[0][pair] for pair, now in by_pair[1].items())
    lost = sum(by_pair[0][pair] and not now for pair, now in by_pair[1].items())
    compared = json.loads((sampled_dir / "results.json").read_text())["compared_to"]
    assert (compared["results"], compared["pairs"]) == (str(mode_dir / "results.json"), len(ALL_PAIRS))
    assert (compared["gained"], compared["lost"]) == (gained, lost)
    assert (
        f"over the same {len(ALL_PAIRS)} pairs" in sampled.stdout
        and f"({gained} gained, {lost} lost)" in sampled.stdout
    )
    assert sorted((toy_run / "toy" / "eval").iterdir()) == [mode_dir, sampled_dir]
    assert (mode_dir / "results.json").read_text() == mode_results  # the mode's figures are still there
    assert json.loads((sampled_dir / "results.json").read_text())["deterministic"] is False
    assert str(sampled_dir) in sampled.stdout
    shutil.rmtree(sampled_dir)  # the toy run is shared: the other tests expect one results folder


@pytest.mark.slow
def test_video_of_a_gymnasium_env_decodes_to_the_episode_length_at_the_asked_size(cartpole_run):
    result = evaluate(
        f"--train_dir={cartpole_run}", "--experiment=cp", "--eval_episodes=3", "--video_per_task=2", "--video_size=64"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    eval_dir = only_eval_dir(cartpole_run, "cp")
    lengths = {int(r["init_state"]): int(r["length"]) for r in read_rows(eval_dir)}
    videos = sorted((eval_dir / "videos").iterdir())
    assert [v.name.split("__")[1] for v in videos] == ["seed0", "seed1"]  # the first two episodes only
    for video in videos:
        frames = iio.imread(video)
        seed = int(video.name.split("__")[1].removeprefix("seed"))
        assert frames.shape == (lengths[seed] + 1, 64, 64, 3)  # the first observation and one frame per step


@pytest.mark.slow
def test_bad_input_exits_2_with_one_line_and_writes_nothing(toy_run, tmp_path):
    cases = {
        "no checkpoint": ([f"--train_dir={tmp_path}", "--experiment=empty"], "has no checkpoint"),
        "space mismatch": ([f"--train_dir={toy_run}", "--experiment=toy", "--env=CartPole-v1"], "does not fit"),
        "no renderer": ([f"--train_dir={toy_run}", "--experiment=toy", "--video_per_task=1"], "cannot render"),
        "missing file": ([f"--checkpoint={tmp_path / 'nope.pt'}"], "no such file"),
        "nothing to compare": ([f"--train_dir={toy_run}", "--experiment=toy", "--compare_to=nosuch"], "--compare_to"),
    }
    files_before = sorted(toy_run.rglob("*"))
    for name, (args, message) in cases.items():
        result = evaluate(*args)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        errors = [line for line in result.stderr.splitlines() if line.startswith("sfengine.evaluate: error")]
        assert len(errors) == 1 and message in errors[0], (name, result.stderr[-2000:])
    assert sorted(toy_run.rglob("*")) == files_before
    assert not (tmp_path / "empty").exists()


# A user script that evaluates with an env that passes the start's check (one reset, one step) and raises in every
# later step, as a simulator broken by the evaluation's settings would.
BREAKS_AFTER_ITS_FIRST_STEP_SCRIPT = """
import sys

import gymnasium as gym

from sfengine import register_env
from sfengine.evaluate import main
from sfengine_envs.multitask_toy import make_multitask_toy


class BreaksAfterItsFirstStep(gym.Wrapper):
    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > 1:
            raise RuntimeError("the simulator diverged")
        return self.env.step(action)


def make_broken_toy(ctx):
    return BreaksAfterItsFirstStep(make_multitask_toy(ctx))


register_env("broken_toy", make_broken_toy)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_an_evaluation_whose_env_raises_says_so_and_exits_1(toy_run, tmp_path):
    # Every episode's env is rebuilt and the episode dropped: the evaluation ended with 0 episodes and said only
    # that it did not complete, and that --resume would play the missing ones (which would fail the same way).
    script = tmp_path / "broken.py"
    script.write_text(BREAKS_AFTER_ITS_FIRST_STEP_SCRIPT)
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--env=broken_toy", "--num_workers=1"]
    result = evaluate(*args, script=script, timeout=180)
    shutil.rmtree(toy_run / "toy" / "eval")  # the toy run is shared: the other tests expect no folder of this one
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    total = NUM_TASKS * NUM_INIT_STATES
    assert f"did not complete: 0 episodes finished of {total}: the env raised in {total} of " in last, last
    assert "the first tracebacks are above" in last and "RuntimeError: the simulator diverged" in result.stderr


def test_an_evaluation_drops_the_training_runs_tasks_and_layout_but_keeps_what_its_command_gives():
    # Training's --tasks=1 would have each evaluation env build task 1's simulator at start, whatever it evaluates.
    cfg = parse_config(["--env=multitask_toy", "--tasks=1", "--num_workers=3", "--num_envs_per_worker=4"])
    relayout(cfg, given={"num_workers"})
    assert cfg.env.tasks == [] and cfg.sampler.num_workers == 3 and cfg.sampler.num_envs_per_worker == AUTO


# A user script that evaluates with an env whose rollout worker 1 never finishes its start-up, as a simulator
# deadlocked there would: in building its env (it holds no episode yet) or in the env's first reset (it has drawn one),
# every time, or only in the first process (HANG_IN=first_reset: a flaky simulator that a fresh process gets past).
STARTUP_HANG_SCRIPT = """
import os
import sys
import time

import gymnasium as gym

from sfengine import register_env
from sfengine.evaluate import main
from sfengine_envs.multitask_toy import make_multitask_toy


class HangsInReset(gym.Wrapper):
    def reset(self, **kwargs):
        if os.environ["HANG_IN"] == "reset" or not os.path.exists(os.environ["HUNG_ONCE"]):
            open(os.environ["HUNG_ONCE"], "w").close()
            time.sleep(100_000)
        return self.env.reset(**kwargs)


class SlowSteps(gym.Wrapper):
    # Worker 0 at 10 steps a second: it cannot draw every episode before worker 1, however slowly that one starts,
    # has drawn one and hung in its reset.
    def step(self, action):
        time.sleep(0.1)
        return self.env.step(action)


def make_toy_stuck_in_worker_1(ctx):
    if ctx.worker_index == 1 and os.environ["HANG_IN"] == "build":
        time.sleep(100_000)
    env = make_multitask_toy(ctx)
    if ctx.worker_index == 0 and os.environ["HANG_IN"] != "build":
        return SlowSteps(env)
    return HangsInReset(env) if ctx.worker_index == 1 else env


register_env("toy_stuck_in_worker_1", make_toy_stuck_in_worker_1)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("hang_in", ["build", "reset", "first_reset"])
@pytest.mark.slow
def test_a_worker_hung_in_its_start_up_is_respawned_or_ended_and_the_evaluation_says_what_it_cost(
    toy_run, tmp_path, monkeypatch, hang_in
):
    # An evaluation waits for every worker to finish its share: without the start-up watch it would never end.
    # Stuck building its env, worker 1 holds no episode, and the evaluation is complete once worker 0 has played
    # them all. Stuck in a reset, it holds one: it is respawned and its episode handed out again; past --max_respawns
    # it is ended, and the evaluation ends with what it has, exit code 1.
    shm_before = shm_entries()
    script = tmp_path / "stuck.py"
    script.write_text(STARTUP_HANG_SCRIPT)
    monkeypatch.setenv("HANG_IN", hang_in)
    monkeypatch.setenv("HUNG_ONCE", str(tmp_path / "hung_once"))
    # Past --max_respawns (0 here: a respawned one would find the episodes all played) the hung worker is ended.
    # The timeout leaves a healthy worker's start-up room on a loaded machine (2 cores, the suite beside it).
    respawns = 0 if hang_in == "reset" else 1
    args = ["--env=toy_stuck_in_worker_1", "--num_workers=2", "--startup_timeout_sec=10", f"--max_respawns={respawns}"]
    result = evaluate(f"--train_dir={toy_run}", "--experiment=toy", *args, script=script, timeout=180)
    results = json.loads((only_eval_dir(toy_run, "toy") / "results.json").read_text())
    played = results["overall"]["episodes"]
    assert results["complete"] == (hang_in != "reset")
    if hang_in == "build":
        assert result.returncode == 0, result.stderr[-3000:]
        assert "rollout_worker_1 still in its start-up when every episode had been played; ending it" in result.stderr
    elif hang_in == "first_reset":
        assert result.returncode == 0, result.stderr[-3000:]
        assert "in its start-up after" in result.stderr and "respawning it (--startup_timeout_sec)" in result.stderr
        assert "rollout_worker_1: 1 episodes handed out again" in result.stderr
        pairs = Counter(Assignment(row["task_index"], row["init_state"]) for row in results["episodes"])
        assert pairs == Counter(ALL_PAIRS)  # the one it held was played by another process, once
    else:
        assert result.returncode == 1, result.stderr[-3000:]
        assert "respawning is off (--max_respawns=0); ending the evaluation" in result.stderr
        error = next(line for line in result.stderr.splitlines() if "did not complete" in line)
        assert "hung: rollout_worker_1 is still in its start-up after" in error, error
        assert "(--startup_timeout_sec); the same command with --resume plays only the missing" in error, error
        assert "in reset" in result.stderr  # the hung worker's own stack
        assert "did not stop within" not in result.stderr  # ended at once, not after the stop's minute
    # The episode held by a worker ended as hung is missing (and what was still to play); one held by a worker
    # respawned was played.
    if hang_in == "reset":
        assert 0 < played < NUM_TASKS * NUM_INIT_STATES
    else:
        assert played == NUM_TASKS * NUM_INIT_STATES
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_an_inference_worker_hung_with_requests_in_hand_is_replaced_and_the_evaluation_completes(tmp_path):
    # One rollout worker, one split: the request the hung inference worker held is all it waits on; its successor
    # must be asked again, or the evaluation never ends.
    train_script, eval_script = tmp_path / "train_hangs_once.py", tmp_path / "evaluate_hangs_once.py"
    trained_marker, marker = tmp_path / "not_while_training", tmp_path / "hung_once"
    trained_marker.touch()
    write_inference_fault_script(train_script, trained_marker)
    write_inference_fault_script(eval_script, marker, module="evaluate")
    train_dir, model = tmp_path / "train_dir", "--model=faults_once"
    command = [sys.executable, str(train_script), f"--train_dir={train_dir}", "--experiment=hangs", model]
    trained = subprocess.run(
        [*command, "--env=CartPole-v1", "--train_for_env_steps=4096", "--num_workers=1"], capture_output=True, text=True
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    layout = ["--num_workers=1", "--worker_num_splits=1", "--num_envs_per_worker=4", "--eval_episodes=12"]
    args = [f"--train_dir={train_dir}", "--experiment=hangs", *layout, "--hang_timeout_sec=3"]
    result = evaluate(*args, script=eval_script, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists() and "inference_worker_0 sent no report for" in result.stderr
    assert "workers respawned during the evaluation: inference_worker_0 1x" in result.stderr
    results = json.loads((only_eval_dir(train_dir, "hangs") / "results.json").read_text())
    assert results["complete"] and sorted(row["init_state"] for row in results["episodes"]) == list(range(12))


@pytest.mark.slow
def test_workers_killed_during_an_evaluation_are_respawned_and_every_episode_counts_once(toy_run, tmp_path):
    # A rollout or inference worker SIGKILLed every second (a simulator's segfault, the OOM killer): each is
    # respawned, the episodes a dead rollout worker held are played again, and the results hold each exactly once.
    shm_before = shm_entries()
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs, module="evaluate")
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--env=recorded_toy", "--episodes_per_init=10"]
    args += ["--num_workers=2", "--num_envs_per_worker=4", "--chaos_kill_every_sec=1", "--report_every_sec=0.5"]
    slowed = {**os.environ, "RECORDED_STEP_SEC": "0.01"}
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=slowed
    )
    assert result.returncode == 0, result.stderr[-3000:]
    kills = result.stderr.count("chaos: SIGKILL to rollout_worker_")
    assert kills >= 2 and "episodes handed out again" in result.stderr, result.stderr[-3000:]
    every = Counter({pair: 10 for pair in ALL_PAIRS})
    results = json.loads((only_eval_dir(toy_run, "toy") / "results.json").read_text())
    assert results["complete"] and results["overall"]["episodes"] == 200
    assert Counter(Assignment(row["task_index"], row["init_state"]) for row in results["episodes"]) == every
    replayed = received_assignments(logs, "*.ended") - every
    assert sum(replayed.values()) >= 1  # killed ones were played to the end again (some reported just before)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert leaked_shm(shm_before) == set()


@pytest.mark.parametrize("cut_by", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
@pytest.mark.slow
def test_an_evaluation_cut_short_is_resumed_playing_only_the_episodes_it_lacks(toy_run, tmp_path, cut_by):
    # Ctrl-C: the evaluation stops and writes what it played. SIGKILL (a node lost, a scheduler's hard limit): it
    # writes nothing more, and what a resume finds is the results.json rewritten at each progress line.
    shm_before = shm_entries()
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs, module="evaluate")
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--env=recorded_toy", "--episodes_per_init=10"]
    args += ["--num_workers=1", "--num_envs_per_worker=4"]
    every = Counter({pair: 10 for pair in ALL_PAIRS})
    # 200 episodes of a slowed toy: Ctrl-C once the progress line shows some played.
    slowed = {**os.environ, "RECORDED_STEP_SEC": "0.005"}
    command = [sys.executable, str(script), "--report_every_sec=0.5", *args]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=slowed)
    for line in process.stdout:
        played = re.search(r"episodes (\d+)/200", line)
        if played and 0 < int(played[1]) < 150:
            process.send_signal(cut_by)
            break
    output = line + process.communicate(timeout=120)[0]
    results_path = only_eval_dir(toy_run, "toy") / "results.json"
    partial = json.loads(results_path.read_text())
    kept = Counter(Assignment(row["task_index"], row["init_state"]) for row in partial["episodes"])
    assert not partial["complete"] and 0 < sum(kept.values()) < 200
    if cut_by == signal.SIGINT:
        assert process.returncode == 1, output[-3000:]
        assert "the same command with --resume plays only the missing episodes" in output
    else:
        assert process.returncode == -signal.SIGKILL
        assert sum(kept.values()) >= int(played[1])  # written before that progress line was printed
        # Its workers end with it (they watch their parent), and leave nothing in /dev/shm.
        deadline = time.time() + 30
        while [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]:
            assert time.time() < deadline, "the killed evaluation's workers outlived it"
            time.sleep(0.5)
        assert leaked_shm(shm_before) == set()

    shutil.rmtree(logs)
    logs.mkdir()
    result = evaluate(*args, "--resume=true", script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming: {sum(kept.values())} episodes kept" in result.stdout
    assert received_assignments(logs, "*.ended") == every - kept  # the missing ones, each once
    merged = json.loads(results_path.read_text())
    assert merged["complete"] and merged["overall"]["episodes"] == 200 == merged["expected_episodes"]
    assert Counter(Assignment(row["task_index"], row["init_state"]) for row in merged["episodes"]) == every
    assert merged["wall_sec"] > partial["wall_sec"]  # both runs' time
    if cut_by == signal.SIGKILL:
        return  # what follows does not depend on how the first evaluation was cut: checked once

    result = evaluate(*args, "--resume=true", script=script)
    assert result.returncode == 0 and "is complete (200 episodes): nothing to do" in result.stdout, result.stderr
    # What cannot be resumed: other settings, or episodes this command does not ask for; one line, exit 2.
    results_path.write_text(json.dumps({**merged, "complete": False}))
    for extra, message in [
        (["--episodes_per_init=3"], "was made with episodes_per_init=10, this command asks for 3"),
        (["--eval_tasks=0"], "holds 150 episode(s) this command does not ask for (task 1, init state 0)"),
    ]:
        result = evaluate(*args, *extra, "--resume=true", script=script)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith("sfengine.evaluate: error: --resume: ")
        assert message in result.stderr, result.stderr[-2000:]

    # An evaluation started over, with other settings, killed before its first progress line: the folder is its
    # own from its start, so its resume does not trip over the results of the one before.
    process = start([*command, "--episodes_per_init=3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=slowed)
    for line in process.stdout:
        if "results:" in line:
            process.kill()
            break
    process.communicate(timeout=60)
    started_over = json.loads(results_path.read_text())
    assert started_over["episodes_per_init"] == 3 and not started_over["complete"]
    result = evaluate(*args, "--episodes_per_init=3", "--resume=true", script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming: {len(started_over['episodes'])} episodes kept" in result.stdout
    assert json.loads(results_path.read_text())["overall"]["episodes"] == 60


@pytest.mark.slow
def test_a_torchrun_evaluation_killed_outright_is_resumed_from_every_ranks_progress(toy_run, tmp_path):
    # A lost node or a scheduler's hard limit kills every rank at once. Each left what it had played: rank 0 in
    # results.json, rank 1 in its progress file. A resume, here on one rank, plays only the rest.
    shm_before = shm_entries()
    process, script, logs, args = torchrun_evaluation_under_way(toy_run, tmp_path)
    eval_dir = toy_run / "toy" / "eval"
    deadline = time.time() + 60
    while not [p for p in eval_dir.glob("*/progress.rank1.*.json") if json.loads(p.read_text())["episodes"]]:
        assert time.time() < deadline and process.poll() is None, "rank 1 wrote no progress"
        time.sleep(0.2)
    # torchrun starts each rank in a session of its own: kill the whole tree at once, as a scheduler does.
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for member in tree:
        member.kill()
    process.communicate(timeout=60)
    deadline = time.time() + 30
    while [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]:
        assert time.time() < deadline, "the killed evaluation's workers outlived it"
        time.sleep(0.5)
    results_path = only_eval_dir(toy_run, "toy") / "results.json"
    partial = json.loads(results_path.read_text())
    progress = list(results_path.parent.glob("progress.rank*.json"))
    assert not partial["complete"] and partial["world_size"] == 2 and len(progress) == 1
    rows = partial["episodes"] + json.loads(progress[0].read_text())["episodes"]
    kept = Counter(Assignment(row["task_index"], row["init_state"]) for row in rows)
    assert {pair.task % 2 for pair in kept} == {0, 1} and sum(kept.values()) < 200  # both ranks' episodes

    shutil.rmtree(logs)
    logs.mkdir()
    result = evaluate(*args, "--resume=true", script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming: {sum(kept.values())} episodes kept" in result.stdout
    every = Counter({pair: 10 for pair in ALL_PAIRS})
    assert received_assignments(logs, "*.ended") == every - kept  # the missing ones of both ranks, each once
    merged = json.loads(results_path.read_text())
    assert (
        merged["complete"]
        and Counter(Assignment(r["task_index"], r["init_state"]) for r in merged["episodes"]) == every
    )
    assert not list(results_path.parent.glob("progress.rank*.json"))  # merged, so removed
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_ranks_whose_torchrun_was_killed_alone_finish_and_write_every_episode(toy_run, tmp_path):
    # torchrun starts each rank in a session of its own, so a SIGKILL of torchrun alone leaves them running: they
    # joined their group at the start, so they still reach each other, gather, and end with complete results.
    process, script, logs, args = torchrun_evaluation_under_way(toy_run, tmp_path)
    ranks = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    output = process.communicate(timeout=120)[0]  # the ranks hold the pipe until they end
    assert not psutil.wait_procs(ranks, timeout=60)[1]  # the pipe closes a moment before the last of them ends
    results = json.loads((only_eval_dir(toy_run, "toy") / "results.json").read_text())
    assert results["complete"] and results["world_size"] == 2, output[-3000:]
    every = Counter({pair: 10 for pair in ALL_PAIRS})
    assert Counter(Assignment(r["task_index"], r["init_state"]) for r in results["episodes"]) == every


def torchrun_evaluation_under_way(toy_run: Path, tmp_path: Path):
    """Two torchrun ranks evaluating 200 episodes of a slowed toy, once rank 0 has played some of its 100: the
    launcher's process, the script, the envs' log folder and the evaluation's arguments."""
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs, module="evaluate")
    args = [f"--train_dir={toy_run}", "--experiment=toy", "--env=recorded_toy", "--episodes_per_init=10"]
    args += ["--num_workers=1", "--num_envs_per_worker=4", "--report_every_sec=0.5"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    slowed = {**os.environ, "RECORDED_STEP_SEC": "0.005"}
    process = start([*launcher, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=slowed)
    for line in process.stdout:  # rank 0's progress line
        played = re.search(r"episodes (\d+)/100", line)
        if played and 0 < int(played[1]) < 60:
            return process, script, logs, args
    raise AssertionError(f"the evaluation ended before rank 0 reported progress (exit {process.wait()})")
