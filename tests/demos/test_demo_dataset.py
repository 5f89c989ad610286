"""Demo files (sfengine.demos.dataset): our files round-trip, broken files fail with one line naming the file, and a
file in LIBERO's published layout loads as the engine's observations, replayed from real LIBERO-Object states.

The LIBERO tests need the ``libero`` extra (``pip install -e '.[libero]'``), which CI installs; the others do not.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import requires_libero
from sfengine.demos import Demo, DemoFileError, DemoSet, DemoWriter, read_demos, write_demos

NUM_TASKS = 10
OBJECT_DIM = 98


def one_hot(task: int, steps: int) -> np.ndarray:
    values = np.zeros((steps, NUM_TASKS), np.float32)
    values[:, task] = 1.0
    return values


def make_demo(rng: np.random.Generator, task: int, steps: int, obs_mode: str = "state", states: bool = True) -> Demo:
    obs = {"proprio": rng.normal(size=(steps, 39)).astype(np.float32), "task": one_hot(task, steps)}
    if obs_mode == "state":
        obs["object"] = rng.normal(size=(steps, OBJECT_DIM)).astype(np.float32)
    else:
        obs["agentview"] = rng.integers(0, 256, (steps, 16, 16, 3), dtype=np.uint8)
        obs["wrist"] = rng.integers(0, 256, (steps, 16, 16, 3), dtype=np.uint8)
    dones = np.zeros(steps, np.uint8)
    dones[-1] = 1
    return Demo(
        obs=obs,
        actions=rng.uniform(-1, 1, (steps, 7)).astype(np.float32),
        rewards=dones.astype(np.float32),
        dones=dones,
        states=rng.normal(size=(steps, 110)) if states else None,
        task=task,
        init_state=int(rng.integers(50)),
        instruction=f"instruction of task {task}",
    )


def assert_same_demos(read: list[Demo], written: list[Demo]) -> None:
    assert len(read) == len(written)
    for got, expected in zip(read, written):
        assert (got.task, got.init_state, got.instruction) == (expected.task, expected.init_state, expected.instruction)
        assert sorted(got.obs) == sorted(expected.obs)
        for key, values in expected.obs.items():
            assert got.obs[key].dtype == values.dtype
            np.testing.assert_array_equal(got.obs[key], values)
        for name in ("actions", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))
        assert (got.actions.dtype, got.rewards.dtype, got.dones.dtype) == (np.float32, np.float32, np.uint8)
        if expected.states is None:
            assert got.states is None
        else:
            assert got.states.dtype == np.float64
            np.testing.assert_array_equal(got.states, expected.states)


def test_streamed_state_demos_of_several_tasks_round_trip_with_libero_attributes(tmp_path):
    rng = np.random.default_rng(0)
    demos = [make_demo(rng, task, steps) for task, steps in ((0, 5), (3, 8), (0, 1))]
    demos.append(make_demo(rng, 7, 4, states=False))
    meta = {"demonstrator": "scripted", "seed": 3, "success_rate": 0.75}
    path = tmp_path / "libero_object.hdf5"
    with DemoWriter(path, env="libero_object", obs_mode="state", meta=meta) as writer:
        for demo in demos:
            writer.add(demo)
            assert not path.exists()  # appears whole, at close
    demo_set = read_demos(path, env="libero_object", obs_mode="state")
    assert (demo_set.env, demo_set.obs_mode, demo_set.meta) == ("libero_object", "state", meta)
    assert_same_demos(demo_set.demos, demos)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left

    with h5py.File(path) as file:
        data = file["data"]
        assert list(data) == [f"demo_{i}" for i in range(4)]
        assert (data.attrs["num_demos"], data.attrs["total"]) == (4, 18)
        env_args = json.loads(data.attrs["env_args"])
        assert env_args["env_name"] == "libero_object" and env_args["type"] == 1
        assert env_args["env_kwargs"] == {"suite": "libero_object", "obs_mode": "state"}
        # Several tasks: no one problem for the file; each demo says its own.
        assert json.loads(data.attrs["problem_info"])["language_instruction"] == ""
        demo = data["demo_1"]
        assert dict(demo.attrs) == {
            "num_samples": 8,
            "task": 3,
            "init_state": demos[1].init_state,
            "instruction": "instruction of task 3",
        }
        assert sorted(demo["obs"]) == ["object", "proprio", "task"]
        proprio = demos[1].obs["proprio"]
        robot_states = np.concatenate([proprio[:, 35:37], proprio[:, 28:31], proprio[:, 31:35]], axis=1)
        np.testing.assert_array_equal(demo["robot_states"][()], robot_states)
        assert "states" not in data["demo_3"]


def test_rgb_demos_round_trip_with_images_compressed_frame_by_frame(tmp_path):
    rng = np.random.default_rng(1)
    demo_set = DemoSet("libero_goal", "rgb", [make_demo(rng, 2, 6, "rgb"), make_demo(rng, 5, 3, "rgb")], {})
    path = tmp_path / "rgb.hdf5"
    write_demos(path, demo_set)
    read = read_demos(path)
    assert (read.env, read.obs_mode, read.meta) == ("libero_goal", "rgb", {})
    assert_same_demos(read.demos, demo_set.demos)
    with h5py.File(path) as file:
        images = file["data/demo_0/obs/agentview"]
        assert images.chunks == (1, 16, 16, 3) and images.compression == "gzip"


def test_several_files_read_as_one_set_keeping_each_files_meta(tmp_path):
    rng = np.random.default_rng(2)
    first, second = [make_demo(rng, 1, 3)], [make_demo(rng, 4, 2), make_demo(rng, 6, 5)]
    write_demos(tmp_path / "a.hdf5", DemoSet("libero_object", "state", first, {"part": 1}))
    write_demos(tmp_path / "b.hdf5", DemoSet("libero_object", "state", second, {"part": 2}))
    demo_set = read_demos([tmp_path / "a.hdf5", str(tmp_path / "b.hdf5")])
    assert_same_demos(demo_set.demos, first + second)
    assert demo_set.meta == {"files": {str(tmp_path / "a.hdf5"): {"part": 1}, str(tmp_path / "b.hdf5"): {"part": 2}}}


def test_an_error_while_writing_leaves_no_file(tmp_path):
    path = tmp_path / "demos.hdf5"
    with pytest.raises(RuntimeError), DemoWriter(path, "libero_object", "state") as writer:
        writer.add(make_demo(np.random.default_rng(3), 0, 4))
        raise RuntimeError("the recorder crashed")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_a_demo_whose_keys_or_lengths_differ(tmp_path):
    rng = np.random.default_rng(4)
    with DemoWriter(tmp_path / "demos.hdf5", "libero_object", "state") as writer:
        writer.add(make_demo(rng, 0, 4))
        with pytest.raises(ValueError, match="obs keys"):
            writer.add(make_demo(rng, 0, 4, "rgb"))
        short = make_demo(rng, 0, 4)
        short.rewards = short.rewards[:3]
        with pytest.raises(ValueError, match="rewards has 3 steps, actions 4"):
            writer.add(short)
    assert read_demos(tmp_path / "demos.hdf5").meta == {}


def test_a_file_of_another_env_or_mode_names_what_it_holds(tmp_path):
    path = tmp_path / "demos.hdf5"
    write_demos(path, DemoSet("libero_object", "state", [make_demo(np.random.default_rng(5), 0, 2)], {}))
    with pytest.raises(
        DemoFileError, match="holds demos of libero_object, not libero_goal: give demos recorded on libero_goal"
    ):
        read_demos(path, env="libero_goal")
    with pytest.raises(DemoFileError, match="holds state observations, not rgb"):
        read_demos(path, obs_mode="rgb")


def corrupt_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Broken files by kind, each with the words its error must contain."""
    good = tmp_path / "good.hdf5"
    write_demos(good, DemoSet("libero_object", "state", [make_demo(np.random.default_rng(6), 0, 50)], {}))
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "notes.hdf5"
    text.write_text("not an HDF5 file")
    no_data = tmp_path / "no_data.hdf5"
    with h5py.File(no_data, "w") as file:
        file.create_group("episodes")
    mixed = tmp_path / "mixed.hdf5"
    write_demos(mixed, DemoSet("libero_object", "state", [make_demo(np.random.default_rng(7), 0, 3)] * 2, {}))
    with h5py.File(mixed, "a") as file:
        file["data/demo_1/obs/extra"] = np.zeros(3)
    return {
        "missing": (tmp_path / "missing.hdf5", "no such file; check the path"),
        "truncated": (truncated, "it may be truncated: record or download it again"),
        "not hdf5": (text, "not a readable HDF5 demo file"),
        "no data group": (no_data, "no 'data' group, so not a robomimic/LIBERO demo file"),
        "mixed obs keys": (mixed, "demo 1 has obs keys"),
    }


