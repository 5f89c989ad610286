"""A tiny dict-observation task whose answer is only visible in the image.

Each step shows a 16 x 16 x 3 ``uint8`` image with either its left or its right half lit, plus a ``state`` vector
(the episode's progress, which says nothing about the answer). Action 0 is right for "left", action 1 for "right":
reward 1 when right. Episodes last 16 steps, so a random policy scores about 8 and a policy that reads the image
scores 16. An episode with at least 12 right answers reports ``info["success"] = True``. It exercises the CNN encoder, dict observations and uint8 storage end to end in seconds.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sfengine.env.registry import EnvContext

IMAGE_SIZE = 16
EPISODE_STEPS = 16
SUCCESS_THRESHOLD = 12


class ImageBanditEnv(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8),
                "state": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(2)
        self.side = 0
        self.steps = 0
        self.correct = 0

    def _obs(self) -> dict[str, np.ndarray]:
        image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        half = IMAGE_SIZE // 2
        image[:, self.side * half : (self.side + 1) * half] = 255
        return {"image": image, "state": np.array([self.steps / EPISODE_STEPS], dtype=np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = self.correct = 0
        self.side = int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.steps += 1
        self.correct += int(reward)
        self.side = int(self.np_random.integers(2))
        done = self.steps >= EPISODE_STEPS
        info = {"success": self.correct >= SUCCESS_THRESHOLD} if done else {}
        return self._obs(), reward, False, done, info


def make_image_bandit(ctx: EnvContext) -> gym.Env:
    return ImageBanditEnv()
