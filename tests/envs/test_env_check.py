"""An env that breaks gymnasium's API or its own spaces is one line and exit 2 before any process starts: one reset
and one step of it are checked in the main process (sfengine.env.check)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest

from helpers import FAST, read_summary
from sfengine.env.check import EnvAPIError, check_env_api
from sfengine.env.spaces import obs_spec_from_space


class Toy(gym.Env):
    """A 3-dim observation, two actions; each variant below breaks one thing."""

    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 1.0, False, False, {}


class OldGymStep(Toy):
    def step(self, action):
        return np.zeros(3, np.float32), 1.0, False, {}


class WrongShape(Toy):
    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, False, {}


class ResetRaises(Toy):
    def reset(self, seed=None, options=None):
        raise RuntimeError("simulator asset missing: table.xml")


class ObsOnlyReset(Toy):
    def reset(self, seed=None, options=None):
        return np.zeros(3, np.float32)


class ArrayReward(Toy):
    def step(self, action):
        return np.zeros(3, np.float32), np.ones(2), False, False, {}


class NoneInfo(Toy):
    # Passed the check once, then every rollout worker died reading it (info.get) until --max_respawns.
    def step(self, action):
        return np.zeros(3, np.float32), 1.0, False, False, None


class CloseRaises(Toy):
    def close(self):
        raise RuntimeError("viewer already gone")


@pytest.mark.parametrize(
    "env, message",
    [
        (OldGymStep(), "step() returned 4 values; gymnasium's API returns 5: (obs, reward, terminated, truncated"),
        (WrongShape(), "step() returned an observation of shape (4,); its observation_space says (3,)"),
        (ResetRaises(), "reset() raised RuntimeError: simulator asset missing: table.xml"),
        (ObsOnlyReset(), "reset() returned ndarray array([0., 0., 0.], dtype=float32); gymnasium's API returns"),
        (ArrayReward(), "step() returned the reward ndarray array([1., 1.]); give one number a step"),
        (NoneInfo(), "step() returned the info NoneType None; gymnasium's API gives a dict: return {}"),
    ],
)
def test_an_env_that_breaks_the_api_is_named_with_the_fix(env, message):
    with pytest.raises(EnvAPIError) as info:
        check_env_api(env, obs_spec_from_space(env.observation_space), 0, None)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda ctx: None, "env 'CartPole-v1': its factory returned NoneType, not an env with an action_space"),
        (lambda ctx: CloseRaises(), "env 'CartPole-v1': close() raised RuntimeError: viewer already gone"),
    ],
    ids=["a factory that returns nothing", "close() raises"],
)
def test_a_factory_without_an_env_or_an_env_whose_close_raises_is_one_line(tmp_path, factory, message):
    from sfengine.config import ConfigError, parse_config
    from sfengine.train import probe_env

    with pytest.raises(ConfigError) as info:
        probe_env(parse_config([f"--train_dir={tmp_path}"]), factory)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_an_env_that_keeps_the_api_passes():
    env = Toy()
    check_env_api(env, obs_spec_from_space(env.observation_space), 0, None)
    check_env_api(gym.make("CartPole-v1"), obs_spec_from_space(gym.make("CartPole-v1").observation_space), 0, None)


BROKEN_ENV_SCRIPT = textwrap.dedent(
    """
    import pathlib
    import sys
    import time

    import gymnasium as gym
    import numpy as np

    from sfengine import register_env
    from sfengine.train import main


    class OldGymCartPole(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated or truncated, info


    def make_old_gym_cartpole(ctx):
        return OldGymCartPole(gym.make("CartPole-v1"))


    class HangsInStep(gym.Wrapper):
        def step(self, action):
            pathlib.Path(sys.argv[-1].split("=", 1)[1], "in_step").touch()
            time.sleep(1000)


    def make_hanging(ctx):
        return HangsInStep(gym.make("CartPole-v1"))


    def make_hanging_in_its_factory(ctx):
        time.sleep(1000)


    class GrowsMidRun(gym.Wrapper):
        # Passes the start's check, then (its 51st step on) adds a dimension to its observations.
        steps = 0

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            return (np.append(obs, 0.0) if self.steps > 50 else obs), reward, terminated, truncated, info


    def make_grows_mid_run(ctx):
        return GrowsMidRun(gym.make("CartPole-v1"))


    class HangsInClose(gym.Wrapper):
        def close(self):
            time.sleep(1000)


    def make_hangs_in_close_in_the_workers(ctx):
        env = gym.make("CartPole-v1")
        return HangsInClose(env) if ctx.worker_index >= 0 else env  # (the start's check closes its env)


    register_env("old_gym_cartpole", make_old_gym_cartpole)
    register_env("hanging", make_hanging)
    register_env("hanging_in_its_factory", make_hanging_in_its_factory)
    register_env("grows_mid_run", make_grows_mid_run)
    register_env("hangs_in_close", make_hangs_in_close_in_the_workers)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def test_a_step_of_the_old_gym_api_stops_the_run_before_it_starts(tmp_path):
    script = tmp_path / "my_train.py"
    script.write_text(BROKEN_ENV_SCRIPT)
    command = [sys.executable, str(script), "--env=old_gym_cartpole", f"--train_dir={tmp_path}", "--experiment=old"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: env 'old_gym_cartpole': step() returned 4 values; gymnasium's API returns 5: (obs, "
        "reward, terminated, truncated, info) (the old gym API's done is terminated or truncated: a time limit is a "
        "truncation)"
    ]
    assert not (tmp_path / "old").exists()


def interruptible_by_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_the_check_of_an_env_that_never_returns_is_one_line(tmp_path):
    # The check plays one step in the main process: an env that never returns from it held the run there, and
    # Ctrl-C gave a KeyboardInterrupt traceback.
    script = tmp_path / "hanging.py"
    script.write_text(BROKEN_ENV_SCRIPT)
    command = [sys.executable, str(script), "--env=hanging", "--experiment=hangs", f"--train_dir={tmp_path}"]
    # Ctrl-C as a terminal's foreground job gets it: SIGINT neither ignored nor blocked, whatever this pytest
    # inherited (a suite started in the background by a non-interactive shell ignores SIGINT, and so did the
    # command, which then slept on in its env's step: the test failed so in two such suites).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible_by_ctrl_c
    )
    deadline = time.time() + 60
    while not (tmp_path / "in_step").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    servers = [p for p in psutil.Process(process.pid).children() if "forkserver" in " ".join(p.cmdline())]
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
        process.kill()
        pytest.fail(f"no exit 60 s after SIGINT: {[line for line in status if line.startswith(('Sig', 'Shd'))]}")
    # The script's fork server (spawned: main() called by a script) ended with it. Left to end by itself, it was
    # still importing torch and held the script's output open 2-7 s past the script's exit.
    assert servers and not [server for server in servers if server.is_running()]
    _, err = process.communicate(timeout=10)
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == [
        "sfengine.train: interrupted before the run started (in its checks of the env and options)"
    ]