@pytest.mark.parametrize("kind", ["missing", "truncated", "not hdf5", "no data group", "mixed obs keys"])
def test_a_broken_file_is_a_one_line_error_naming_it(tmp_path, kind):
    path, words = corrupt_files(tmp_path)[kind]
    with pytest.raises(DemoFileError) as error:
        read_demos(path)
    message = str(error.value)
    assert message.startswith(str(path)) and words in message and "\n" not in message


# LIBERO: one simulator for the module, and one recorded episode of LIBERO-Object task 0.

# Down and sideways with the gripper open, then a small rotation closing it: the arm moves on every step.
ACTIONS = np.array([[0.3, -0.2, -0.5, 0, 0, 0, -1]] * 3 + [[0, 0, 0, 0.1, 0, 0, 1]] * 3, dtype=np.float32)


@pytest.fixture(scope="module")
def object_episode():
    """Task 0 of LIBERO-Object played from init state 0: per step before each action, the flattened state, the
    observation the env returned, and the env's observation and LIBERO's robot state vector of that very state."""
    from sfengine_envs.libero_suite import LiberoSuiteEnv

    env = LiberoSuiteEnv("libero_object")
    obs, _ = env.reset(options={"task": 0, "init_state": 0})
    robosuite_env = env.sim.env
    episode = {"states": [], "returned": [], "of_state": [], "raw": []}
    for action in ACTIONS:
        # A step ends on mj_step, whose kinematics (site positions...) precede its integration: recompute them.
        robosuite_env.sim.forward()
        raw = robosuite_env._get_observations(force_update=True)
        episode["states"].append(robosuite_env.sim.get_state().flatten())
        episode["returned"].append(obs)
        episode["of_state"].append(env._obs(raw))
        episode["raw"].append(raw)
        obs, *_ = env.step(action)
    episode["task"] = env.tasks[0]
    episode["robot_states"] = [robosuite_env.get_robot_state_vector(raw) for raw in episode["raw"]]
    yield episode
    env.close()


