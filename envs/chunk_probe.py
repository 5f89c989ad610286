"""``chunk_probe`` and ``chunk_probe_truncated``: episodes of ``EPISODE_STEPS`` steps that show the order in which
actions reach the env, for testing action chunks (``--action_chunk``).

The observation is the number of steps taken in the episode; the reward of a step is the first component of its
action (after the engine's clip to [-1, 1]). An episode ends after 6 steps, so chunks of 4 end inside the second
chunk: terminated in ``chunk_probe``, truncated (a time limit) in ``chunk_probe_truncated``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sfengine.env.registry import EnvContext

EPISODE_STEPS = 6


class ChunkProbeEnv(gym.Env):
    max_episode_steps = EPISODE_STEPS

    def __init__(self, truncate: bool):
        self.observation_space = gym.spaces.Box(0.0, float(EPISODE_STEPS), (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.truncate = truncate
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        ended = self.steps >= EPISODE_STEPS
        obs = np.array([self.steps], np.float32)
        return obs, float(action[0]), ended and not self.truncate, ended and self.truncate, {}


def make_chunk_probe(ctx: EnvContext) -> gym.Env:
    return ChunkProbeEnv(truncate=False)


def make_chunk_probe_truncated(ctx: EnvContext) -> gym.Env:
    return ChunkProbeEnv(truncate=True)
