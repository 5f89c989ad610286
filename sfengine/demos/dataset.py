"""Demonstrations on disk: HDF5 files in robomimic's dataset layout, the layout LIBERO publishes its datasets in.

A file holds the demos (episodes) of one env in one observation mode. LIBERO's published files hold the demos of
one task each and are named ``<task name>_demo.hdf5``; ours may hold demos of every task of a suite::

    demos.hdf5
    └── data                     attrs: env_name, env_args (JSON), problem_info (JSON), num_demos, total,
        │                               bddl_file_name (a file of one LIBERO task), sfengine_format, obs_mode,
        │                               sfengine_meta (JSON)
        ├── demo_0               attrs: num_samples (T), task, init_state, instruction
        │   ├── actions          [T, action_dim] float32   LIBERO: OSC deltas in [-1, 1]
        │   ├── rewards          [T] float32
        │   ├── dones            [T] uint8                 1 at the last step of a successful demo
        │   ├── states           [T, D] float64            flattened MuJoCo states (when recorded)
        │   ├── robot_states     [T, 9] float32            gripper qpos, eef pos, eef quat (LIBERO suites)
        │   └── obs
        │       ├── proprio      [T, 39] float32           the engine's observation keys, as the env returns them:
        │       ├── object       [T, N] float32            state mode
        │       ├── agentview    [T, H, W, 3] uint8        rgb mode (with wrist), upright
        │       └── task         [T, num_tasks] float32    one-hot
        ├── demo_1
        └── ...

Step t of a demo is ``obs[t]`` (the observation before the action), ``actions[t]``, then ``rewards[t]`` and
``dones[t]``; ``states[t]`` is the simulator state ``obs[t]`` was observed in.

LIBERO's published files (written by LIBERO's ``scripts/create_dataset.py``) have the same skeleton with
LIBERO's own observation keys (``agentview_rgb``, ``eye_in_hand_rgb``, ``joint_states``, ``gripper_states``,
``ee_states``, ``ee_pos``, ``ee_ori``), uint8 rewards, a per-demo ``model_file`` (the scene's MJCF) and an
``init_state`` that is the first flattened state rather than an index. ``read_demos`` turns them into the engine's
observations by replaying ``states`` in the engine's own LIBERO env: each state is set in the task's simulator and
observed. Two consequences:

- LIBERO's own ``obs[j]`` were recorded after ``actions[j]`` while ``states[j]`` precedes it; the replayed
  observations follow the convention above.
- A live env step returns what robosuite's observables sampled on substep 23-24 of the step's 25, a few ms before
  the state the step ends in; a replayed observation is that of the recorded state itself. Positions agree within
  a few 1e-3, joint velocities after a hard action within about 0.1 (tests/demos/test_demo_dataset.py).

Example::

    with DemoWriter("demos/libero_object.hdf5", env="libero_object", obs_mode="state") as writer:
        writer.add(Demo(obs=obs_by_key, actions=actions, rewards=rewards, dones=dones, states=states,
                        task=3, init_state=7, instruction="pick up the ketchup and place it in the basket"))
    demo_set = read_demos("demos/libero_object.hdf5")  # the same Demos back
    published = read_demos(sorted(Path("datasets/libero_object").glob("*_demo.hdf5")), obs_mode="state")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from sfengine_envs.libero_suite import SUITE_STEP_LIMITS, LiberoSuiteEnv, load_suite

FORMAT_VERSION = 1
OBS_MODES = ("state", "rgb")
# robomimic's env types: robosuite (LIBERO) and gym.
ROBOMIMIC_ENV_TYPE = {"robosuite": 1, "gym": 2}
# LIBERO's robot_states (BDDLBaseDomain.get_robot_state_vector: gripper qpos, eef pos, eef quat) are slices of the
# engine's proprio vector, robosuite's robot0_proprio-state: joint pos, cos, sin, vel (7 each), eef pos (3), eef
# quat (4), gripper qpos (2), gripper qvel (2).
PROPRIO_DIM = 39
PROPRIO_GRIPPER_QPOS = slice(35, 37)
PROPRIO_EEF_POSE = slice(28, 35)
DEMO_NAME = re.compile(r"demo_(\d+)")


class DemoFileError(ValueError):
    """A demo file that cannot be read as asked: the message names the file and what to do."""


@dataclass
class Demo:
    """One demonstration of T steps, in the engine's observation keys.

    ``obs[key][t]`` is the observation before ``actions[t]``; ``states[t]`` the flattened MuJoCo state it was
    observed in (LIBERO), or None."""

    obs: dict[str, np.ndarray]  # key -> [T, ...]
    actions: np.ndarray  # [T, action_dim] float32
    rewards: np.ndarray  # [T] float32
    dones: np.ndarray  # [T] uint8, 1 at the last step of a successful demo
    states: np.ndarray | None  # [T, state_dim] float64, or None
    task: int  # task index within the suite (the env's task id)
    init_state: int  # index of the suite init state it started from, -1 if unknown
    instruction: str = ""

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class DemoSet:
    """Demos of one env in one observation mode, with free-form metadata (who recorded them, how, when)."""

    env: str  # engine env name, e.g. "libero_object"
    obs_mode: str  # "state" or "rgb"
    demos: list[Demo]
    meta: dict = field(default_factory=dict)


class DemoWriter:
    """Streams demos into one HDF5 file as they arrive. The file appears at ``path`` only when the writer closes
    without an error (written as a temporary file beside it, then renamed), so a reader never sees half a file.

    >>> with DemoWriter("demos.hdf5", env="libero_object", obs_mode="state", meta={"demonstrator": "scripted"}) as w:
    ...     for demo in recorded_demos:
    ...         w.add(demo)
    """

    def __init__(self, path: str | os.PathLike, env: str, obs_mode: str, meta: dict | None = None):
        if obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode must be one of {OBS_MODES}, not {obs_mode!r}")
        self.path = Path(path)
        self.env, self.obs_mode = env, obs_mode
        self.meta_json = json.dumps(meta or {})  # not JSON-serialisable fails here, not after the last demo
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.temp_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.file = h5py.File(self.temp_path, "w")
        self.data = self.file.create_group("data")
        self.num_demos = self.total = 0
        self.obs_keys: list[str] | None = None  # the first demo's; every demo must have the same
        self.instructions: dict[int, str] = {}  # task -> instruction, of the tasks seen

    def add(self, demo: Demo) -> None:
        """Append ``demo`` as ``data/demo_<n>``."""
        steps = self._check(demo)
        obs = {key: np.asarray(values) for key, values in demo.obs.items()}
        group = self.data.create_group(f"demo_{self.num_demos}")
        group.create_dataset("actions", data=np.asarray(demo.actions, np.float32))
        group.create_dataset("rewards", data=np.asarray(demo.rewards, np.float32))
        group.create_dataset("dones", data=np.asarray(demo.dones, np.uint8))
        if demo.states is not None:
            group.create_dataset("states", data=np.asarray(demo.states, np.float64))
        proprio = obs.get("proprio")
        if self.env in SUITE_STEP_LIMITS and proprio is not None and proprio.shape[1:] == (PROPRIO_DIM,):
            robot_states = np.concatenate([proprio[:, PROPRIO_GRIPPER_QPOS], proprio[:, PROPRIO_EEF_POSE]], axis=1)
            group.create_dataset("robot_states", data=robot_states)
        obs_group = group.create_group("obs")
        for key, values in obs.items():
            if values.dtype == np.uint8 and values.ndim == 4:
                # Images: compressed, one chunk per frame so that a frame reads alone.
                obs_group.create_dataset(key, data=values, chunks=(1, *values.shape[1:]), compression="gzip")
            else:
                obs_group.create_dataset(key, data=values)
        group.attrs.update(num_samples=steps, task=demo.task, init_state=demo.init_state, instruction=demo.instruction)
        self.instructions.setdefault(demo.task, demo.instruction)
        self.num_demos += 1
        self.total += steps

    def _check(self, demo: Demo) -> int:
        """The demo's length, after checking that every array has it and that its obs keys are the file's."""
        name = f"{self.path}: demo {self.num_demos}"
        steps = len(demo.actions)
        if np.ndim(demo.actions) != 2 or steps == 0:
            raise ValueError(f"{name}: actions must be [T, action_dim] with T > 0, not {np.shape(demo.actions)}")
        arrays = {"rewards": demo.rewards, "dones": demo.dones, "states": demo.states}
        arrays.update((f"obs/{key}", values) for key, values in demo.obs.items())
        for key, values in arrays.items():
            if values is not None and len(values) != steps:
                raise ValueError(f"{name}: {key} has {len(values)} steps, actions {steps}")
        keys = sorted(demo.obs)
        if self.obs_keys is None:
            self.obs_keys = keys
        elif keys != self.obs_keys:
            raise ValueError(f"{name}: obs keys {keys} differ from the first demo's {self.obs_keys}")
        return steps

    def close(self) -> None:
        """Write the file's attributes and move it to ``path``."""
        attrs = self.data.attrs
        problem_info, bddl_file = libero_problem(self.env, self.instructions)
        suite = self.env if self.env in SUITE_STEP_LIMITS else None
        env_args = {
            "type": ROBOMIMIC_ENV_TYPE["robosuite" if suite else "gym"],
            "env_name": self.env,
            "problem_name": problem_info["problem_name"],
            "bddl_file": bddl_file,
            "env_kwargs": {"suite": suite, "obs_mode": self.obs_mode},
        }
        attrs.update(
            env_name=self.env,
            env_args=json.dumps(env_args),
            problem_info=json.dumps(problem_info),
            num_demos=self.num_demos,
            total=self.total,
            sfengine_format=FORMAT_VERSION,
            obs_mode=self.obs_mode,
            sfengine_meta=self.meta_json,
        )
        if bddl_file:
            attrs["bddl_file_name"] = bddl_file
        self.file.close()
        os.replace(self.temp_path, self.path)

    def abort(self) -> None:
        """Drop what was written: nothing appears at ``path``."""
        self.file.close()
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> DemoWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def libero_problem(env: str, instructions: dict[int, str]) -> tuple[dict, str]:
    """LIBERO's ``problem_info`` and BDDL file for a file of demos of the tasks in ``instructions``. A file of one
    LIBERO task gets that task's, as LIBERO writes them (from the task's BDDL file, when LIBERO is installed); a
    file of several tasks has no one problem: its demos' ``task`` and ``instruction`` attributes say which."""
    problem_info = {"problem_name": "", "domain_name": "robosuite", "language_instruction": ""}
    if len(instructions) != 1:
        return problem_info, ""
    ((task, instruction),) = instructions.items()
    problem_info["language_instruction"] = instruction
    if env not in SUITE_STEP_LIMITS:
        return problem_info, ""
    with contextlib.suppress(ImportError, IndexError):
        from libero.libero.envs.bddl_utils import get_problem_info

        bddl_file = load_suite(env)[task].bddl_file
        return get_problem_info(bddl_file), bddl_file
    return problem_info, ""


