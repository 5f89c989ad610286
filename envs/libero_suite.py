"""LIBERO suites as multi-task gymnasium envs: ``libero_spatial``, ``libero_object``, ``libero_goal``,
``libero_10`` and ``libero_90``.

One env process plays any task of its suite. ``reset(options={"task": t, "init_state": i})`` follows the
multi-task contract of ``sfengine.multitask``:

    soft reset of the simulator (about 30 ms; rebuilt only when the task changes, a few seconds)
    -> set_init_state(init_states[t][i]) -> ``settle_steps`` no-op steps with the gripper open

Observations (``obs_mode``):

- ``state`` (default, no renderer is created): ``proprio`` (robot0_proprio-state), ``object`` (object-state,
  zero-padded to the suite's largest task so that every task shares one space) and ``task`` (one-hot task id:
  the MLP's first layer on it is a learned task embedding).
- ``rgb``: ``agentview`` and ``wrist`` ``uint8`` images of ``image_size`` pixels, flipped upright, plus
  ``proprio`` and ``task``.

Reward: ``reward_coef`` on success (sparse), and the episode terminates on success. Episodes are truncated at
the suite's step limit (the simulator's own horizon is far above it and must never be reached). The task's
language instruction is in the info of every reset and of the last step.
"""

from __future__ import annotations

import ctypes.util
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import gymnasium as gym
import numpy as np

from sfengine.env_registry import EnvContext

# Step limits commonly used with each suite.
SUITE_STEP_LIMITS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
GRIPPER_OPEN_NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)
OBJECT_STATE_PER_OBJECT = 14  # position 3, quaternion 4, and both relative to the end effector


class LiberoNotInstalledError(ImportError):
    pass


def choose_headless_gl() -> None:
    """Pick MuJoCo's headless renderer for image observations, unless the user chose one: EGL, else OSMesa."""
    if "MUJOCO_GL" in os.environ:
        return
    for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            return
    raise RuntimeError(
        "rgb observations need headless rendering: install Mesa EGL (apt-get install libegl1) or OSMesa "
        "(apt-get install libosmesa6), or use --libero_obs_mode=state"
    )


def import_libero():
    try:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv
    except ImportError as exc:
        raise LiberoNotInstalledError(
            f"LIBERO is not installed ({exc}); install it with: pip install -e '.[libero]'"
        ) from None
    return benchmark, get_libero_path, ControlEnv


@dataclass(frozen=True)
class SuiteTask:
    name: str
    instruction: str
    bddl_file: str
    init_states: np.ndarray  # [num_init_states, state_dim]
    num_objects: int


def count_bddl_objects(bddl_file: str) -> int:
    """Movable objects of a task, read from its BDDL ``(:objects ...)`` block (fixtures are not observed)."""
    text = Path(bddl_file).read_text()
    match = re.search(r"\(:objects(.*?)\)", text, re.S)
    if match is None:
        return 0
    # Each line reads "name_1 name_2 - type": count the names.
    return sum(len(line.split(" - ")[0].split()) for line in match.group(1).splitlines() if " - " in line)


@cache
def load_suite(suite: str) -> tuple[SuiteTask, ...]:
    benchmark, get_libero_path, _ = import_libero()
    suites = benchmark.get_benchmark_dict()
    if suite not in suites:
        raise ValueError(f"unknown LIBERO suite '{suite}'; known: {', '.join(sorted(suites))}")
    bench = suites[suite]()
    tasks = []
    for i in range(bench.n_tasks):
        task = bench.get_task(i)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        tasks.append(SuiteTask(task.name, task.language, bddl, bench.get_task_init_states(i), count_bddl_objects(bddl)))
    return tuple(tasks)


class LiberoSuiteEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(
        self,
        suite: str,
        obs_mode: str = "state",
        image_size: int = 128,
        settle_steps: int = 10,
        max_episode_steps: int = 0,
        reward_coef: float = 1.0,
    ):
        if obs_mode not in ("state", "rgb"):
            raise ValueError(f"obs_mode must be 'state' or 'rgb', not {obs_mode!r}")
        if obs_mode == "rgb":
            choose_headless_gl()  # before the first import of robosuite, which fixes the GL backend
        self.suite, self.obs_mode, self.image_size = suite, obs_mode, image_size
        self.settle_steps, self.reward_coef = settle_steps, reward_coef
        self.max_episode_steps = max_episode_steps or SUITE_STEP_LIMITS[suite]
        self.tasks = load_suite(suite)
        self.num_tasks = len(self.tasks)
        self.task_names = [task.name for task in self.tasks]
        self.object_dim = OBJECT_STATE_PER_OBJECT * max(task.num_objects for task in self.tasks)
        spaces = {
            "proprio": gym.spaces.Box(-np.inf, np.inf, (39,), np.float32),
            "task": gym.spaces.Box(0.0, 1.0, (self.num_tasks,), np.float32),
        }
        if obs_mode == "state":
            spaces["object"] = gym.spaces.Box(-np.inf, np.inf, (self.object_dim,), np.float32)
        else:
            image = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
            spaces.update(agentview=image, wrist=image)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.sim = None
        self.task = -1
        self.steps = 0

    def num_init_states(self, task: int) -> int:
        return len(self.tasks[task].init_states)

    def instruction(self, task: int) -> str:
        return self.tasks[task].instruction

    def _build_sim(self, task: int) -> None:
        _, _, control_env = import_libero()
        if self.sim is not None:
            self.sim.close()
        rgb = self.obs_mode == "rgb"
        self.sim = control_env(
            bddl_file_name=self.tasks[task].bddl_file,
            has_renderer=False,
            has_offscreen_renderer=rgb,
            use_camera_obs=rgb,
            camera_names=["agentview", "robot0_eye_in_hand"],
            camera_heights=self.image_size,
            camera_widths=self.image_size,
            hard_reset=False,
        )
        self.task = task

    def _obs(self, raw: dict) -> dict[str, np.ndarray]:
        task_one_hot = np.zeros(self.num_tasks, dtype=np.float32)
        task_one_hot[self.task] = 1.0
        obs = {"proprio": raw["robot0_proprio-state"].astype(np.float32), "task": task_one_hot}
        if self.obs_mode == "state":
            objects = np.zeros(self.object_dim, dtype=np.float32)
            state = raw["object-state"]
            if len(state) > self.object_dim:
                raise RuntimeError(
                    f"{self.task_names[self.task]}: object-state has {len(state)} values, more than the "
                    f"{self.object_dim} derived from the suite's BDDL files"
                )
            objects[: len(state)] = state
            obs["object"] = objects
        else:
            # Rendered images come out upside down: flip both axes.
            obs["agentview"] = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])
            obs["wrist"] = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        task = int(options.get("task", 0))
        init_state = int(options.get("init_state", 0))
        if task != self.task or self.sim is None:
            self._build_sim(task)
        # Fixture placement comes from the global RNG at reset and is not part of the init state: seed it from
        # the assignment, so an init state always starts the same episode.
        self.sim.seed(task * 1000 + init_state)
        self.sim.reset()
        # A soft reset keeps the gripper's last command, which makes a reused env drift from a fresh one.
        for robot in self.sim.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        raw = self.sim.set_init_state(self.tasks[task].init_states[init_state])
        for _ in range(self.settle_steps):
            raw, _, _, _ = self.sim.step(GRIPPER_OPEN_NOOP)
        self.steps = 0
        info = {"task": task, "init_state": init_state, "instruction": self.tasks[task].instruction}
        return self._obs(raw), info

    def step(self, action):
        raw, _, _, _ = self.sim.step(np.asarray(action, dtype=np.float64))
        self.steps += 1
        success = bool(self.sim.check_success())
        truncated = not success and self.steps >= self.max_episode_steps
        info = {"success": success} if success or truncated else {}
        if info:
            info["instruction"] = self.tasks[self.task].instruction
        return self._obs(raw), self.reward_coef * float(success), success, truncated, info

    def close(self):
        if self.sim is not None:
            self.sim.close()
            self.sim = None


def make_libero_env(suite: str, ctx: EnvContext) -> gym.Env:
    """Factory of ``--env=<suite>``; registered per suite with functools.partial, which pickles for spawned
    workers."""
    options = ctx.env_config
    return LiberoSuiteEnv(
        suite,
        obs_mode=options.libero_obs_mode if options else "state",
        image_size=options.libero_image_size if options else 128,
        reward_coef=options.libero_reward_coef if options else 1.0,
        max_episode_steps=ctx.max_episode_steps,
    )
