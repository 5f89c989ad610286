"""A fast multi-task env with init states, for testing the task and init-state machinery without a simulator.

``NUM_TASKS`` tasks with ``NUM_INIT_STATES`` init states each. The observation is the one-hot task id plus the
init state's index (scaled); the right action at every step is ``(task + init_state) % 2``; an episode lasts
``EPISODE_STEPS`` steps and succeeds when every action was right. ``reset(options={"task": t, "init_state": i})``
follows the multi-task contract of ``sfengine.env.multitask``; the assignment is echoed in the reset info.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sfengine.env.registry import EnvContext

NUM_TASKS = 4
NUM_INIT_STATES = 5
EPISODE_STEPS = 8


class MultiTaskToyEnv(gym.Env):
    num_tasks = NUM_TASKS
    max_episode_steps = EPISODE_STEPS
    task_names = [f"toy_task_{t}" for t in range(NUM_TASKS)]

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (NUM_TASKS + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.task = self.init_state = self.steps = self.correct = 0

    def num_init_states(self, task: int) -> int:
        return NUM_INIT_STATES

    def _obs(self) -> np.ndarray:
        obs = np.zeros(NUM_TASKS + 1, dtype=np.float32)
        obs[self.task] = 1.0
        obs[NUM_TASKS] = self.init_state / NUM_INIT_STATES
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        self.task = int(options.get("task", 0))
        self.init_state = int(options.get("init_state", 0))
        self.steps = self.correct = 0
        return self._obs(), {"task": self.task, "init_state": self.init_state}

    def step(self, action):
        reward = float(int(action) == (self.task + self.init_state) % 2)
        self.steps += 1
        self.correct += int(reward)
        done = self.steps >= EPISODE_STEPS
        info = {"success": self.correct == EPISODE_STEPS} if done else {}
        return self._obs(), reward, done, False, info


def make_multitask_toy(ctx: EnvContext) -> gym.Env:
    return MultiTaskToyEnv()