def write_demos(path: str | os.PathLike, demo_set: DemoSet) -> None:
    """Write ``demo_set`` to one file (atomically, as DemoWriter does)."""
    with DemoWriter(path, demo_set.env, demo_set.obs_mode, demo_set.meta) as writer:
        for demo in demo_set.demos:
            writer.add(demo)


def read_demos(
    path_or_paths: str | os.PathLike | Iterable[str | os.PathLike],
    env: str | None = None,
    obs_mode: str | None = None,
    image_size: int = 128,
) -> DemoSet:
    """Read demo files, ours or LIBERO's published ones, into one DemoSet in the engine's observation keys.

    ``env`` and ``obs_mode`` are what the caller expects: a file of ours recorded otherwise is an error, and
    LIBERO's files (which carry no engine observations) are replayed in the engine's env of that suite and mode
    (default: the suite of the file's BDDL folder, state mode; ``image_size`` pixels in rgb mode). The demos come in
    the order of the files, then of ``demo_<i>``. ``meta`` is the file's own for one file, ``{"files": {path:
    meta}}`` for several."""
    paths = [path_or_paths] if isinstance(path_or_paths, str | os.PathLike) else list(path_or_paths)
    if not paths:
        raise DemoFileError("no demo files given: pass a path or a list of paths to .hdf5 files")
    if obs_mode is not None and obs_mode not in OBS_MODES:
        raise DemoFileError(f"obs_mode must be one of {OBS_MODES}, not {obs_mode!r}")
    replay = LiberoReplay(image_size)
    try:
        parts = [(Path(path), read_file(Path(path), env, obs_mode, replay)) for path in paths]
    finally:
        replay.close()
    (first_path, first), demos = parts[0], []
    for path, part in parts:
        if (part.env, part.obs_mode) != (first.env, first.obs_mode):
            raise DemoFileError(
                f"{path} holds {part.env} demos in {part.obs_mode} mode, {first_path} {first.env} in "
                f"{first.obs_mode} mode: read them separately, or pass env= and obs_mode="
            )
        check_obs_keys(path, part.demos, first.demos)
        demos += part.demos
    meta = first.meta if len(parts) == 1 else {"files": {str(path): part.meta for path, part in parts}}
    return DemoSet(first.env, first.obs_mode, demos, meta)


