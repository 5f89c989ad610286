"""``synthetic``: an env with a fixed CPU cost per step, to model a heavy simulator (LIBERO, say) in seconds.

Each step spins the CPU for ``--synthetic_step_ms`` (busy work, not sleep: a simulator keeps its core busy) and
returns a precomputed observation: ``--synthetic_obs=vector:64`` (float32 vector of 64) or ``image:84x84x3``
(``uint8`` image). Episodes last ``--synthetic_episode_steps`` steps. The reward is 1 when the action equals the
observation's hidden label, so a learner can make progress, but the env exists to measure the engine: with the
step cost known exactly, any FPS below ``num_envs_stepping_at_once / step cost`` is the engine's overhead.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np

from sfengine.config import ConfigError, option
from sfengine.env.registry import EnvContext

NUM_ACTIONS = 4
NUM_PRECOMPUTED = 64  # distinct observations, cycled: drawing fresh ones would add a cost of its own


def parse_obs_spec(spec: str) -> tuple[str, tuple[int, ...]]:
    """``vector:64`` -> ("vector", (64,)); ``image:84x84x3`` -> ("image", (84, 84, 3))."""
    match = re.fullmatch(r"(vector|image):(\d+(?:x\d+)*)", spec)
    shape = tuple(int(n) for n in match.group(2).split("x")) if match else ()
    if (
        match is None
        or (match.group(1) == "vector") != (len(shape) == 1)
        or (match.group(1) == "image" and len(shape) != 3)
    ):
        raise ValueError(
            f"synthetic observation {spec!r}: give vector:D (e.g. vector:64) or image:HxWxC (e.g. image:84x84x3)"
        )
    return match.group(1), shape


@dataclass
class SyntheticOptions:
    group: ClassVar[str] = "synthetic"
    synthetic_step_ms: float = option(2.0, "CPU time each step spins for, in milliseconds")
    synthetic_obs: str = option("vector:64", "observation: vector:D or image:HxWxC (uint8)")
    synthetic_episode_steps: int = option(100, "steps per episode")

    def validate(self, auto: set[str]) -> None:
        try:
            parse_obs_spec(self.synthetic_obs)
        except ValueError as exc:
            raise ConfigError(f"--synthetic_obs: {exc}") from None
        if self.synthetic_step_ms < 0 or self.synthetic_episode_steps < 1:
            raise ConfigError("--synthetic_step_ms must not be negative and --synthetic_episode_steps at least 1")


def busy_wait(seconds: float) -> None:
    """Keep this core busy for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SyntheticEnv(gym.Env):
    def __init__(self, step_ms: float = 2.0, obs: str = "vector:64", episode_steps: int = 100, seed: int = 0):
        kind, shape = parse_obs_spec(obs)
        rng = np.random.default_rng(seed)
        if kind == "vector":
            self.observation_space = gym.spaces.Box(-1.0, 1.0, shape, np.float32)
            self.frames = rng.uniform(-1.0, 1.0, (NUM_PRECOMPUTED, *shape)).astype(np.float32)
        else:
            self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
            self.frames = rng.integers(0, 256, (NUM_PRECOMPUTED, *shape), dtype=np.uint8)
        self.labels = rng.integers(0, NUM_ACTIONS, NUM_PRECOMPUTED)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.step_seconds, self.episode_steps = step_ms / 1000.0, episode_steps
        self.frame = self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.frames[self.frame], {}

    def step(self, action):
        busy_wait(self.step_seconds)
        reward = float(int(action) == self.labels[self.frame])
        self.frame = (self.frame + 1) % NUM_PRECOMPUTED
        self.steps += 1
        return self.frames[self.frame], reward, False, self.steps >= self.episode_steps, {}


def make_synthetic(ctx: EnvContext) -> gym.Env:
    options = ctx.options or SyntheticOptions()
    return SyntheticEnv(options.synthetic_step_ms, options.synthetic_obs, options.synthetic_episode_steps, ctx.seed)
