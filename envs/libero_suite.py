"""LIBERO suites as multi-task gymnasium envs: ``libero_spatial``, ``libero_object``, ``libero_goal``,
``libero_10`` and ``libero_90``.

One env plays any task of its suite. ``reset(options={"task": t, "init_state": i})`` follows the
multi-task contract of ``sfengine.env.multitask``:

    simulator of task t (kept from an earlier episode, or built: 1-2 s)
    -> soft reset (about 30 ms) -> set_init_state(init_states[t][i]) -> ``settle_steps`` no-op steps, gripper open

Each task has its own scene, so switching task means another simulator. Building one costs 1-2 s, a good part
of an episode, while each kept simulator holds about 0.1 GB in state mode. An env therefore keeps up to
``sim_cache`` simulators, one per task it played (``--libero_sim_cache``; ``auto`` sizes it from memory). Tasks
come round-robin, a cyclic order in which evicting the least recently used simulator would miss every time; the
most recently used one is evicted instead, so a cache of K simulators still serves K-1 tasks of each cycle.

Observations (``obs_mode``):

- ``state`` (default): ``proprio`` (robot0_proprio-state), ``object`` (object-state, zero-padded to the suite's
  largest task so that every task shares one space) and ``task`` (one-hot task id: the MLP's first layer on it
  is a learned task embedding). No renderer is created, and the simulators are built without the scene's
  textures, which only a renderer reads: 0.1 GB a simulator instead of 0.25, bit-identical physics.
- ``rgb``: ``agentview`` and ``wrist`` ``uint8`` images of ``image_size`` pixels, flipped upright, plus
  ``proprio`` and ``task``.

Videos (``render_size`` > 0, set by ``sfengine.evaluate --video_per_task``): ``render()`` returns the agentview
camera at that size, upright. The observations stay as they are: the camera is only rendered when ``render()``
is called, and its GL context is created on the first call, so an env that records nothing never holds one.

Reward: ``reward_coef`` on success (sparse), and the episode terminates on success. Episodes are truncated at
the suite's step limit (the simulator's own horizon is far above it and must never be reached). The task's
language instruction is in the info of every reset and of the last step.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import re
import xml.etree.ElementTree as ElementTree
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np

from sfengine.config import AUTO, Config, ConfigError, option
from sfengine.engine.sizing import Machine
from sfengine.env.multitask import TaskInfo, selected_init_states
from sfengine.env.registry import EnvContext
from sfengine.tasks.scheduler import shard_pairs

# Step limits commonly used with each suite.
SUITE_STEP_LIMITS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
# Proportional memory (PSS) measured here (2 cores, benchmarks.libero_memory): a rollout worker process costs
# 0.45 GB plus, for each simulator, 0.08-0.10 GB in state mode (built without textures, see _build_sim) and
# 0.7-0.8 GB in rgb mode (with its textures and cameras; the first one 1.1 GB at 64 pixels). The runner, learner
# and inference processes hold 0.9 GB together.
WORKER_PROCESS_GB = 0.45
SIMULATOR_GB = {"state": 0.10, "rgb": 0.8}
OTHER_PROCESSES_GB = 0.9
MEMORY_HEADROOM = 0.85  # of the memory available at start
CAMERA_OBSERVABLES = ("agentview_image", "robot0_eye_in_hand_image")
# robosuite observables by modality that each observation mode reads (proprio-state, object-state, the cameras)
OBSERVED_MODALITIES = {"state": ("robot0_proprio", "object"), "rgb": ("robot0_proprio", "image")}
GRIPPER_OPEN_NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)
OBJECT_STATE_PER_OBJECT = 14  # position 3, quaternion 4, and both relative to the end effector


def without_textures(xml: str) -> str:
    """The MJCF model minus its textures and the materials' references to them. Only a renderer reads textures,
    and a LIBERO scene decodes about 140 MB of them: most of a state-mode simulator's memory. The physics and
    every state observation are bit-identical without them (tests/envs/test_libero.py)."""
    root = ElementTree.fromstring(xml)
    for asset in root.iter("asset"):
        for texture in asset.findall("texture"):
            asset.remove(texture)
        for material in asset.findall("material"):
            material.attrib.pop("texture", None)
    return ElementTree.tostring(root, encoding="unicode")


@contextlib.contextmanager
def building_without_textures():
    """While a robosuite env is constructed, its simulator is compiled from the model without textures (a model
    that does not compile so falls back to the full one)."""
    from robosuite.utils.binding_utils import MjSim

    stock = MjSim.__dict__["from_xml_string"]

    def from_xml_string(cls, xml):
        try:
            return stock.__func__(cls, without_textures(xml))
        except (ValueError, ElementTree.ParseError):
            return stock.__func__(cls, xml)

    MjSim.from_xml_string = classmethod(from_xml_string)
    try:
        yield
    finally:
        MjSim.from_xml_string = stock


@cache
def _libc():
    path = ctypes.util.find_library("c")
    return ctypes.CDLL(path) if path else None


def release_free_heap() -> None:
    """Return the heap's free pages to the OS. Building a simulator leaves its compiler's temporaries freed but
    kept by glibc (0.6 GB in a worker of 20 simulators); they would count against the next process."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


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
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        suite: str,
        obs_mode: str = "state",
        image_size: int = 128,
        settle_steps: int = 10,
        max_episode_steps: int = 0,
        reward_coef: float = 1.0,
        sim_cache: int = 1,
        render_size: int = 0,
        fast_step: bool = True,
    ):
        if obs_mode not in ("state", "rgb"):
            raise ValueError(f"obs_mode must be 'state' or 'rgb', not {obs_mode!r}")
        if obs_mode == "rgb" or render_size:
            choose_headless_gl()  # before the first import of robosuite, which fixes the GL backend
        self.render_size = render_size
        self.render_mode = "rgb_array" if render_size else None
        self.suite, self.obs_mode, self.image_size = suite, obs_mode, image_size
        if sim_cache < 1:
            raise ValueError(f"sim_cache must be at least 1, not {sim_cache}")
        self.settle_steps, self.reward_coef, self.sim_cache = settle_steps, reward_coef, sim_cache
        self.fast_step = None  # the stock step
        if fast_step:
            from sfengine_envs.libero_fast_step import ArmTracker  # imports mujoco and robosuite
            from sfengine_envs.libero_fast_step import fast_step as step

            self.fast_step, self.arm_tracker = step, ArmTracker.for_env
        self.trackers: dict[int, object] = {}  # task -> its simulator's ArmTracker (fast step)
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
        self.sims: OrderedDict[int, object] = OrderedDict()  # task -> its simulator, most recently used last
        self.sim = None  # the current task's simulator
        self.task = -1
        self.steps = 0
        self.sims_built = 0

    def num_init_states(self, task: int) -> int:
        return len(self.tasks[task].init_states)

    def instruction(self, task: int) -> str:
        return self.tasks[task].instruction

    def build_simulators(self, tasks: list[int]) -> None:
        """Build and keep the simulators of ``tasks`` (as many as the cache holds) before the first reset."""
        for task in tasks[: self.sim_cache]:
            if task not in self.sims:
                self._switch_to(task)

    def _switch_to(self, task: int) -> None:
        """Make task's simulator current: a kept one, or a new one (evicting the most recently used if full)."""
        if task in self.sims:
            self.sims.move_to_end(task)
        else:
            if len(self.sims) >= self.sim_cache:
                evicted, sim = self.sims.popitem(last=True)
                sim.close()
                self.trackers.pop(evicted, None)
                release_free_heap()
            self.sims[task] = self._build_sim(task)
            if self.fast_step:
                self.trackers[task] = self.arm_tracker(self.sims[task].env)
        self.sim = self.sims[task]
        self.task = task

    def _build_sim(self, task: int):
        _, _, control_env = import_libero()
        rgb = self.obs_mode == "rgb"
        self.sims_built += 1
        renders = rgb or self.render_size > 0
        with contextlib.nullcontext() if renders else building_without_textures():
            sim = control_env(
                bddl_file_name=self.tasks[task].bddl_file,
                has_renderer=False,
                has_offscreen_renderer=rgb,
                use_camera_obs=rgb,
                camera_names=["agentview", "robot0_eye_in_hand"],
                camera_heights=self.image_size,
                camera_widths=self.image_size,
                hard_reset=False,
            )
        release_free_heap()
        # Only what the policy receives is computed: rgb observations carry no object state (the cameras show it).
        # A soft reset keeps the observables, so this holds for the simulator's life.
        for name, observable in sim.env._observables.items():
            if observable.modality not in OBSERVED_MODALITIES[self.obs_mode]:
                sim.env.modify_observable(name, "enabled", False)
        return sim

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
            self._switch_to(task)
        cameras = CAMERA_OBSERVABLES if self.obs_mode == "rgb" else ()
        # Images rendered before the last settle step would be thrown away, at 100-300 ms each: cameras off.
        self._enable_observables(cameras, False)
        # Fixture placement comes from the global RNG at reset and is not part of the init state: seed it from
        # the assignment, so an init state always starts the same episode.
        self.sim.seed(task * 1000 + init_state)
        self.sim.reset()
        # A soft reset keeps the gripper's last command, which makes a reused env drift from a fresh one.
        for robot in self.sim.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        raw = self.sim.set_init_state(self.tasks[task].init_states[init_state])
        for _ in range(self.settle_steps):
            raw = self._advance(GRIPPER_OPEN_NOOP)
        if cameras:
            self._enable_observables(cameras, True)
            raw = self.sim.env._get_observations(force_update=True)
        self.steps = 0
        info = {"task": task, "init_state": init_state, "instruction": self.tasks[task].instruction}
        return self._obs(raw), info

    def sim_state(self) -> np.ndarray:
        """The simulator's flattened MuJoCo state (time, qpos, qvel), as LIBERO's datasets record it."""
        return self.sim.env.sim.get_state().flatten()

    def render(self) -> np.ndarray | None:
        """The agentview camera at ``render_size`` pixels, upright (None when the env was built without it)."""
        if not self.render_size or self.sim is None:
            return None
        sim = self.sim.env.sim
        if sim._render_context_offscreen is None:
            from robosuite.utils.binding_utils import MjRenderContextOffscreen

            context = MjRenderContextOffscreen(sim, -1, max_width=self.render_size, max_height=self.render_size)
            context.vopt.geomgroup[0] = 0  # collision meshes hidden, visual meshes shown, as robosuite's cameras
            context.vopt.geomgroup[1] = 1
        image = sim.render(self.render_size, self.render_size, camera_name="agentview")
        return np.ascontiguousarray(image[::-1, ::-1])

    def _enable_observables(self, names: tuple[str, ...], enabled: bool) -> None:
        for name in names:
            self.sim.env.modify_observable(name, "enabled", enabled)

    def step(self, action):
        raw = self._advance(action)
        self.steps += 1
        success = bool(self.sim.check_success())
        truncated = not success and self.steps >= self.max_episode_steps
        info = {"success": success} if success or truncated else {}
        if info:
            info["instruction"] = self.tasks[self.task].instruction
        return self._obs(raw), self.reward_coef * float(success), success, truncated, info

    def _advance(self, action) -> dict:
        """One control step of the simulator (fast or stock); its raw observations."""
        action = np.asarray(action, dtype=np.float64)
        if self.fast_step:
            return self.fast_step(self.sim.env, action, self.trackers[self.task])
        return self.sim.step(action)[0]

    def close(self):
        while self.sims:
            self.sims.popitem()[1].close()
        self.trackers.clear()
        self.sim = None