@pytest.mark.parametrize(
    "env, stage",
    [("hanging", "its first reset and step (the start's check of the env)"), ("hanging_in_its_factory", "its factory")],
)
def test_an_env_that_hangs_in_the_start_check_stops_the_run_with_its_stack_past_the_startup_timeout(
    tmp_path, env, stage
):
    # Nothing else watches the main process's check: it waited for the env forever, and only Ctrl-C ended it.
    script = tmp_path / "hanging.py"
    script.write_text(BROKEN_ENV_SCRIPT)
    args = [f"--env={env}", "--experiment=hangs", "--startup_timeout_sec=3", f"--train_dir={tmp_path}"]
    started = time.time()
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"sfengine.train: error: env '{env}': {stage} did not return within 3 s (--startup_timeout_sec; the stack "
        "it was in is above): fix the hang, or raise --startup_timeout_sec if the env takes that long"
    )
    assert "time.sleep(1000)" in result.stderr  # where it hung
    assert time.time() - started < 60
    assert not (tmp_path / "hangs").exists()


def test_an_env_whose_observation_changes_shape_mid_run_stops_the_run_naming_it(tmp_path):
    # The write into the shared buffers raised a numpy broadcast error in the worker, which was respawned until
    # --max_respawns and the run stopped as "process died: rollout_worker_0_process", the env never named.
    script = tmp_path / "grows.py"
    script.write_text(BROKEN_ENV_SCRIPT)
    args = ["--env=grows_mid_run", "--experiment=grows", f"--train_dir={tmp_path}", *FAST[1:]]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    summary = read_summary(tmp_path, "grows")
    assert re.fullmatch(
        r"rollout worker \d, env \d \(grows_mid_run\) returned an observation of shape \(5,\) mid-run; its "
        r"observation_space \(and its first observations\) say \(4,\): make them agree",
        summary["stop_reason"],
    ), summary["stop_reason"]
    assert summary["respawns"] == {}  # a fresh worker would meet the same env


def test_envs_that_hang_in_close_cost_the_stop_seconds_not_its_timeout_and_are_named(tmp_path):
    # The workers waited in the envs' close() until the stop's 60 s timeout terminated them, naming the worker only.
    script = tmp_path / "hangs_in_close.py"
    script.write_text(BROKEN_ENV_SCRIPT)
    args = ["--env=hangs_in_close", "--experiment=close", f"--train_dir={tmp_path}", *FAST[1:]]
    started = time.time()
    result = subprocess.run(
        [sys.executable, str(script), *args, "--train_for_env_steps=3000"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert time.time() - started < 50, result.stderr[-2000:]
    assert "did not stop within" not in result.stderr
    # Each of the 2 workers names the env it met hanging, with its stack, and leaves the rest.
    named = re.findall(r"rollout worker (\d), env \d \(hangs_in_close\): close\(\) did not return", result.stderr)
    assert sorted(named) == ["0", "1"], result.stderr[-3000:]
    assert "time.sleep(1000)" in result.stderr
