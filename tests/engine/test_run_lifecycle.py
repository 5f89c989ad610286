"""A real run, as a user drives it: stop with SIGINT, resume, bad checkpoints, TensorBoard, custom envs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from helpers import leaked_shm, read_summary, run_train, shm_entries, train_command

FAST = ["--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=4", "--worker_num_splits=2"]


def wait_for_training(process: subprocess.Popen, timeout: float = 120) -> None:
    """Read status lines until the learner has consumed env steps."""
    deadline = time.time() + timeout
    for line in process.stdout:
        if "steps" in line and "FPS" in line and line.split("steps")[1].split()[0].replace(",", "") != "0":
            return
        assert time.time() < deadline, "training made no progress"
    raise AssertionError(f"the run ended early with code {process.wait()}")


def start_long_training(train_dir, experiment: str) -> subprocess.Popen:
    """Start a run that would go on for a long time, and return once the learner has trained."""
    process = subprocess.Popen(
        train_command(train_dir, experiment, *FAST, "--train_for_env_steps=100000000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_training(process)
    return process


def test_sigint_saves_a_checkpoint_and_leaves_no_process_or_shared_memory(train_dir):
    shm_before = shm_entries()
    process = start_long_training(train_dir, "interrupted")
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

    # Resume continues the env-step count from the checkpoint.
    target = summary["env_steps"] + 8192
    result = run_train(train_dir, "interrupted", *FAST, f"--train_for_env_steps={target}")
    assert result.returncode == 0, result.stderr
    assert "resuming 'interrupted'" in result.stdout
    resumed = read_summary(train_dir, "interrupted")
    assert resumed["env_steps"] >= target
    assert resumed["env_steps_this_run"] < resumed["env_steps"]
    assert resumed["policy_version"] > summary["policy_version"]


def test_corrupt_checkpoint_is_an_error_not_a_fresh_start(train_dir):
    result = run_train(train_dir, "corrupt", *FAST, "--train_for_env_steps=2048")
    assert result.returncode == 0, result.stderr
    (checkpoint,) = (train_dir / "corrupt" / "checkpoints").glob("checkpoint_*.pt")
    checkpoint.write_bytes(b"not a checkpoint")
    result = run_train(train_dir, "corrupt", *FAST, "--train_for_env_steps=4096")
    assert result.returncode == 2
    assert "cannot load checkpoint" in result.stderr and "--restart_behavior=restart" in result.stderr


def test_checkpoint_of_another_model_is_rejected(train_dir):
    assert run_train(train_dir, "shape", *FAST, "--train_for_env_steps=2048").returncode == 0
    result = run_train(train_dir, "shape", *FAST, "--hidden_sizes=32", "--train_for_env_steps=4096")
    assert result.returncode == 2
    assert "does not fit this model" in result.stderr


def test_run_writes_config_tensorboard_checkpoint_and_summary(train_dir):
    result = run_train(train_dir, "files", *FAST, "--train_for_env_steps=20000", "--keep_checkpoints=2")
    assert result.returncode == 0, result.stderr
    experiment = train_dir / "files"
    assert (experiment / "config.json").is_file()
    summary = read_summary(train_dir, "files")
    for key in ("env_steps", "wall_seconds", "fps", "episode_return_mean", "episode_len_mean", "episodes"):
        assert summary[key] is not None, key
    assert summary["env_steps"] >= 20000 and summary["fps"] > 0
    events = b"".join(p.read_bytes() for p in (experiment / "tensorboard").glob("events.out.tfevents.*"))
    for tag in (b"perf/fps_10s", b"episodes/episode_return_mean", b"train/loss", b"train/clip_fraction"):
        assert tag in events, tag


def test_restart_moves_the_old_run_aside(train_dir):
    assert run_train(train_dir, "again", *FAST, "--train_for_env_steps=2048").returncode == 0
    result = run_train(train_dir, "again", *FAST, "--train_for_env_steps=2048", "--restart_behavior=restart")
    assert result.returncode == 0, result.stderr
    assert read_summary(train_dir, "again")["env_steps_this_run"] == read_summary(train_dir, "again")["env_steps"]
    assert len(list(train_dir.glob("again.*"))) == 1  # the previous run, kept


USER_SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.train import main


    def make_short_cartpole(ctx):
        return gym.make("CartPole-v1", max_episode_steps=25)


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


    register_env("short_cartpole", make_short_cartpole)
    register_env("flaky_cartpole", make_flaky_cartpole)
    register_env("lambda_env", lambda ctx: gym.make("CartPole-v1"))

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def test_env_registered_from_a_user_script_runs_in_spawned_workers(tmp_path, train_dir):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    base = [sys.executable, str(script), f"--train_dir={train_dir}", *FAST[1:]]
    result = subprocess.run(
        [*base, "--env=short_cartpole", "--experiment=user", "--train_for_env_steps=8192"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert read_summary(train_dir, "user")["episode_len_mean"] <= 25  # the user's time limit was applied

    result = subprocess.run(
        [*base, "--env=lambda_env", "--experiment=lam"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert "module-level function" in result.stderr


def test_a_dead_worker_fails_the_run_cleanly_and_names_it(train_dir):
    process = start_long_training(train_dir, "crash")
    children = psutil.Process(process.pid).children(recursive=True)
    names = {c.name(): c for c in children}
    assert {"sfe-rollout-0", "sfe-rollout-1", "sfe-inference-0", "sfe-learner"} <= set(names), names
    names["sfe-rollout-1"].kill()
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output
    assert "process died: rollout_worker_1_process" in output
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert list((train_dir / "crash" / "checkpoints").glob("checkpoint_*.pt"))  # the learner still saved


def test_second_sigint_forces_the_exit_and_leaves_no_process(train_dir):
    shm_before = shm_entries()
    process = start_long_training(train_dir, "forced")
    children = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)  # two signals sent at once may be delivered as one
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130, output
    assert "forced exit" in output
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()


def test_an_env_that_raises_is_rebuilt_and_the_run_goes_on(tmp_path, train_dir):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), f"--train_dir={train_dir}", *FAST[1:], "--env=flaky_cartpole"]
        + ["--experiment=flaky", "--train_for_env_steps=20000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "flaky")
    assert summary["env_failures"] > 10
    assert summary["episodes"] > 100  # the workers kept collecting
    assert "step failed; rebuilding the env" in result.stderr


def test_multi_task_env_gets_assignments_and_reports_success_per_task(train_dir):
    result = run_train(train_dir, "tasks", *FAST[1:], "--env=multitask_toy", "--train_for_env_steps=10000")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "tasks")
    assert set(summary["per_task_success"]) == {f"toy_task_{t}" for t in range(4)}
    assert all(0.0 <= v <= 1.0 for v in summary["per_task_success"].values())
    # The status line shows each task's success as it goes.
    assert re.search(r"success per task: 0:[0-9.]+ 1:[0-9.]+ 2:[0-9.]+ 3:[0-9.]+", result.stdout)


HANGING_SCRIPT = """
import sys
import time

