"""A real run, as a user drives it: stop with SIGINT, resume, bad checkpoints, TensorBoard, custom envs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import psutil
import pytest
import torch

from helpers import (
    FAST,
    assert_nothing_left,
    component_processes,
    leaked_shm,
    read_summary,
    run_train,
    shm_entries,
    start,
    start_long_training,
    start_script,
    train_command,
    wait_for_training,
)
from sfengine.config import parse_config
from sfengine.env.spaces import action_spec_from_space, obs_spec_from_space
from sfengine.train import build_model


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_leaves_no_process_or_shared_memory(train_dir):
    shm_before = shm_entries()
    # A non-default model width: a resume that ignored the saved config.json would build another model and fail.
    process = start_long_training(train_dir, "interrupted", "--hidden_sizes=32")
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) >= 4  # 2 rollout workers, 1 inference worker, 1 learner
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()
    checkpoints = list((train_dir / "interrupted" / "checkpoints").glob("checkpoint_*.pt"))
    assert len(checkpoints) == 1
    summary = read_summary(train_dir, "interrupted")
    assert summary["stop_reason"] == "interrupted by a signal"
    assert summary["env_steps"] > 0
    saved = torch.load(checkpoints[0], weights_only=True)
    assert saved["env_steps"] == summary["env_steps"]

    # Resume with no flag but the target: every other setting comes from the run's config.json.
    target = summary["env_steps"] + 8192
    result = run_train(train_dir, "interrupted", f"--train_for_env_steps={target}")
    assert result.returncode == 0, result.stderr
    assert "resuming 'interrupted'" in result.stdout
    resumed = read_summary(train_dir, "interrupted")
    assert resumed["env_steps"] >= target
    assert resumed["env_steps_this_run"] == resumed["env_steps"] - saved["env_steps"]
    assert resumed["policy_version"] > summary["policy_version"]
    config = json.loads((train_dir / "interrupted" / "config.json").read_text())
    assert config["sampler"]["num_envs_per_worker"] == 4 and config["model"]["hidden_sizes"] == [32]
    assert_training_continued_from(saved, latest_checkpoint(train_dir / "interrupted"), config)

    # A target already reached trains nothing, says so, and leaves the checkpoint as it is.
    before = latest_checkpoint(train_dir / "interrupted")
    mtime = before.stat().st_mtime_ns
    result = run_train(train_dir, "interrupted", f"--train_for_env_steps={target}", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "raise it to train further" in result.stdout
    assert latest_checkpoint(train_dir / "interrupted") == before and before.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_the_learner_starts_from_the_weights_the_inference_workers_act_with(train_dir):
    # Sampling only (--benchmark): the learner never updates, so its checkpoint holds the weights it started from.
    # They must be the seeded model the runner published as version 0, which the inference workers pull and act
    # with; a model of the learner's own would make the first batches' log-probs and values foreign to it.
    args = [*FAST, "--benchmark=true", "--train_for_env_steps=4096"]
    result = run_train(train_dir, "same", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(latest_checkpoint(train_dir / "same"), weights_only=True)
    assert saved["policy_version"] == 0
    cfg = parse_config([*args, f"--train_dir={train_dir}", "--experiment=same"])
    env = gym.make("CartPole-v1")
    acting = build_model(
        cfg, obs_spec_from_space(env.observation_space), action_spec_from_space(env.action_space), None
    )
    for name, tensor in acting.state_dict().items():
        assert torch.equal(saved["model"][name], tensor), name


def latest_checkpoint(experiment_dir) -> Path:
    return max((experiment_dir / "checkpoints").glob("checkpoint_*.pt"))


def assert_training_continued_from(saved: dict, checkpoint: Path, config: dict) -> None:
    """The resumed learner started from the saved weights, optimiser and normalisers, and only trained on."""
    now = torch.load(checkpoint, weights_only=True)
    learner = config["learner"]
    updates = (
        (now["policy_version"] - saved["policy_version"]) * learner["num_epochs"] * learner["num_batches_per_epoch"]
    )
    # Adam's step counters continue from the saved ones (a fresh optimiser would count from 0).
    for param, state in now["optimizer"]["state"].items():
        assert int(state["step"]) == int(saved["optimizer"]["state"][param]["step"]) + updates
    # The normalisers continue counting samples: one per env step trained on in this run.
    new_samples = now["env_steps"] - saved["env_steps"]
    for count in ("normalizers.obs.count", "return_normalizer.stats.count"):
        assert float(now["model"][count]) == pytest.approx(float(saved["model"][count]) + new_samples, abs=1.0)
    # Each weight moved by at most about lr per Adam step: far less than between two random initialisations. (The
    # value head is also rescaled whenever the return statistics move, so it has no such bound.)
    bound = 3 * learner["learning_rate"] * updates
    for name, tensor in now["model"].items():
        if tensor.is_floating_point() and "normalizer" not in name and "value_head" not in name:
            moved = float((tensor - saved["model"][name]).abs().max())
            assert moved <= bound, (name, moved, bound)


@pytest.mark.slow
def test_corrupt_checkpoint_is_an_error_not_a_fresh_start(train_dir):
    result = run_train(train_dir, "corrupt", *FAST, "--train_for_env_steps=2048")
    assert result.returncode == 0, result.stderr
    (checkpoint,) = (train_dir / "corrupt" / "checkpoints").glob("checkpoint_*.pt")
    checkpoint.write_bytes(b"not a checkpoint")
    result = run_train(train_dir, "corrupt", *FAST, "--train_for_env_steps=4096")
    assert result.returncode == 2
    assert "cannot load checkpoint" in result.stderr and "--restart_behavior=restart" in result.stderr


def error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("sfengine.train: error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


@pytest.mark.slow
def test_a_resume_that_does_not_fit_its_checkpoint_is_refused_and_the_run_still_resumes(train_dir):
    assert run_train(train_dir, "shape", *FAST, "--train_for_env_steps=2048").returncode == 0
    saved = (train_dir / "shape" / "config.json").read_text()
    result = run_train(train_dir, "shape", *FAST, "--hidden_sizes=32", "--train_for_env_steps=4096")
    assert result.returncode == 2 and "resuming" not in result.stdout  # it resumes nothing
    line = error_line(result)
    assert "does not fit this run's policy" in line and "in the checkpoint" in line, line
    assert re.search(r"this run changes --hidden_sizes [\d,]+ -> 32 from its config\.json", line), line
    # The refused settings were not written: resumed as it was trained, the run goes on, its optimiser with the
    # checkpoint's moments and the settings of this command (an --adam_eps that differs from the saved one).
    assert (train_dir / "shape" / "config.json").read_text() == saved
    result = run_train(train_dir, "shape", *FAST, "--train_for_env_steps=4096", "--adam_eps=1e-5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_summary(train_dir, "shape")["env_steps"] >= 4096
    optimizer = torch.load(latest_checkpoint(train_dir / "shape"), weights_only=True)["optimizer"]
    assert optimizer["param_groups"][0]["eps"] == 1e-5
    assert min(int(s["step"]) for s in optimizer["state"].values()) > 8  # more steps than the resumed part took


@pytest.mark.slow
def test_a_sac_run_resumed_with_other_critics_or_another_algorithm_is_refused_before_it_starts(train_dir):
    args = ["--algo=sac", "--env=Pendulum-v1", "--num_workers=1", "--num_envs_per_worker=2", "--learning_starts=10000"]
    first = run_train(train_dir, "critics", *args, "--train_for_env_steps=512", "--save_replay=true")
    assert first.returncode == 0
    assert "no gradient step before the run stops" in first.stderr  # (the replay stays below --learning_starts)
    saved = (train_dir / "critics" / "config.json").read_text()
    longer = "--train_for_env_steps=1024"
    result = run_train(train_dir, "critics", *args, "--num_critics=3", longer)
    assert result.returncode == 2 and "learner" not in result.stdout  # refused before any process started
    line = error_line(result)
    assert "does not fit this run's SAC trainer" in line and "--num_critics 2 -> 3" in line, line
    result = run_train(train_dir, "critics", *[a for a in args if a != "--algo=sac"], "--algo=td3", longer)
    assert result.returncode == 2
    line = error_line(result)
    assert "was trained with --algo=sac" in line and "resume it with --algo=sac" in line, line
    # The replay it kept (--save_replay) has another shape than a changed --replay_size asks: refused, not a
    # traceback in the learner once every worker runs; --save_replay=false drops it and the run refills one.
    result = run_train(train_dir, "critics", *args, "--replay_size=20000", longer)
    assert result.returncode == 2 and "learner" not in result.stdout
    line = error_line(result)
    assert "its replay (--save_replay) holds" in line and "--replay_size 1000000 -> 20000" in line, line
    assert (train_dir / "critics" / "config.json").read_text() == saved
    result = run_train(train_dir, "critics", *args, "--replay_size=20000", "--save_replay=false", longer)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_run_writes_config_tensorboard_checkpoints_every_few_seconds_and_summary(train_dir):
    # Periodic checkpoints with pruning, and an `auto` worker count, in one run of a few seconds.
    args = ["--env=CartPole-v1", "--num_workers=auto", "--num_envs_per_worker=4", "--train_for_env_steps=40000"]
    args += ["--save_every_sec=0.25", "--keep_checkpoints=2"]  # several saves however fast the machine runs
    result = run_train(train_dir, "files", *args)
    assert result.returncode == 0, result.stderr
    experiment = train_dir / "files"
    summary = read_summary(train_dir, "files")
    for key in ("env_steps", "wall_seconds", "fps", "episode_return_mean", "episode_len_mean", "episodes"):
        assert summary[key] is not None, key
    assert summary["env_steps"] >= 40000 and summary["fps"] > 0
    # The auto choice is printed and recorded, so a resumed run keeps it.
    chosen = re.search(r"auto: num_workers=(\d+)", result.stdout)
    assert chosen, result.stdout[-2000:]
    chosen = int(chosen.group(1))
    assert json.loads((experiment / "config.json").read_text())["sampler"]["num_workers"] == chosen >= 1
    # Saved periodically and at the stop; only the newest two are kept, the last one holding the final state.
    saved = re.findall(r"checkpoint saved: (checkpoint_\d+_\d+\.pt)", result.stdout + result.stderr)
    saved = list(dict.fromkeys(saved))  # a save with no training since the last one rewrites the same file
    assert len(saved) >= 3, saved
    kept = sorted(p.name for p in (experiment / "checkpoints").glob("checkpoint_*.pt"))
    assert kept == sorted(saved[-2:])
    assert saved[-1] == f"checkpoint_{summary['policy_version']:09d}_{summary['env_steps']}.pt"
    events = b"".join(p.read_bytes() for p in (experiment / "tensorboard").glob("events.out.tfevents.*"))
    for tag in (b"perf/fps_10s", b"episodes/episode_return_mean", b"train/loss", b"train/clip_fraction"):
        assert tag in events, tag
    # What a person reads: the start block, progress towards the stop with an ETA, and a summary before the JSON.
    out = result.stdout
    assert "sfengine: PPO on CartPole-v1" in out and f"tensorboard --logdir {experiment / 'tensorboard'}" in out
    progress = [(int(steps.replace(",", "")), int(p)) for steps, p in re.findall(r"steps +([\d,]+) \((\d+)%, ETA", out)]
    assert len(progress) >= 2 and progress[-1][0] > 0
    assert all(percent == min(round(100 * steps / 40000), 100) for steps, percent in progress), progress
    last_lines = out.strip().splitlines()
    assert last_lines[-1].startswith("{") and any(line.startswith("done: reached") for line in last_lines[-4:])
    assert f"python -m sfengine.plot --train_dir={train_dir} --experiment=files" in out


# A user script whose learner finds the disk full for its 2nd and 3rd checkpoint: each of those writes leaves part
# of a file, then fails as a full disk fails (the script runs again in every spawned process).
DISK_FULL_SCRIPT = textwrap.dedent(
    """
    import errno
    import sys

    import torch

    from sfengine.train import main

    real_save, writes = torch.save, []


    def save_on_a_filling_disk(obj, path, *args, **kwargs):
        if "checkpoint_" in str(path):
            writes.append(path)
            if len(writes) in (2, 3):
                with open(path, "wb") as f:
                    f.write(b"half a checkpoint")
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)


    torch.save = save_on_a_filling_disk

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_keeps_the_last_one_and_the_run_goes_on(tmp_path, train_dir):
    script = tmp_path / "disk_full.py"
    script.write_text(DISK_FULL_SCRIPT)
    args = [*FAST, "--train_for_env_steps=60000", "--save_every_sec=0.25", "--keep_checkpoints=5"]
    command = [sys.executable, str(script), *train_command(train_dir, "full", *args)[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    saved = list(dict.fromkeys(re.findall(r"checkpoint saved: (checkpoint_\d+_\d+\.pt)", log)))
    failures = re.findall(
        r"cannot write checkpoint (checkpoint_\d+_\d+\.pt) .*\(No space left on device[^;]*\); kept (\S+);", log
    )
    assert len(failures) == 2, log[-3000:]
    # Each failure kept the newest checkpoint written before it, and the saves after it succeeded again.
    assert failures[0][1] == failures[1][1] == saved[0]
    assert len(saved) >= 2
    summary = read_summary(train_dir, "full")
    assert saved[-1] == f"checkpoint_{summary['policy_version']:09d}_{summary['env_steps']}.pt"
    directory = train_dir / "full" / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == sorted(saved[-5:])  # no half-written file left
    for path in directory.iterdir():
        assert torch.load(path, weights_only=True)["env_steps"] > 0


@pytest.mark.slow
def test_train_for_seconds_stops_the_run_cleanly_on_time(train_dir):
    # The clock runs from the start, so the stop may even reach components still starting: they stop all the same.
    started = time.time()
    result = run_train(
        train_dir, "timed", *FAST, "--train_for_env_steps=100000000", "--train_for_seconds=3", timeout=120
    )
    summary = read_summary(train_dir, "timed")
    # A run that learned from no env step in its 3 s (a loaded machine) says so with exit code 1.
    learned = summary["env_steps_this_run"] > 0
    assert result.returncode == summary["exit_code"] == (0 if learned else 1), result.stderr[-3000:]
    assert (
        summary["stop_reason"] == "trained for 3 s"
        if learned
        else "; no env step was learned from: " in summary["stop_reason"]
    )
    assert 3 <= summary["wall_seconds"] < time.time() - started
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_restart_moves_the_old_run_aside_and_overwrite_deletes_it(train_dir):
    assert run_train(train_dir, "again", *FAST, "--train_for_env_steps=2048").returncode == 0
    result = run_train(train_dir, "again", *FAST, "--train_for_env_steps=2048", "--restart_behavior=restart")
    assert result.returncode == 0, result.stderr
    assert read_summary(train_dir, "again")["env_steps_this_run"] == read_summary(train_dir, "again")["env_steps"]
    (aside,) = train_dir.glob("again.*")  # the previous run, kept
    assert list((aside / "checkpoints").glob("checkpoint_*.pt"))

    result = run_train(train_dir, "again", *FAST, "--train_for_env_steps=4096", "--restart_behavior=overwrite")
    assert result.returncode == 0, result.stderr
    summary = read_summary(train_dir, "again")
    assert summary["env_steps_this_run"] == summary["env_steps"] >= 4096  # started over, not resumed
    assert list(train_dir.glob("again.*")) == [aside]  # nothing more moved aside: the old run is gone
    (checkpoint,) = (train_dir / "again" / "checkpoints").glob("checkpoint_*.pt")
    assert checkpoint.name.endswith(f"_{summary['env_steps']}.pt")


USER_SCRIPT = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass
    from typing import ClassVar

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.config import ConfigError, option
    from sfengine.train import main
    from sfengine_envs.multitask_toy import make_multitask_toy


    class ReportsIsSuccess(gym.Wrapper):
        # Reports info["is_success"] (the name gymnasium-robotics and SB3 use) at each episode's end: every
        # second episode of each env succeeds.

        episodes = 0

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                self.episodes += 1
                info["is_success"] = self.episodes % 2 == 0
            return obs, reward, terminated, truncated, info


    @dataclass
    class ShortPendulumOptions:
        group: ClassVar[str] = "short_pendulum"
        short_pendulum_steps: int = option(25, "steps per episode")

        def validate(self, auto):
            if self.short_pendulum_steps < 1:
                raise ConfigError("--short_pendulum_steps must be at least 1")


    def make_short_pendulum(ctx):
        # Pendulum never ends by itself: every episode lasts exactly the user's limit, an option of its own.
        return ReportsIsSuccess(gym.make("Pendulum-v1", max_episode_steps=ctx.options.short_pendulum_steps))


    class EvenTasksSucceed(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if "success" in info:
                info["success"] = self.env.unwrapped.task % 2 == 0
            return obs, reward, terminated, truncated, info


    def make_graded_toy(ctx):
        return EvenTasksSucceed(make_multitask_toy(ctx))


    class FlakySimulator(gym.Wrapper):
        # Raises inside step on every 3rd episode, as a crashing physics engine would.

        episodes = 0

        def reset(self, **kwargs):
            FlakySimulator.episodes += 1
            self.steps = 0
            return self.env.reset(**kwargs)

        def step(self, action):
            self.steps += 1
            if FlakySimulator.episodes % 3 == 0 and self.steps == 5:
                raise RuntimeError("simulated physics blow-up")
            return self.env.step(action)


    def make_flaky_cartpole(ctx):
        return FlakySimulator(gym.make("CartPole-v1"))


    class BrokenSimulator(gym.Wrapper):
        # Raises at every step but a process's first (the check's), as a simulator broken by an upgrade would.

        steps = 0

        def step(self, action):
            BrokenSimulator.steps += 1
            if BrokenSimulator.steps > 1:
                raise RuntimeError("simulator broken")
            return self.env.step(action)


    def make_broken_cartpole(ctx):
        return BrokenSimulator(gym.make("CartPole-v1"))


    register_env("short_pendulum", make_short_pendulum, options=ShortPendulumOptions)
    register_env("graded_toy", make_graded_toy)
    register_env("flaky_cartpole", make_flaky_cartpole)
    register_env("broken_cartpole", make_broken_cartpole)
    register_env("lambda_env", lambda ctx: gym.make("CartPole-v1"))

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_env_registered_from_a_user_script_runs_in_spawned_workers_with_its_own_options(tmp_path, train_dir):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    base = [sys.executable, str(script), f"--train_dir={train_dir}", *FAST[1:]]
    result = subprocess.run(
        [*base, "--env=short_pendulum", "--experiment=user", "--train_for_env_steps=8192", "--short_pendulum_steps=20"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = read_summary(train_dir, "user")
    assert summary["episode_len_mean"] == 20  # the user's own env, with its own option, ran in the workers
    saved = json.loads((train_dir / "user" / "config.json").read_text())
    assert saved["short_pendulum"] == {"short_pendulum_steps": 20}
    assert "synthetic" not in saved and "libero" not in saved  # the options of other envs are not this run's

    result = subprocess.run([*base, "--help"], capture_output=True, text=True, timeout=120)
    words = " ".join(result.stdout.split())
    assert "short_pendulum: options of --env=short_pendulum --short_pendulum_steps INT steps per episode" in words
    result = subprocess.run(
        [*base, "--env=short_pendulum", "--experiment=bad", "--short_pendulum_steps=0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--short_pendulum_steps must be at least 1" in result.stderr
    assert summary["success_rate"] == pytest.approx(0.5, abs=0.1)  # read from info["is_success"]

    result = subprocess.run(
        [*base, "--env=lambda_env", "--experiment=lam"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert "module-level function" in result.stderr


@pytest.mark.slow
def test_second_sigint_forces_the_exit_and_leaves_no_process(tmp_path, train_dir):
    # The first SIGINT's stop waits for a worker hung in its env (a clean stop takes a tenth of a second, and would
    # be over before the second signal): the second forces the exit.
    shm_before = shm_entries()
    command = hanging_toy_command(
        tmp_path, train_dir, "forced", "--env=hanging_toy", "--train_for_env_steps=1000000000"
    )
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not (tmp_path / "hangs.py.hung").exists():
        assert time.time() < deadline and process.poll() is None, "the env never hung"
        time.sleep(0.1)
    children = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)  # two signals sent at once may be delivered as one
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130, output
    assert "forced exit" in output
    summary = read_summary(train_dir, "forced")  # written at every exit, a forced one too
    assert summary["stop_reason"] == "forced by a second SIGINT" and summary["exit_code"] == 130
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_stops_cleanly_with_a_checkpoint(train_dir):
    # Job schedulers (and `timeout`) send SIGTERM to every process of the job at once, not only to the runner.
    shm_before = shm_entries()
    # With a training evaluator (whose first evaluation is never due): a signal's stop skips --eval_at_end.
    evaluator = "--eval_every_env_steps=1000000000"
    process = start_long_training(train_dir, "terminated", evaluator, start_new_session=True)
    children = psutil.Process(process.pid).children(recursive=True)
    assert "sfe-evaluator" in [child.name() for child in children]
    os.killpg(process.pid, signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "SIGTERM: saving a checkpoint and stopping" in output
    summary = read_summary(train_dir, "terminated")
    assert summary["stop_reason"] == "interrupted by a signal" and "eval" not in summary
    assert "evaluating the final policy" not in output
    (checkpoint,) = (train_dir / "terminated" / "checkpoints").glob("checkpoint_*.pt")
    assert checkpoint.name.endswith(f"_{summary['env_steps']}.pt")  # saved by the learner at the stop
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_a_runner_killed_with_sigkill_takes_its_workers_along_and_leaves_nothing_in_dev_shm(train_dir):
    # SIGKILL (or the OOM killer) gives the runner no chance to stop anything: the kernel ends the components with
    # it, and no named semaphore or segment may outlive them. A multi-task env, so the task-sequence lock exists too.
    shm_before = shm_entries()
    process = start_long_training(train_dir, "killed", "--env=multitask_toy")
    children = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.communicate(timeout=30)
    _, alive = psutil.wait_procs(children, timeout=10)
    for orphan in alive:
        orphan.kill()  # not to leave them spinning after the test
    assert not alive, f"components outlived the runner: {alive}"
    assert leaked_shm(shm_before) == set()


def run_user_script(tmp_path, train_dir, *args: str) -> subprocess.CompletedProcess:
    """USER_SCRIPT (its envs registered) with the FAST layout and these arguments."""
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    command = [sys.executable, str(script), f"--train_dir={train_dir}", *FAST[1:], *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_script_that_calls_main_unguarded_stops_at_once_with_the_fix(tmp_path, train_dir):
    # Every component process imports the main script: each one ran main() again inside its start-up, printed
    # multiprocessing's traceback about the bootstrapping phase, and the run stopped as "process died:
    # learner_process (exit code 1)" after respawning the rollout workers that did the same.
    script = tmp_path / "unguarded.py"
    guarded = 'if __name__ == "__main__":\n    sys.exit(main(sys.argv[1:]))'
    assert guarded in USER_SCRIPT
    script.write_text(USER_SCRIPT.replace(guarded, "sys.exit(main(sys.argv[1:]))"))
    args = [f"--train_dir={train_dir}", *FAST[1:], "--env=short_pendulum", "--experiment=unguarded"]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = read_summary(train_dir, "unguarded")
    reason = summary["stop_reason"]
    assert reason.startswith("process died: ") and ': put the call under if __name__ == "__main__":' in reason, reason
    assert summary["respawns"] == {} and "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_an_env_that_raises_is_rebuilt_and_the_run_goes_on(tmp_path, train_dir):
    result = run_user_script(
        tmp_path, train_dir, "--env=flaky_cartpole", "--experiment=flaky", "--train_for_env_steps=20000"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "flaky")
    assert summary["env_failures"] > 10
    assert summary["episodes"] > 100  # the workers kept collecting
    assert "step failed; rebuilding the env" in result.stderr


@pytest.mark.slow
def test_an_env_that_raises_at_most_steps_stops_the_run_and_says_why(tmp_path, train_dir):
    # It was rebuilt at every step, with a traceback each (75,000 in 20 s), and the run went on learning nothing
    # to its end with exit 0.
    args = ["--env=broken_cartpole", "--experiment=broken", "--train_for_env_steps=100000000"]
    result = run_user_script(tmp_path, train_dir, *args)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = read_summary(train_dir, "broken")
    assert summary["stop_reason"].startswith("the env raised in ") and "fix the env" in summary["stop_reason"]
    # The first tracebacks of each of the 4 env groups (2 workers x 2 splits), then counts.
    assert 4 <= result.stderr.count("Traceback") <= 3 * 4, result.stderr[-3000:]
    assert "(further ones are counted, not logged)" in result.stderr


@pytest.mark.slow
def test_multi_task_env_gets_assignments_and_reports_success_per_task(tmp_path, train_dir):
    # Even tasks always succeed and odd ones never: each episode's outcome must be credited to its own task.
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), f"--train_dir={train_dir}", *FAST[1:], "--env=graded_toy"]
        + ["--experiment=tasks", "--train_for_env_steps=10000", "--report_every_sec=2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "tasks")
    assert summary["per_task_success"] == {"toy_task_0": 1.0, "toy_task_1": 0.0, "toy_task_2": 1.0, "toy_task_3": 0.0}
    assert summary["success_rate"] == pytest.approx(0.5, abs=0.05)  # tasks are dealt in turn
    # The status line shows each task's success as it goes.
    assert re.search(r"success per task: 0:1\.00 1:0\.00 2:1\.00 3:0\.00", result.stdout)


HANGING_SCRIPT = """
import os
import sys
import time

import gymnasium as gym

import sfengine.engine.supervision
from sfengine import register_env
from sfengine.train import main
from sfengine_envs.multitask_toy import make_multitask_toy


HUNG_ONCE = __file__ + ".hung"
HANG_STEP = int(os.environ.get("HANG_STEP", 3000))
# A test whose run only has to outlast some seconds paces its steps, so that it neither needs hundreds of thousands
# of them on a fast machine nor takes a loaded machine's cores from the tests beside it.
STEP_SECONDS = float(os.environ.get("STEP_MS", 0)) / 1000
# A test of the stop's own time limit shortens it, as it cannot wait the minute a run gives its components.
supervision = sfengine.engine.supervision
supervision.STOP_TIMEOUT_SEC = float(os.environ.get("STOP_TIMEOUT_SEC", supervision.STOP_TIMEOUT_SEC))


def stuck_in_the_simulator():
    time.sleep(100_000)  # as a deadlocked simulator would: the step never returns


class HangsOnce(gym.Wrapper):
    # Env 3 of rollout worker 1 hangs in its HANG_STEP-th step, a few seconds into the run; once a run (the worker
    # that replaces it does not).

    def __init__(self, env, ctx):
        super().__init__(env)
        self.hangs = (ctx.worker_index, ctx.env_index) == (1, 3)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.hangs and self.steps == HANG_STEP and not os.path.exists(HUNG_ONCE):
            open(HUNG_ONCE, "w").close()
            stuck_in_the_simulator()
        return self.env.step(action)


class Paced(gym.Wrapper):
    def step(self, action):
        time.sleep(STEP_SECONDS)
        return self.env.step(action)


def make_paced_toy(ctx):
    toy = make_multitask_toy(ctx)
    return Paced(toy) if STEP_SECONDS else toy


def make_hanging_toy(ctx):
    return HangsOnce(make_paced_toy(ctx), ctx)


class StallsOnce(HangsOnce):
    # Env 3 of rollout worker 1 stalls for 6 s in its 300th step, as a slow simulator step might, then goes on.

    def step(self, action):
        self.steps += 1
        if self.hangs and self.steps == 300:
            print("env 3 of worker 1 stalls", file=sys.stderr, flush=True)
            time.sleep(6)
        return self.env.step(action)


def make_stalling_toy(ctx):
    return StallsOnce(make_multitask_toy(ctx), ctx)


def make_slow_starting_toy(ctx):
    # Rollout worker 1 builds its envs for minutes, as LIBERO's simulators may on a loaded machine.
    if ctx.worker_index == 1:
        stuck_in_the_simulator()
    return make_paced_toy(ctx)


def make_toy_hanging_at_its_first_start(ctx):
    # The processes shown as HANGING (comma-separated titles, sfe-rollout-1 by default) never finish building their
    # first env, as a simulator deadlocked in its start-up would; once a run each (the process that replaces one
    # starts as usual).
    with open("/proc/self/comm") as comm:
        title = comm.read().strip()
    hung_once = f"{HUNG_ONCE}.{title}"
    if title in os.environ.get("HANGING", "sfe-rollout-1").split(",") and not os.path.exists(hung_once):
        open(hung_once, "w").close()
        stuck_in_the_simulator()
    return make_paced_toy(ctx)


register_env("paced_toy", make_paced_toy)
register_env("hanging_toy", make_hanging_toy)
register_env("stalling_toy", make_stalling_toy)
register_env("slow_starting_toy", make_slow_starting_toy)
register_env("toy_hanging_at_its_first_start", make_toy_hanging_at_its_first_start)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def hanging_toy_command(tmp_path: Path, train_dir: Path, experiment: str, *args: str) -> list[str]:
    """A run of HANGING_SCRIPT (the toy envs that hang, stall or start slowly) with FAST's layout and ``args``."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGING_SCRIPT)
    return [sys.executable, str(script), f"--train_dir={train_dir}", f"--experiment={experiment}", *FAST[1:], *args]


def run_to_the_end(command: list[str], **popen) -> tuple[str, list[psutil.Process]]:
    """Run it to the end, expecting exit code 0: its stderr and the processes it had started."""
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    children = []
    while not children and process.poll() is None:
        time.sleep(0.5)
        children = psutil.Process(process.pid).children(recursive=True)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr[-3000:]
    return stderr, children


@pytest.mark.slow
def test_a_hung_env_is_named_with_its_stack_and_its_worker_respawned(tmp_path, train_dir):
    shm_before = shm_entries()
    command = hanging_toy_command(tmp_path, train_dir, "hang")
    # Steps of 1 ms, one env of a worker at a time: a worker takes fewer than 1,000 a second on any machine, so the
    # hang comes after 4 s at the earliest, near 8,000 env steps (env 3's 1,000th), and worker 0 alone would need
    # over 20 s for the rest: its partner's successor has the 5 s of silence and 15 s more to start (1,400 env
    # steps a second in all here).
    command += ["--env=hanging_toy", "--hang_timeout_sec=5", "--train_for_env_steps=30000"]
    started = time.time()
    stderr, children = run_to_the_end(command, env={**os.environ, "HANG_STEP": "1000", "STEP_MS": "1"})
    assert time.time() - started < 180  # noticed after 5 s of silence, not left hanging
    # The error names the worker, the env and what it was playing; its stack shows where it is stuck.
    error = next(line for line in stderr.splitlines() if "sent no report" in line)
    assert "rollout_worker_1 sent no report" in error and "stuck in env 3 (split 1), task" in error, error
    assert re.search(r"task \d+ 'toy_task_\d+', init state \d+", error), error
    assert error.endswith("respawning it (--hang_timeout_sec)"), error
    assert "stuck_in_the_simulator" in stderr  # the hung process's own stack, printed by faulthandler
    summary = read_summary(train_dir, "hang")
    assert summary["respawns"] == {"rollout_worker_1": 1}
    assert summary["env_steps"] >= 30000 and summary["exit_code"] == 0
    assert summary["respawn_seconds_lost"] > 0  # its successor started and reported before the run's end
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.parametrize("watched", [True, False], ids=["hang_watch", "stop_timeout"])
@pytest.mark.slow
def test_a_worker_hung_when_training_ends_is_ended_and_the_run_exits_0(tmp_path, train_dir, watched):
    # Env 3 of worker 1 hangs early (its 500th step, near 4,000 env steps in all) and the other worker reaches the
    # 30,000 steps alone, well within the hang timeout: the stop finds worker 1 stuck. Training is over and saved,
    # so the run must not fail for it: the hang watch ends it once silent for --hang_timeout_sec (its stack
    # printed), or, with the watch off, the stop's time limit terminates it (shortened to 10 s here).
    shm_before = shm_entries()
    command = hanging_toy_command(tmp_path, train_dir, "late")
    command += ["--env=hanging_toy", f"--hang_timeout_sec={12 if watched else 0}", "--train_for_env_steps=30000"]
    # With the watch on, the stop keeps its minute: the watch, not the limit, must end the worker.
    env = {**os.environ, "HANG_STEP": "500", "STOP_TIMEOUT_SEC": "60" if watched else "10"}
    stderr, children = run_to_the_end(command, env=env)
    stopping = stderr.index("stopping: reached")
    if watched:
        error = next(line for line in stderr.splitlines() if "sent no report" in line)
        assert stderr.index(error) > stopping, "the hang was noticed before the stop: the test needs a later hang"
        assert "rollout_worker_1 sent no report" in error and "stuck in env 3 (split 1)" in error, error
        assert error.endswith("ending it, as the run is stopping (--hang_timeout_sec)"), error
        assert "stuck_in_the_simulator" in stderr
        assert "did not stop within" not in stderr
    else:
        assert "components did not stop within 10 s: rollout_worker_1; terminating them\n" in stderr, stderr[-3000:]
    summary = read_summary(train_dir, "late")
    assert summary["exit_code"] == 0 and summary["env_steps"] >= 30000
    assert not summary.get("respawns"), summary  # a stopping run respawns nothing
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_hang_timeout_zero_lets_a_long_silence_pass(tmp_path, train_dir):
    command = hanging_toy_command(tmp_path, train_dir, "stall")
    command += ["--env=stalling_toy", "--hang_timeout_sec=0", "--train_for_env_steps=20000"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "env 3 of worker 1 stalls" in result.stderr  # the silence happened
    assert "sent no report" not in result.stderr
    assert read_summary(train_dir, "stall")["env_steps"] >= 20000


@pytest.mark.slow
def test_a_hung_training_evaluator_is_respawned_and_its_successor_evaluates(tmp_path, train_dir):
    # Frozen, the evaluator would leave every later evaluation dropped (one is under way), silently.
    command = hanging_toy_command(tmp_path, train_dir, "frozen_eval", "--env=paced_toy", "--hang_timeout_sec=4")
    command += ["--train_for_env_steps=100000000", "--train_for_seconds=25", "--eval_every_env_steps=5000"]
    paced = {**os.environ, "STEP_MS": "1"}  # the training beside it is not the point
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=paced)
    wait_for_training(process)
    children = psutil.Process(process.pid).children(recursive=True)
    (evaluator,) = (c for c in children if c.name() == "sfe-evaluator")
    evaluator.suspend()
    frozen_at = time.time()
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output[-3000:]
    assert "evaluator sent no report for" in output and "respawning it (--hang_timeout_sec)" in output, output[-3000:]
    summary = read_summary(train_dir, "frozen_eval")
    assert summary["respawns"] == {"evaluator": 1}
    assert summary["eval"][-1]["final"]  # played by its successor
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert time.time() - frozen_at < 120


@pytest.mark.slow
def test_a_hung_inference_worker_is_named_and_respawned_and_the_run_finishes(train_dir):
    shm_before = shm_entries()
    args = [*FAST, "--train_for_env_steps=60000", "--hang_timeout_sec=4"]
    process = start(train_command(train_dir, "frozen", *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for_training(process)
    children = psutil.Process(process.pid).children(recursive=True)
    (inference,) = (c for c in children if c.name() == "sfe-inference-0")
    inference.suspend()  # SIGSTOP: frozen as a process stuck in a driver call would be
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output[-3000:]
    assert "inference_worker_0 sent no report" in output
    assert not re.search(r"rollout_worker_\d+ sent no report", output), output[-6000:]  # they waited for it
    # Stopped while waiting for requests, it can leave a rollout worker that signals it stuck inside its inbox: that
    # one is ended with it, said, and respawned too.
    ended_with_it = re.findall(r"(rollout_worker_\d+)_process is stuck inside inference_worker_0's inbox", output)
    summary = read_summary(train_dir, "frozen")
    assert summary["respawns"] == {"inference_worker_0": 1, **dict.fromkeys(ended_with_it, 1)}, output[-6000:]
    assert summary["env_steps"] >= 60000  # the rollout workers it had left waiting asked its successor again
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
@pytest.mark.parametrize("end", ["SIGSTOP", "SIGKILL"])
def test_a_learner_stopped_or_killed_mid_run_is_named_and_the_run_stops_with_its_last_checkpoint(train_dir, end):
    # A learner stopped outright (SIGSTOP, a debugger) while it waits for a batch is in no update, and the rollout
    # side only waits for buffers: the run showed a falling FPS, then waited its 60 s stop timeout. One killed (the
    # OOM killer) stopped the run without naming the checkpoint to resume from.
    shm_before = shm_entries()
    args = [*FAST, "--train_for_env_steps=100000000", "--hang_timeout_sec=4", "--save_every_sec=0.5"]
    process = start(train_command(train_dir, "ended", *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for_training(process)
    deadline = time.time() + 60
    while not list((train_dir / "ended" / "checkpoints").glob("checkpoint_*.pt")) and time.time() < deadline:
        time.sleep(0.2)  # a checkpoint to name
    children = psutil.Process(process.pid).children(recursive=True)
    (learner,) = (c for c in children if c.name() == "sfe-learner")
    learner.suspend() if end == "SIGSTOP" else learner.kill()
    ended_at = time.time()
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output[-3000:]
    if end == "SIGSTOP":
        # (Stopped inside an update, it is named as stuck in that update: the same stop.)
        named = re.findall(r"(learner_process has been stopped \(SIGSTOP|learner has been inside one update).*", output)
        assert len(named) == 1, output[-3000:]  # once: not again at every tick while the run stops
        assert "it is stopped, so it printed no stack" in output
        assert read_summary(train_dir, "ended")["stop_reason"] == "hung: learner"
    else:
        assert "a component process died: learner_process (exit code -9)" in output, output[-3000:]
    assert time.time() - ended_at < 40  # its timeout and the stop, not the 60 s stop timeout on top
    saved = sorted((train_dir / "ended" / "checkpoints").glob("checkpoint_*.pt"))
    assert saved and f"the last checkpoint is {saved[-1].name}" in output
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


# A user script whose learner gets stuck in an update (a deadlock inside the loss, a device call that never returns),
# in the spawned learner process.
STUCK_LEARNER_SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    from sfengine.algorithms.ppo.trainer import PPOTrainer
    from sfengine.train import main

    real_train, updates = PPOTrainer.train, []


    def train_until_stuck(self, *args, **kwargs):
        # Stuck in the first update that starts 3 s after the first one: by then a checkpoint was saved.
        updates.append(time.time())
        if len(updates) > 1 and updates[-1] - updates[0] > 3:
            print(f"stuck in update {len(updates)}", file=sys.stderr, flush=True)
            while True:
                time.sleep(1)
        return real_train(self, *args, **kwargs)


    PPOTrainer.train = train_until_stuck

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_learner_stuck_in_an_update_is_named_with_its_stack_and_the_run_stops_with_its_last_checkpoint(
    tmp_path, train_dir
):
    shm_before = shm_entries()
    script = tmp_path / "stuck_learner.py"
    script.write_text(STUCK_LEARNER_SCRIPT)
    args = [*FAST, "--train_for_env_steps=100000000", "--hang_timeout_sec=4", "--save_every_sec=0.5"]
    process = start_script(script, train_dir, "stuck", *args)
    children = component_processes(process)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output[-3000:]
    assert "learner has been inside one update or save for" in output, output[-3000:]
    assert "train_until_stuck" in output  # the stuck process's own stack, all threads
    summary = read_summary(train_dir, "stuck")
    assert summary["stop_reason"] == "hung: learner"
    saved = sorted((train_dir / "stuck" / "checkpoints").glob("checkpoint_*.pt"))
    assert saved and f"the last checkpoint is {saved[-1].name}" in output
    stuck_in = re.search(r"stuck in update (\d+)", output)
    assert stuck_in, output[-3000:]
    stuck_in = int(stuck_in.group(1))
    assert torch.load(saved[-1], weights_only=True)["policy_version"] < stuck_in  # written before it got stuck
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


# A user script whose learner takes 0.5 s a gradient step, as one starved of CPU by other work on the machine would:
# an update of 8 steps lasts longer than the test's --hang_timeout_sec, but keeps stepping.
SLOW_LEARNER_SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    from sfengine.algorithms.ppo.trainer import PPOTrainer
    from sfengine.train import main

    real_step = PPOTrainer._step


    def starved_step(self, *args, **kwargs):
        time.sleep(0.5)
        return real_step(self, *args, **kwargs)


    PPOTrainer._step = starved_step

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_learner_slowed_past_the_hang_timeout_but_still_stepping_is_not_stopped(tmp_path, train_dir):
    script = tmp_path / "slow_learner.py"
    script.write_text(SLOW_LEARNER_SCRIPT)
    args = [*FAST, "--hang_timeout_sec=3", "--num_epochs=2", "--num_batches_per_epoch=4", "--train_for_seconds=15"]
    process = start_script(script, train_dir, "slow", *args)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-3000:]
    assert "learner has been inside one update" not in output
    summary = read_summary(train_dir, "slow")
    assert summary["stop_reason"] == "trained for 15 s" and summary["env_steps"] > 0


# A user script whose learner never finishes its start-up (a base policy or a replay that never loads, a rank that
# never joins the first broadcast): its trainer is never built, in the spawned learner process.
LEARNER_STUCK_STARTING_SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    from sfengine.algorithms.ppo.trainer import PPOTrainer
    from sfengine.train import main


    def building_the_trainer_for_good(self, *args, **kwargs):
        while True:
            time.sleep(1)


    PPOTrainer.__init__ = building_the_trainer_for_good

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_learner_stuck_in_its_start_up_is_named_with_its_stack_and_the_run_stops(tmp_path, train_dir):
    # Without the watch the workers would fill their buffers and wait for good, and the run would print its status
    # line forever: no progress, no reason.
    shm_before = shm_entries()
    script = tmp_path / "stuck_starting.py"
    script.write_text(LEARNER_STUCK_STARTING_SCRIPT)
    process = start_script(script, train_dir, "learner_starting", *FAST, "--startup_timeout_sec=4")
    children = component_processes(process)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output[-3000:]
    error = next(line for line in output.splitlines() if "learner has been in its start-up" in line)
    assert "over --startup_timeout_sec=4 (hung?); its stack is above; stopping the run" in error, error
    assert error.endswith("no checkpoint was written yet"), error
    assert "building_the_trainer_for_good" in output  # the stuck process's own stack
    assert read_summary(train_dir, "learner_starting")["stop_reason"] == "hung: learner"
    assert_nothing_left(children, shm_before)


# A user script whose batcher raises while it assembles its 5th training batch (as a bug in it would): the batcher
# runs in a thread of the learner process, whose death would not show.
FAILING_BATCHER_SCRIPT = textwrap.dedent(
    """
    import sys

    from sfengine.learning.batcher import Batcher
    from sfengine.train import main

    real_assemble, batches = Batcher._assemble, []


    def assemble_until_it_fails(self):
        if len(self.pending) >= self.trajectories_per_batch and self.free_slots:
            batches.append(1)
            if len(batches) == 5:
                raise RuntimeError("a bug in the batcher")
        return real_assemble(self)


    Batcher._assemble = assemble_until_it_fails

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_batcher_that_raises_stops_the_run_with_a_checkpoint_instead_of_hanging(tmp_path, train_dir):
    shm_before = shm_entries()
    script = tmp_path / "failing_batcher.py"
    script.write_text(FAILING_BATCHER_SCRIPT)
    args = [*FAST, "--batch_size=256", "--num_batches_per_epoch=1", "--train_for_env_steps=100000000"]
    process = start_script(script, train_dir, "batcher", *args)
    children = component_processes(process)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output[-3000:]
    assert "batcher failed: RuntimeError: a bug in the batcher; stopping the run" in output
    assert "in assemble_until_it_fails" in output  # the batcher's traceback
    summary = read_summary(train_dir, "batcher")
    assert summary["stop_reason"] == "batcher failed: RuntimeError: a bug in the batcher"
    # The learner saved at the stop, after the 4 updates it had made.
    (saved,) = (train_dir / "batcher" / "checkpoints").glob("checkpoint_*.pt")
    assert torch.load(saved, weights_only=True)["policy_version"] == 4
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_a_stop_during_a_workers_start_up_ends_it_at_once_and_the_run_exits_0(tmp_path, train_dir):
    # Worker 1 never finishes building its envs; worker 0 trains. A Ctrl-C then must not wait the stop's minute
    # for a process that reads no signal until its start-up is over: it holds nothing yet, so it is ended.
    shm_before = shm_entries()
    command = hanging_toy_command(tmp_path, train_dir, "starting")
    command += ["--env=slow_starting_toy", "--train_for_env_steps=100000000", "--report_every_sec=1"]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "STEP_MS": "1"})
    wait_for_training(process)
    children = psutil.Process(process.pid).children(recursive=True)
    stopped = time.time()
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-3000:]
    assert time.time() - stopped < 40, "the stop waited for the starting worker"
    assert "rollout_worker_1 still starting as the run stops; ending it" in output, output[-3000:]
    assert "did not stop within" not in output
    assert read_summary(train_dir, "starting")["stop_reason"] == "interrupted by a signal"
    assert list((train_dir / "starting" / "checkpoints").glob("checkpoint_*.pt"))  # the learner saved as usual
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_workers_hung_in_their_start_up_are_named_with_their_stacks_and_respawned(tmp_path, train_dir):
    # Their first start never finishes; without a start-up timeout they would sit there for good, unwatched (a worker
    # sends no report until its envs are built): an evaluation or a one-worker run would never end, and a training
    # evaluator would never evaluate. A rollout worker and the training evaluator hang in the same run, each watched
    # on its own.
    shm_before = shm_entries()
    command = hanging_toy_command(tmp_path, train_dir, "startup")
    # Stopped by the clock, not by env steps: worker 0 alone would reach any step count before the timeout.
    command += ["--env=toy_hanging_at_its_first_start", "--startup_timeout_sec=10", "--train_for_env_steps=100000000"]
    command += ["--eval_every_env_steps=100000"]
    hanging = {"rollout_worker_1": "sfe-rollout-1", "evaluator": "sfe-evaluator"}
    environment = {
        **os.environ,
        "HANGING": ",".join(hanging.values()),
        "STEP_MS": "1",
    }  # worker 0's training is not the point
    stderr, children = run_to_the_end([*command, "--train_for_seconds=30"], env=environment)
    errors = [line for line in stderr.splitlines() if "still in its start-up" in line]
    for hung in hanging:
        error = next((line for line in errors if f"{hung} is still in its start-up after" in line), None)
        assert error is not None, errors
        assert "the longer of --startup_timeout_sec and 3x the longest start-up so far" in error, error
        assert error.endswith("respawning it (--startup_timeout_sec)"), error
    assert stderr.count("stuck_in_the_simulator") >= 2, stderr[-3000:]  # each hung process's stack (faulthandler)
    summary = read_summary(train_dir, "startup")
    assert summary["respawns"] == {hung: 1 for hung in hanging} and summary["exit_code"] == 0
    assert summary["respawn_seconds_lost"] > 0  # the successors finished their start-up and reported
    assert summary["eval"] and summary["eval"][-1]["final"]  # the evaluator's successor evaluates
    assert_nothing_left(children, shm_before)


@pytest.mark.slow
def test_a_start_up_hung_past_max_respawns_stops_the_run_with_exit_1(tmp_path, train_dir):
    shm_before = shm_entries()
    command = hanging_toy_command(tmp_path, train_dir, "never_up")
    # Room for worker 0's own start-up on a loaded machine (it took 3.4 s beside the suite and two benchmarks).
    command += ["--env=slow_starting_toy", "--startup_timeout_sec=10", "--max_respawns=0"]
    paced = {**os.environ, "STEP_MS": "1"}  # worker 0's training is not the point
    process = start(
        [*command, "--train_for_env_steps=100000000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=paced
    )
    children = component_processes(process)
    output = process.communicate(timeout=180)[0]
    assert process.returncode == 1, output[-3000:]
    error = next(line for line in output.splitlines() if "still in its start-up" in line)
    assert error.endswith("respawning is off (--max_respawns=0); stopping the run (--startup_timeout_sec)"), error
    summary = read_summary(train_dir, "never_up")
    assert summary["stop_reason"] == "hung: rollout_worker_1" and summary["exit_code"] == 1
    assert list((train_dir / "never_up" / "checkpoints").glob("checkpoint_*.pt"))  # worker 0's training is saved
    assert_nothing_left(children, shm_before)


# Inside a mount namespace of its own: a 20 MiB tmpfs as --train_dir, filled up once the first checkpoint is saved.
FULL_DISK_DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    directory = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", directory], check=True)
    run = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in run.stdout:
        lines.append(line)
        if "checkpoint saved" in line and not any("filled" in seen for seen in lines):
            with open(directory + "/fill", "wb") as fill:
                try:
                    while True:
                        fill.write(bytes(65536))
                        fill.flush()
                except OSError:
                    pass
            lines.append("filled\\n")
    print("".join(lines))
    print("exit code", run.wait())
    """
)


@pytest.mark.slow
def test_a_disk_that_fills_during_a_run_neither_hangs_it_nor_passes_for_success(tmp_path):
    """The disk fills after the first checkpoint: TensorBoard's writes stop (one line), the time limit still ends
    the run, every later save names the full disk, and the exit code says the final checkpoint was not written."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine allows no mount namespace (unshare -rm), so no small disk to fill")
    directory = tmp_path / "small_disk"
    directory.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(FULL_DISK_DRIVER)
    train = train_command(directory, "full", *FAST, "--train_for_env_steps=100000000", "--train_for_seconds=15")
    train += ["--save_every_sec=2", "--report_every_sec=1"]
    started = time.time()
    result = subprocess.run(
        ["unshare", "-rm", sys.executable, str(driver), str(directory), *train],
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = result.stdout + result.stderr
    assert "exit code 1" in out, out[-3000:]
    assert time.time() - started < 120, out[-3000:]  # ended by its time limit, not a hang
    assert re.search(r"cannot write checkpoint \S+ in \S+ \(No space left on device \(0\.\d MiB free\)\)", out)
    assert "TensorBoard's writer thread died: OSError: [Errno 28] No space left on device" in out
    assert "writes stopped, its writer thread died" in out and "tensorboard off (" in out
    assert "the final checkpoint could not be written" in out
    assert "Traceback" not in out, out[-3000:]


# A user script whose learner process is killed inside its final save, as the OOM killer would kill it.
KILLED_IN_FINAL_SAVE_SCRIPT = textwrap.dedent(
    """
    import os
    import signal
    import sys

    from sfengine.learning.learner_worker import LearnerWorker
    from sfengine.train import main

    real_save = LearnerWorker.save


    def save(self):  # the name the save timer's connection looks up
        if self.stopped:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(self)


    LearnerWorker.save = save

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_learner_killed_in_its_final_save_makes_the_run_exit_1_naming_the_checkpoint_left(tmp_path, train_dir):
    shm_before = shm_entries()
    script = tmp_path / "killed_in_final_save.py"
    script.write_text(KILLED_IN_FINAL_SAVE_SCRIPT)
    process = start_script(script, train_dir, "killed", *FAST, "--train_for_seconds=8", "--save_every_sec=1")
    children = component_processes(process)
    output = process.communicate(timeout=180)[0]
    assert process.returncode == 1, output[-3000:]
    saved = sorted((train_dir / "killed" / "checkpoints").glob("checkpoint_*.pt"))
    assert saved, output[-3000:]
    line = f"the learner ended by signal SIGKILL before its final checkpoint; the last checkpoint is {saved[-1].name}"
    assert line in output, output[-3000:]
    summary = read_summary(train_dir, "killed")
    assert summary["exit_code"] == 1 and summary["stop_reason"].endswith("before its final checkpoint")
    assert_nothing_left(children, shm_before)


@pytest.mark.slow
def test_sigusr1_prints_the_main_processs_stacks_and_the_run_goes_on(train_dir):
    command = train_command(train_dir, "usr1", *FAST, "--train_for_env_steps=100000000", "--train_for_seconds=6")
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in run.stdout:
        if line.startswith("["):  # the first status line: the run is under way
            break
    run.send_signal(signal.SIGUSR1)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-3000:]
    assert "most recent call first" in err and "sfengine/train.py" in err, err[-3000:]
    assert read_summary(train_dir, "usr1")["stop_reason"] == "trained for 6 s"


@pytest.mark.slow
def test_a_healthy_worker_is_not_taken_for_hung_while_the_run_stops(train_dir):
    # A worker that took the stop goes quiet while its process ends: with a 1 s hang timeout it was flagged and
    # killed at every stop.
    result = run_train(train_dir, "quiet", *FAST, "--train_for_env_steps=16384", "--hang_timeout_sec=1", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "as the run is stopping" not in result.stderr, result.stderr[-3000:]


# Every env a rollout worker builds fails: the workers die at every start and are respawned, and the main
# process's own env (worker index -1) is fine.
CRASHING_WORKERS_SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.train import main


    def make_broken_in_workers(ctx):
        if ctx.worker_index >= 0:
            raise RuntimeError("the simulator's license server is unreachable")
        return gym.make("CartPole-v1")


    register_env("broken_in_workers", make_broken_in_workers)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_run_that_learned_from_nothing_does_not_exit_0(tmp_path, train_dir):
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING_WORKERS_SCRIPT)
    # Respawns allowed without end, so the clock, not --max_respawns, ends the run (a worker that dies at its start
    # is respawned a second after it, at most 16 times in the 8 s here).
    args = [*FAST, "--train_for_seconds=8", "--max_respawns=1000"]
    command = [sys.executable, str(script), *train_command(train_dir, "nothing", *args)[3:]]
    result = subprocess.run([*command, "--env=broken_in_workers"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = read_summary(train_dir, "nothing")
    assert summary["env_steps_this_run"] == 0 and summary["exit_code"] == 1
    assert summary["stop_reason"].endswith(
        "no env step was learned from: the rollout workers took no env step (the lines above say why)"
    ), summary["stop_reason"]
    assert "the simulator's license server is unreachable" in result.stderr
    # Not in a tight loop: a worker that dies at its start waits out a second before its successor starts.
    assert 2 <= sum(summary["respawns"].values()) <= 2 * (8 + 2), summary["respawns"]
