"""An env that emits NaN now and then: the steps that carry it are dropped where they enter (their episodes are not
learned from), the rest trains, and the count is on the status line and in summary.json; an env where they
dominate stops the run with a line that names it and exit code 1."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import FAST, read_summary, train_command
from sfengine.reporting.events import read_scalars
from sfengine.rollout.env_group import all_finite

NAN_ENV_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    import gymnasium as gym
    import numpy as np

    from sfengine import register_env
    from sfengine.train import main

    SHARE = float(os.environ["NAN_SHARE"])


    class SometimesNaN(gym.Wrapper):
        # A NaN in the observation (even steps) or the reward (odd steps) of SHARE of the steps.

        def reset(self, **kwargs):
            self.rng = np.random.default_rng()
            self.steps = 0
            return self.env.reset(**kwargs)

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            if self.rng.random() < SHARE:
                if self.steps % 2:
                    reward = float("nan")
                else:
                    obs = obs.copy()
                    obs[0] = np.nan
            return obs, reward, terminated, truncated, info


    def make_nan_cartpole(ctx):
        return SometimesNaN(gym.make("CartPole-v1"))


    register_env("nan_cartpole", make_nan_cartpole)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def test_all_finite_looks_at_float_arrays_only():
    assert all_finite({"state": np.zeros(3), "image": np.zeros((2, 2), np.uint8)})
    assert not all_finite({"state": np.array([0.0, np.inf])})
    assert not all_finite(np.array([np.nan], np.float32))
    assert not all_finite(np.array([[0.0, 0.0], [0.0, -np.inf]]))  # a small array, checked as a list
    assert not all_finite(np.r_[np.zeros(99), np.nan]) and all_finite(np.zeros(100))  # a large one, by numpy


def run_nan_env(tmp_path, train_dir, experiment: str, share: float, *args: str):
    script = tmp_path / "nan_train.py"
    script.write_text(NAN_ENV_SCRIPT)
    command = [sys.executable, str(script), *train_command(train_dir, experiment, *FAST, *args)[3:]]
    command += ["--env=nan_cartpole"]
    env = {**__import__("os").environ, "NAN_SHARE": str(share)}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_a_nan_now_and_then_costs_its_episode_not_the_learning(tmp_path, train_dir):
    result = run_nan_env(tmp_path, train_dir, "nan2", 0.02, "--train_for_env_steps=40000")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "nan2")
    # About 2% of the steps carried a NaN; each cost its episode, nothing else.
    assert 0.005 * summary["env_steps"] < summary["nonfinite_env_steps"] < 0.04 * summary["env_steps"], summary
    assert "non-finite env steps" in result.stdout
    assert "returned a NaN or infinite value; its episode is not learned from" in result.stderr
    scalars = read_scalars(train_dir / "nan2")
    assert all(point.value == 0 for point in scalars["train/nonfinite_steps"])  # no minibatch was skipped
    assert all(np.isfinite(point.value) for point in scalars["train/policy_loss"])
    # And it learned: the episodes that ended by themselves grew long (a random policy's: about 22 steps).
    assert summary["episode_len_mean"] > 40, summary


@pytest.mark.slow
def test_an_env_whose_steps_are_mostly_nan_stops_the_run_and_says_why(tmp_path, train_dir):
    result = run_nan_env(tmp_path, train_dir, "nan90", 0.9, "--train_for_env_steps=1000000")
    assert result.returncode == 1, result.stderr[-3000:]
    summary = read_summary(train_dir, "nan90")
    assert summary["stop_reason"].startswith("the env returned NaN or infinite observations or rewards in ")
    assert "fix the env, or clean its values in a wrapper" in summary["stop_reason"]
    assert summary["exit_code"] == 1