import gymnasium as gym

from sfengine import register_env
from sfengine.train import main
from sfengine_envs.multitask_toy import make_multitask_toy


def stuck_in_the_simulator():
    time.sleep(100_000)  # as a deadlocked simulator would: the step never returns


class HangsOnce(gym.Wrapper):
    # Env 3 of rollout worker 1 hangs in its 3000th step, a few seconds into the run.

    def __init__(self, env, ctx):
        super().__init__(env)
        self.hangs = (ctx.worker_index, ctx.env_index) == (1, 3)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.hangs and self.steps == 3000:
            stuck_in_the_simulator()
        return self.env.step(action)


def make_hanging_toy(ctx):
    return HangsOnce(make_multitask_toy(ctx), ctx)


register_env("hanging_toy", make_hanging_toy)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def test_a_hung_env_is_named_with_its_stack_and_the_run_stops_cleanly(tmp_path, train_dir):
    script = tmp_path / "hangs.py"
    script.write_text(HANGING_SCRIPT)
    shm_before = shm_entries()
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=hang", *FAST[1:]]
    command += ["--env=hanging_toy", "--hang_timeout_sec=8", "--train_for_env_steps=100000000"]
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = []
    while not children and process.poll() is None:
        time.sleep(0.5)
        children = psutil.Process(process.pid).children(recursive=True)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 1, stderr[-3000:]
    assert time.time() - started < 120  # noticed after 8 s of silence, not left hanging
    # The error names the worker, the env and what it was playing; its stack shows where it is stuck.
    error = next(line for line in stderr.splitlines() if "sent no report" in line)
    assert "rollout_worker_1 sent no report" in error and "stuck in env 3 (split 1), task" in error, error
    assert re.search(r"task \d+ 'toy_task_\d+', init state \d+", error), error
    assert "stuck_in_the_simulator" in stderr  # the hung process's own stack, printed by faulthandler
    assert list((train_dir / "hang" / "checkpoints").glob("checkpoint_*.pt"))  # the learner still saved
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"stray processes: {alive}"
    assert leaked_shm(shm_before) == set()