def stacked(observations: list[dict]) -> dict[str, np.ndarray]:
    return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}


def write_libero_published_file(path: Path, episode: dict, bddl_file: str, demo_slices: list[slice]) -> None:
    """A file as LIBERO's scripts/create_dataset.py writes it: its attributes, obs keys and dtypes."""
    from libero.libero.envs.bddl_utils import get_problem_info
    from robosuite.utils.transform_utils import quat2axisangle

    problem_info = get_problem_info(episode["task"].bddl_file)
    with h5py.File(path, "w") as file:
        data = file.create_group("data")
        data.attrs["env_name"] = problem_info["problem_name"]
        data.attrs["problem_info"] = json.dumps(problem_info)
        data.attrs["macros_image_convention"] = "opengl"
        data.attrs["bddl_file_name"] = bddl_file
        data.attrs["bddl_file_content"] = Path(episode["task"].bddl_file).read_text()
        env_kwargs = {"robots": ["Panda"], "control_freq": 20, "camera_heights": 128, "camera_widths": 128}
        env_args = {"type": 1, "env_name": problem_info["problem_name"], "problem_name": problem_info["problem_name"]}
        data.attrs["env_args"] = json.dumps({**env_args, "bddl_file": bddl_file, "env_kwargs": env_kwargs})
        total = 0
        for index, steps in enumerate(demo_slices):
            raws = episode["raw"][steps]
            states = np.stack(episode["states"][steps])
            ee_states = np.stack([np.hstack((r["robot0_eef_pos"], quat2axisangle(r["robot0_eef_quat"]))) for r in raws])
            demo = data.create_group(f"demo_{index}")
            obs = demo.create_group("obs")
            obs["gripper_states"] = np.stack([r["robot0_gripper_qpos"] for r in raws])
            obs["joint_states"] = np.stack([r["robot0_joint_pos"] for r in raws])
            obs["ee_states"] = ee_states
            obs["ee_pos"] = ee_states[:, :3]
            obs["ee_ori"] = ee_states[:, 3:]
            obs["agentview_rgb"] = np.zeros((len(states), 128, 128, 3), np.uint8)
            obs["eye_in_hand_rgb"] = np.zeros((len(states), 128, 128, 3), np.uint8)
            demo["actions"] = ACTIONS[steps].astype(np.float64)
            demo["states"] = states
            demo["robot_states"] = np.stack(episode["robot_states"][steps])
            ones_at_end = np.zeros(len(states), np.uint8)
            ones_at_end[-1] = 1
            demo["rewards"] = ones_at_end
            demo["dones"] = ones_at_end
            demo.attrs["num_samples"] = len(states)
            demo.attrs["model_file"] = "<mujoco model='base'/>"
            demo.attrs["init_state"] = states[0]
            total += len(states)
        data.attrs["num_demos"] = len(demo_slices)
        data.attrs["total"] = total