def read_file(path: Path, env: str | None, obs_mode: str | None, replay: LiberoReplay) -> DemoSet:
    """One file, ours or LIBERO's; anything h5py cannot read in it becomes a DemoFileError."""
    if not path.is_file():
        raise DemoFileError(
            f"{path}: no such file; check the path (python -m sfengine.demos records them, or DemoWriter)"
        )
    try:
        with h5py.File(path, "r") as file:
            if "data" not in file:
                raise DemoFileError(
                    f"{path}: no 'data' group, so not a robomimic/LIBERO demo file; give a file written by "
                    "python -m sfengine.demos (or DemoWriter) or one of LIBERO's <task>_demo.hdf5 datasets"
                )
            data = file["data"]
            if "sfengine_format" in data.attrs:
                demo_set = read_own_file(path, data, env, obs_mode)
            else:
                demo_set = read_libero_file(path, data, env, obs_mode or "state", replay)
    except DemoFileError:
        raise
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise DemoFileError(
            f"{path}: not a readable HDF5 demo file ({exc}); it may be truncated: record or download it again"
        ) from None
    check_obs_keys(path, demo_set.demos, demo_set.demos)
    return demo_set


def demo_names(data: h5py.Group) -> list[str]:
    """``demo_<i>`` in the order of i (robomimic's order, not the file's alphabetical one)."""
    numbered = [(int(match[1]), name) for name in data if (match := DEMO_NAME.fullmatch(name))]
    return [name for _, name in sorted(numbered)]


