"""``image_reach``: sparse_reach with the goal shown only in a camera image, the shape of a robot task learned from
pixels (proprioception as a vector, the scene as an image).

The point starts at the origin of [-1, 1]^2 and the goal lies at distance 0.5 in a random direction, as in
``sparse_reach``; reaching within 0.16 of it is success (reward 1, the episode terminates), else the episode is
truncated after 12 steps. The observation is ``position`` (the point, 2 floats) and ``image``: a 12 x 12 x 1
``uint8`` view of the square with the goal drawn as a blurred spot, so where it lies is read from the pixels'
intensities to a fraction of a pixel. Heading for the goal succeeds in 5 steps. A policy that cannot see it does
poorly: uniformly random actions succeed about 3% of the time, and the best blind policy (walk out to the circle,
then along it) about 30%.

Its only reward is reaching the goal and a failure is a truncation (the value bootstraps), so at gamma 0.99 reaching
in 5 steps or in 6 differs by 1% in value and learning is erratic from run to run; at ``--gamma=0.9``, 10%: SAC
learned it in every seed tried (benchmarks/README.md, "Off-policy learning from images").
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sfengine.env.registry import EnvContext
from sfengine_envs.sparse_reach import SparseReachEnv

IMAGE_SIZE = 12
EPISODE_STEPS = 12
SPOT_SIGMA = 1.0  # pixels


class ImageReachEnv(SparseReachEnv):
    def __init__(self, max_episode_steps: int = EPISODE_STEPS):
        super().__init__(max_episode_steps)
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (IMAGE_SIZE, IMAGE_SIZE, 1), np.uint8),
                "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        centers = (np.arange(IMAGE_SIZE) + 0.5) / IMAGE_SIZE * 2 - 1  # pixel centres in the square's coordinates
        self.pixel_x, self.pixel_y = np.meshgrid(centers, centers[::-1])  # row 0 at the top: y = +1
        self.image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed, options=options)
        pixel = 2.0 / IMAGE_SIZE
        squared = ((self.pixel_x - self.goal[0]) ** 2 + (self.pixel_y - self.goal[1]) ** 2) / pixel**2
        self.image = (255 * np.exp(-squared / (2 * SPOT_SIGMA**2)))[..., None].round().astype(np.uint8)
        return self._obs(), info

    def _obs(self) -> dict[str, np.ndarray]:
        return {"image": self.image, "position": self.position.astype(np.float32)}


def make_image_reach(ctx: EnvContext) -> gym.Env:
    return ImageReachEnv(ctx.max_episode_steps or EPISODE_STEPS)