@dataclass
class LiberoOptions:
    group: ClassVar[str] = "libero"
    libero_obs_mode: str = option("state", "observations: state vectors, or rgb images", ("state", "rgb"))
    libero_image_size: int = option(128, "camera image size in pixels (rgb mode)")
    libero_reward_coef: float = option(1.0, "reward on success")
    libero_fast_step: bool = option(
        True,
        "step with one forward-dynamics pass per substep instead of three: same physics, faster (benchmarks/README.md)",
    )
    libero_sim_cache: int = option(
        1, "simulators each env keeps, one per task, so a task switch costs no rebuild (seconds each)", auto=True
    )

    def validate(self, auto: set[str]) -> None:
        if "libero_sim_cache" not in auto and self.libero_sim_cache < 1:
            raise ConfigError(f"--libero_sim_cache={self.libero_sim_cache} must be at least 1, or auto")
        if self.libero_image_size < 8:
            raise ConfigError(f"--libero_image_size={self.libero_image_size}: give at least 8 pixels (e.g. 128)")


def make_libero_env(suite: str, ctx: EnvContext) -> gym.Env:
    """Factory of ``--env=<suite>``; registered per suite with functools.partial, which pickles for spawned
    workers."""
    options = ctx.options or LiberoOptions()
    env = LiberoSuiteEnv(
        suite,
        obs_mode=options.libero_obs_mode,
        image_size=options.libero_image_size,
        reward_coef=options.libero_reward_coef,
        max_episode_steps=ctx.max_episode_steps,
        # The probe env is built before sizing chooses an auto cache: one simulator is all it needs.
        sim_cache=1 if options.libero_sim_cache is AUTO else options.libero_sim_cache,
        render_size=ctx.render_size,
        fast_step=options.libero_fast_step,
    )
    if ctx.worker_index >= 0:
        # A rollout worker's env that keeps a simulator for every task its rank can deal it (those of --tasks, if
        # given) builds them all now: it would build each at its first episode of that task anyway, but envs
        # sharing one task sequence come to every task only slowly, and a build (1-2 s) stalls the worker's other
        # envs too.
        init_states = [env.num_init_states(task) for task in range(env.num_tasks)]
        tasks = tasks_of_this_rank(init_states, ctx.env_config.tasks if ctx.env_config else [])
        if env.sim_cache >= len(tasks):
            env.build_simulators(tasks)
    return env