def check_obs_keys(path: Path, demos: list[Demo], reference: list[Demo]) -> None:
    if not reference:
        return
    expected = sorted(reference[0].obs)
    for index, demo in enumerate(demos):
        if sorted(demo.obs) != expected:
            raise DemoFileError(
                f"{path}: demo {index} has obs keys {sorted(demo.obs)}, not {expected} like the others: it mixes "
                "recordings of different envs or modes; read them separately"
            )


def read_own_file(path: Path, data: h5py.Group, env: str | None, obs_mode: str | None) -> DemoSet:
    file_env, file_obs_mode = str(data.attrs["env_name"]), str(data.attrs["obs_mode"])
    if env is not None and env != file_env:
        raise DemoFileError(
            f"{path} holds demos of {file_env}, not {env}: give demos recorded on {env} (python -m sfengine.demos "
            f"--env={env}), or train on {file_env}"
        )
    if obs_mode is not None and obs_mode != file_obs_mode:
        raise DemoFileError(
            f"{path} holds {file_obs_mode} observations, not {obs_mode}: record demos with "
            f"--libero_obs_mode={obs_mode}, or pass obs_mode={file_obs_mode!r}"
        )
    demos = []
    for name in demo_names(data):
        group = data[name]
        demos.append(
            Demo(
                obs={key: values[()] for key, values in group["obs"].items()},
                actions=group["actions"][()],
                rewards=group["rewards"][()],
                dones=group["dones"][()],
                states=group["states"][()] if "states" in group else None,
                task=int(group.attrs["task"]),
                init_state=int(group.attrs["init_state"]),
                instruction=str(group.attrs["instruction"]),
            )
        )
    return DemoSet(file_env, file_obs_mode, demos, json.loads(data.attrs["sfengine_meta"]))


