"""``sparse_reach``: a continuous task with a sparse 0/1 success reward, shaped like a robot task's RL signal.

A point starts at the origin of the square [-1, 1]^2; a goal lies at distance 0.5 in a random direction. The
observation is (position, goal); the action (2-dim, in [-1, 1]) moves the point by a tenth of itself. Reaching
within 0.16 of the goal is success: reward 1, ``info["success"] = True`` and the episode terminates. Otherwise it
is truncated after 40 steps with reward 0 throughout. A uniformly random policy succeeds about 17% of the time,
one that heads for the goal always (5 steps).

It is the kind of env on which learning must not depend on the reward's scale: returns are 0 or nearly 1, and a
user should not have to tune ``--reward_scale`` for it (``tests/learning/test_learning.py``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sfengine.env.registry import EnvContext

EPISODE_STEPS = 40
STEP_SIZE = 0.1
GOAL_DISTANCE = 0.5
SUCCESS_RADIUS = 0.16


class SparseReachEnv(gym.Env):
    def __init__(self, max_episode_steps: int = EPISODE_STEPS):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.max_episode_steps = max_episode_steps
        self.position = np.zeros(2)
        self.goal = np.zeros(2)
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.position, self.goal]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        angle = self.np_random.uniform(0.0, 2 * np.pi)
        self.goal = GOAL_DISTANCE * np.array([np.cos(angle), np.sin(angle)])
        self.position = np.zeros(2)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        move = STEP_SIZE * np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.position = np.clip(self.position + move, -1.0, 1.0)
        self.steps += 1
        success = bool(np.linalg.norm(self.position - self.goal) < SUCCESS_RADIUS)
        truncated = not success and self.steps >= self.max_episode_steps
        info = {"success": success} if success or truncated else {}
        return self._obs(), float(success), success, truncated, info


class ReachDemonstrator:
    """The scripted expert of the reach envs (``python -m sfengine.demos``): full speed towards the goal."""

    def reset(self, env) -> None:
        pass

    def act(self, env) -> np.ndarray:
        heading = (env.goal - env.position) / STEP_SIZE
        return np.clip(heading, -1.0, 1.0).astype(np.float32)


def make_sparse_reach(ctx: EnvContext) -> gym.Env:
    return SparseReachEnv(ctx.max_episode_steps or EPISODE_STEPS)


REACH_TASKS = 8
REACH_INIT_STATES = 10
START_RADIUS = 0.1


class MultiTaskReachEnv(SparseReachEnv):
    """``multitask_reach``: sparse_reach as a multi-task env with init states, the shape of a LIBERO suite.

    Task ``k`` puts the goal at angle ``2 pi k / 8`` (distance 0.5); init state ``i`` starts the point at
    distance 0.1 from the origin, at angle ``2 pi i / 10``. Nothing else is random: the G episodes of a (task, init
    state) group differ only by the policy's draws, which is what critic-free group advantages compare. A random
    policy succeeds about 17% of the time."""

    num_tasks = REACH_TASKS
    task_names = [f"reach_{45 * k}deg" for k in range(REACH_TASKS)]

    def num_init_states(self, task: int) -> int:
        return REACH_INIT_STATES

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        task, init_state = int(options.get("task", 0)), int(options.get("init_state", 0))
        goal_angle, start_angle = 2 * np.pi * task / REACH_TASKS, 2 * np.pi * init_state / REACH_INIT_STATES
        self.goal = GOAL_DISTANCE * np.array([np.cos(goal_angle), np.sin(goal_angle)])
        self.position = START_RADIUS * np.array([np.cos(start_angle), np.sin(start_angle)])
        return self._obs(), {"task": task, "init_state": init_state}


def make_multitask_reach(ctx: EnvContext) -> gym.Env:
    return MultiTaskReachEnv(ctx.max_episode_steps or EPISODE_STEPS)