def tasks_of_this_rank(init_states_per_task: list[int], only_tasks: list[int]) -> list[int]:
    """The tasks this rank can deal its envs in training: those of ``--tasks`` (every task when empty), sharded
    across the ranks of this process's job."""
    from sfengine.engine.distributed import RankInfo  # torch: imported where a run starts, not when options are read

    ranks = RankInfo.from_environment()
    counts = selected_init_states(TaskInfo([], init_states_per_task), only_tasks, "--tasks")
    return sorted(shard_pairs(counts, ranks.rank, ranks.world_size))


def size_libero(cfg: Config, machine: Machine, tasks: TaskInfo | None, evaluation: bool = False) -> str:
    """Choose the ``auto`` options of a LIBERO run. The physics is CPU-bound, so one rollout worker per core;
    then memory: 2 envs per split when every env can keep a simulator for each of its tasks, else 1, and each
    env keeps as many simulators as the memory left allows (a task switch without one costs a 1-2 s rebuild,
    as much as a whole episode, so a simulator kept is worth more than an env added). (4 envs per split sampled
    LIBERO-Object at 0.83 of the limit on 2 cores, against 0.88 with 2: ``benchmarks/README.md``.)

    An evaluation's env keeps to one task until that task's episodes run out and never goes back to it, so one
    simulator each is enough, and one env per split: double buffering already keeps the core busy (measured:
    0.8 episodes a second on 2 cores with 1 or 2 envs per split), while every env more builds its own simulators
    at start (2-10 s each)."""
    s, env = cfg.sampler, cfg.options_group(LiberoOptions.group)
    if s.num_workers == AUTO:
        s.num_workers = machine.cores
    if s.num_inference_workers == AUTO:
        # An MLP over state observations costs little next to a physics step, and with a rollout worker on every
        # core an inference process only takes CPU from the simulators: each worker acts itself (LIBERO-Object:
        # 0.91 of the limit against 0.84 with an inference process, benchmarks/README.md). Images and GPUs keep one.
        cpu_mlp = env.libero_obs_mode == "state" and cfg.learner.device == "cpu"
        s.num_inference_workers = 0 if cpu_mlp and s.num_workers >= machine.cores else 1
    if tasks is None:
        num_tasks = 1
    elif evaluation:
        num_tasks = len(tasks.task_names)
    else:
        num_tasks = len(tasks_of_this_rank(tasks.init_states_per_task, cfg.env.tasks))
    simulator_gb = SIMULATOR_GB[env.libero_obs_mode]
    budget_gb = MEMORY_HEADROOM * machine.available_gb - OTHER_PROCESSES_GB - s.num_workers * WORKER_PROCESS_GB

    def simulators_per_env(envs_per_worker: int) -> int:
        return int(budget_gb / (s.num_workers * envs_per_worker * simulator_gb))

    wanted = (1 if evaluation else num_tasks) if env.libero_sim_cache == AUTO else env.libero_sim_cache
    if s.num_envs_per_worker == AUTO:
        room_for_two = not evaluation and simulators_per_env(2 * s.worker_num_splits) >= wanted
        s.num_envs_per_worker = (2 if room_for_two else 1) * s.worker_num_splits
    if env.libero_sim_cache == AUTO:
        env.libero_sim_cache = max(1, min(wanted, simulators_per_env(s.num_envs_per_worker)))
    num_envs = s.num_workers * s.num_envs_per_worker
    needed_gb = OTHER_PROCESSES_GB + s.num_workers * WORKER_PROCESS_GB + num_envs * env.libero_sim_cache * simulator_gb
    reason = (
        f"{machine.cores} cores, {machine.available_gb:.1f} GB available; {num_envs} envs keeping "
        f"{env.libero_sim_cache} of {num_tasks} task simulators each at {simulator_gb} GB: about {needed_gb:.1f} GB"
    )
    if needed_gb > machine.available_gb:
        reason += "; more than is available: lower --num_envs_per_worker or --libero_sim_cache"
    return reason