@requires_libero
def test_libero_published_file_loads_as_the_engines_observations_of_its_states(object_episode, tmp_path):
    task = object_episode["task"]
    path = tmp_path / f"{task.name}_demo.hdf5"
    slices = [slice(0, len(ACTIONS)), slice(2, 5)]
    write_libero_published_file(
        path, object_episode, f"libero/libero/bddl_files/libero_object/{task.name}.bddl", slices
    )
    demo_set = read_demos(path, env="libero_object", obs_mode="state")
    assert (demo_set.env, demo_set.obs_mode, len(demo_set.demos)) == ("libero_object", "state", 2)
    assert demo_set.meta["source"] == "libero"
    for demo, steps in zip(demo_set.demos, slices):
        assert (demo.task, demo.init_state, demo.instruction) == (0, -1, task.instruction)
        assert sorted(demo.obs) == ["object", "proprio", "task"]
        assert demo.obs["proprio"].shape == (len(demo), 39) and demo.obs["object"].dtype == np.float32
        of_state, returned = stacked(object_episode["of_state"][steps]), stacked(object_episode["returned"][steps])
        for key in demo.obs:
            np.testing.assert_allclose(demo.obs[key], of_state[key], atol=1e-5)
            # The env returns what robosuite sampled a substep or two before the step's end (module docstring):
            # positions agree closely, joint velocities (proprio 21:28) less.
            np.testing.assert_allclose(demo.obs[key], returned[key], atol=0.1)
        np.testing.assert_allclose(demo.obs["proprio"][:, :21], returned["proprio"][:, :21], atol=0.01)
        np.testing.assert_allclose(demo.obs["object"], returned["object"], atol=0.01)
        np.testing.assert_array_equal(demo.actions, ACTIONS[steps])
        np.testing.assert_array_equal(demo.states, np.stack(object_episode["states"][steps]))
        assert demo.actions.dtype == np.float32 and demo.rewards.dtype == np.float32
        assert demo.rewards[-1] == 1.0 and demo.dones[-1] == 1 and demo.dones[:-1].sum() == 0


@requires_libero
def test_libero_file_of_a_task_outside_the_suite_is_a_one_line_error(object_episode, tmp_path):
    path = tmp_path / f"{object_episode['task'].name}_demo.hdf5"
    write_libero_published_file(path, object_episode, object_episode["task"].bddl_file, [slice(0, 2)])
    with pytest.raises(DemoFileError, match="is not a task of libero_spatial: read it with env=<its suite>"):
        read_demos(path, env="libero_spatial")
    assert read_demos(path).env == "libero_object"  # the suite told by the BDDL file's folder


@requires_libero
def test_a_file_of_one_libero_task_carries_libero_problem_info_and_robot_states(object_episode, tmp_path):
    task = object_episode["task"]
    states = np.stack(object_episode["states"])
    demo = Demo(
        stacked(object_episode["of_state"]), ACTIONS, np.zeros(6, np.float32), np.zeros(6, np.uint8), states, 0, 0
    )
    path = tmp_path / "one_task.hdf5"
    write_demos(path, DemoSet("libero_object", "state", [demo], {}))
    with h5py.File(path) as file:
        data = file["data"]
        assert data.attrs["bddl_file_name"] == task.bddl_file
        assert json.loads(data.attrs["problem_info"])["problem_name"] == "libero_floor_manipulation"
        np.testing.assert_allclose(data["demo_0/robot_states"][()], np.stack(object_episode["robot_states"]), atol=1e-6)
    assert_same_demos(read_demos(path).demos, [demo])