def read_libero_file(path: Path, data: h5py.Group, env: str | None, obs_mode: str, replay: LiberoReplay) -> DemoSet:
    """A file in LIBERO's published layout: its task found in the suite, its states replayed into observations."""
    bddl_file = str(data.attrs.get("bddl_file_name", ""))
    problem_info = json.loads(data.attrs.get("problem_info", "{}"))
    suite = env or next((s for s in (Path(bddl_file).parent.name, path.parent.name) if s in SUITE_STEP_LIMITS), None)
    if suite is None:
        raise DemoFileError(f"{path}: a LIBERO file whose suite cannot be told from it: pass env=<its suite>")
    if suite not in SUITE_STEP_LIMITS:
        raise DemoFileError(f"{path} is a LIBERO demo file; env={suite!r} is not a LIBERO suite: pass one of them")
    tasks = load_suite(suite)
    task = find_task(path, suite, [t.name for t in tasks], [t.instruction for t in tasks], bddl_file, problem_info)
    demos = []
    for name in demo_names(data):
        group = data[name]
        if "states" not in group:
            raise DemoFileError(f"{path}: {name} has no 'states', from which LIBERO demos are replayed; re-download")
        states = group["states"][()].astype(np.float64)
        demos.append(
            Demo(
                obs=replay.observations(path, suite, obs_mode, task, states),
                actions=group["actions"][()].astype(np.float32),
                rewards=group["rewards"][()].astype(np.float32),
                dones=group["dones"][()].astype(np.uint8),
                states=states,
                task=task,
                init_state=-1,  # LIBERO's demos start from states of their own, not from the suite's init states
                instruction=tasks[task].instruction,
            )
        )
    meta = {"source": "libero", "problem_info": problem_info, "bddl_file_name": bddl_file}
    return DemoSet(suite, obs_mode, demos, meta)


def find_task(
    path: Path, suite: str, names: list[str], instructions: list[str], bddl_file: str, problem_info: dict
) -> int:
    """The suite's index of a LIBERO file's task: by its BDDL file's name, else the file's own name
    (``<task>_demo.hdf5``), else its language instruction."""
    for name in (Path(bddl_file).stem, path.stem.removesuffix("_demo")):
        if name in names:
            return names.index(name)

    def words(text: str) -> str:
        return " ".join(text.lower().strip('"').split())

    language = words(str(problem_info.get("language_instruction", "")))
    matches = [index for index, instruction in enumerate(instructions) if words(instruction) == language]
    if len(matches) == 1:
        return matches[0]
    raise DemoFileError(
        f"{path}: its task ({Path(bddl_file).stem or language!r}) is not a task of {suite}: read it with "
        f"env=<its suite> ({Path(bddl_file).parent.name or 'the folder of its BDDL file'})"
    )


class LiberoReplay:
    """The engine's observations of flattened MuJoCo states: each state set in the task's simulator of the engine's
    own LIBERO env (built on first use, one at a time) and observed as a step would be."""

    def __init__(self, image_size: int):
        self.image_size = image_size
        self.env: LiberoSuiteEnv | None = None

    def observations(self, path: Path, suite: str, obs_mode: str, task: int, states: np.ndarray) -> dict:
        env = self.env
        if env is None or (env.suite, env.obs_mode) != (suite, obs_mode):
            self.close()
            env = self.env = LiberoSuiteEnv(suite, obs_mode=obs_mode, image_size=self.image_size, settle_steps=0)
        if env.task != task:
            env.reset(options={"task": task, "init_state": 0})  # builds the task's simulator
        sim = env.sim.env.sim
        state_dim = sim.get_state().flatten().size
        if states.ndim != 2 or states.shape[1] != state_dim:
            raise DemoFileError(
                f"{path}: states of shape {states.shape}, but {env.task_names[task]}'s simulator has {state_dim} "
                "values: the file was recorded with another LIBERO or robosuite version"
            )
        frames = []
        for state in states:
            sim.set_state_from_flattened(state)
            sim.forward()
            frames.append(env._obs(env.sim.env._get_observations(force_update=True)))
        return {key: np.stack([frame[key] for frame in frames]) for key in frames[0]}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
