"""LIBERO suites through sfengine's adapter: real simulation, state mode (no renderer), and a short training run.

Needs the ``libero`` extra (``pip install -e '.[libero]'``), which CI installs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from functools import cache

import numpy as np
import pytest
import torch

from helpers import make_env, read_summary, run_train, train_command

pytest.importorskip("libero", reason="the libero extra is not installed: pip install -e '.[libero]'")

from sfengine.config import auto_options, parse_config  # noqa: E402
from sfengine.engine.sizing import Machine, resolve_auto_options  # noqa: E402
from sfengine.env.multitask import TaskInfo  # noqa: E402
from sfengine.env.registry import env_sizer  # noqa: E402
from sfengine_envs.libero_suite import SUITE_STEP_LIMITS, LiberoSuiteEnv  # noqa: E402

SUITES = list(SUITE_STEP_LIMITS)
# -1 opens the gripper: the action of the settle steps, written out here so that a wrong constant in the env shows.
GRIPPER_OPEN_NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)


@cache
def libero_instructions(suite: str) -> tuple[str, ...]:
    """Each task's language instruction as LIBERO's own benchmark gives it, independent of the env's task table."""
    from libero.libero import benchmark

    bench = benchmark.get_benchmark_dict()[suite]()
    return tuple(bench.get_task(task).language for task in range(bench.n_tasks))


@pytest.fixture(scope="module")
def spatial_env():
    # Shared by the tests that only need some libero_spatial simulator, since building one costs 2-4 s. Each test
    # starts with a reset, which replays an init state exactly, so their order does not matter. 12-step episodes
    # keep truncation cheap and leave room for the 10 settle steps one test replays by hand; two simulators let a
    # test go back to a task it played.
    env = make_env("libero_spatial", max_episode_steps=12, libero_sim_cache=2)
    yield env
    env.close()


@pytest.mark.parametrize("suite", SUITES)
def test_first_task_of_each_suite_resets_to_an_init_state_and_steps(suite):
    env = make_env(suite)
    try:
        assert env.num_tasks == (90 if suite == "libero_90" else 10)
        assert env.num_init_states(0) == 50
        obs, info = env.reset(options={"task": 0, "init_state": 0})
        assert info["instruction"] == libero_instructions(suite)[0] and info["task"] == 0
        assert env.observation_space.contains(obs)
        assert obs["proprio"].shape == (39,) and obs["proprio"].dtype == np.float32
        assert obs["task"].argmax() == 0 and obs["task"].sum() == 1.0
        assert "agentview" not in obs  # state mode builds no renderer
        assert env.sim.env.has_offscreen_renderer is False
        obs, reward, terminated, truncated, _ = env.step(np.zeros(7, dtype=np.float32))
        assert env.observation_space.contains(obs)
        assert reward == 0.0 and not terminated and not truncated
    finally:
        env.close()


# The published evaluation convention (openvla-oft's LIBERO evaluation): results are only comparable at these limits.
PUBLISHED_STEP_LIMITS = [
    ("libero_spatial", 220),
    ("libero_object", 280),
    ("libero_goal", 300),
    ("libero_10", 520),
    ("libero_90", 400),
]


@pytest.mark.parametrize("suite, step_limit", PUBLISHED_STEP_LIMITS)
def test_each_suite_uses_its_published_step_limit_unless_max_episode_steps_is_given(suite, step_limit):
    # Building the env builds no simulator (that waits for the first reset), so this costs no physics; that an
    # episode is truncated at this limit is tested below on a simulator.
    assert make_env(suite).max_episode_steps == step_limit
    assert make_env(suite, max_episode_steps=7).max_episode_steps == 7


def test_max_episode_steps_truncates_the_episode_at_its_last_step_with_the_instruction(spatial_env):
    # spatial_env was built with --max_episode_steps=12, far below libero_spatial's own 220.
    spatial_env.reset(options={"task": 0, "init_state": 3})
    steps = [spatial_env.step(np.zeros(7, dtype=np.float32)) for _ in range(12)]
    flags = [(terminated, truncated) for _, _, terminated, truncated, _ in steps]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
    assert steps[-1][4] == {"success": False, "instruction": libero_instructions("libero_spatial")[0]}


def test_reset_settles_the_init_state_with_ten_gripper_open_noop_steps(spatial_env):
    # The published results are measured after 10 settle steps (openvla-oft): the first observation must be the init
    # state after exactly 10 no-op steps with the gripper open. Replay them by hand from an unsettled reset of the
    # same init state, which the env replays exactly (same seed, same soft reset).
    options = {"task": 0, "init_state": 2}
    settled, _ = spatial_env.reset(options=options)
    spatial_env.settle_steps = 0
    try:
        spatial_env.reset(options=options)
        # The replay must start at the init state itself (MuJoCo's time, qpos, qvel), or a reset that always took
        # one step too many would look right.
        init_state = spatial_env.tasks[0].init_states[2]
        np.testing.assert_array_equal(spatial_env.sim.env.sim.get_state().flatten(), init_state)
        for _ in range(10):
            by_hand, *_ = spatial_env.step(GRIPPER_OPEN_NOOP)
    finally:
        spatial_env.settle_steps = 10
    for key in settled:
        np.testing.assert_allclose(settled[key], by_hand[key], atol=1e-6, err_msg=key)


def test_the_instruction_in_reset_and_last_step_infos_follows_task_switches(spatial_env):
    # A policy conditioned on language reads the instruction from these infos: after a task switch, whether to a
    # new simulator or back to a kept one, it must be the current task's, never the previous one's.
    instructions = libero_instructions("libero_spatial")
    assert instructions[0] != instructions[1]
    for task in (0, 1, 0):
        _, info = spatial_env.reset(options={"task": task, "init_state": 0})
        assert info["instruction"] == instructions[task]
        for _ in range(12):  # spatial_env's --max_episode_steps
            _, _, _, truncated, info = spatial_env.step(np.zeros(7, dtype=np.float32))
        assert truncated and info["instruction"] == instructions[task]


@pytest.mark.slow
def test_training_on_libero_spatial_runs_end_to_end(train_dir):
    result = run_train(
        train_dir,
        "libero",
        "--env=libero_spatial",
        "--num_workers=2",
        "--num_envs_per_worker=1",
        "--worker_num_splits=1",
        "--batch_size=256",
        "--num_batches_per_epoch=1",
        "--train_for_env_steps=512",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "libero")
    assert summary["env_steps"] >= 512 and summary["fps"] > 0
    assert 5 < summary["env_step_ms"] < 500 and summary["env_reset_ms"] > summary["env_step_ms"]
    # 220-step episodes, 256 steps on each of 2 envs: each env finished one, on a task of the suite.
    assert summary["per_task_success"]
    assert all(name.startswith("pick_up_the_black_bowl") for name in summary["per_task_success"])
    # The status lines while the simulators are built, before any episode or update: "-" for what is not yet
    # measured; and no NaN from the first updates' statistics (every return 0 until a success).
    waiting = [line for line in result.stdout.splitlines() if re.search(r"\] steps +0 \(", line)]
    assert all("return -" in line and "lag -" in line for line in waiting), waiting
    assert not re.search(r"\bnan\b", result.stdout, re.I) and "return None" not in result.stdout, result.stdout[-3000:]
    assert "NaN or Inf" not in result.stderr


def test_success_is_detected_and_terminates_the_episode():
    # libero_spatial task 0: "put the black bowl on the plate". Place the bowl just above the plate in the
    # simulator; the gripper-open no-op then lets it settle onto the plate, which satisfies the goal.
    env = make_env("libero_spatial", libero_reward_coef=2.0)
    try:
        env.reset(options={"task": 0, "init_state": 0})
        sim = env.sim.env.sim
        plate = sim.data.get_body_xpos("plate_1_main").copy()
        joint = "akita_black_bowl_1_joint0"
        qpos = sim.data.get_joint_qpos(joint).copy()
        qpos[:3] = plate + np.array([0.0, 0.0, 0.05])
        sim.data.set_joint_qpos(joint, qpos)
        sim.data.set_joint_qvel(joint, np.zeros(6))
        sim.forward()
        for _ in range(20):
            _, reward, terminated, truncated, info = env.step(np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32))
            if terminated:
                break
        assert terminated and not truncated, "the bowl on the plate was not detected as success"
        assert info["success"] is True and reward == 2.0
        assert info["instruction"] == libero_instructions("libero_spatial")[0]
    finally:
        env.close()


@pytest.mark.slow
def test_state_mode_simulators_are_built_without_textures_with_bit_identical_physics_and_observations():
    plain = make_env("libero_object")  # state mode, nothing renders: its simulators leave the textures out
    textured = LiberoSuiteEnv("libero_object", render_size=64)  # records videos: keeps them
    try:
        for task in (0, 7):
            observations = [env.reset(options={"task": task, "init_state": 2})[0] for env in (plain, textured)]
            assert plain.sim.env.sim.model.ntex == 0 < textured.sim.env.sim.model.ntex
            rng = np.random.default_rng(task)
            for step in range(40):
                for key in observations[0]:
                    np.testing.assert_array_equal(observations[0][key], observations[1][key], f"{key} at {step}")
                for field in ("qpos", "qvel"):
                    np.testing.assert_array_equal(*(getattr(env.sim.env.sim.data, field) for env in (plain, textured)))
                action = rng.uniform(-1, 1, 7).astype(np.float32)
                outcomes = [env.step(action) for env in (plain, textured)]
                observations = [outcome[0] for outcome in outcomes]
                assert outcomes[0][1:4] == outcomes[1][1:4]
    finally:
        plain.close()
        textured.close()


def test_a_reused_env_replays_an_init_state_exactly():
    env = make_env("libero_goal")
    try:
        first = env.reset(options={"task": 0, "init_state": 7})[0]
        for _ in range(5):
            env.step(np.full(7, 0.5, dtype=np.float32))
        env.reset(options={"task": 0, "init_state": 3})
        again = env.reset(options={"task": 0, "init_state": 7})[0]
        for key in first:
            np.testing.assert_allclose(again[key], first[key], atol=1e-6, err_msg=key)
    finally:
        env.close()


@pytest.mark.slow
def test_a_task_switch_reuses_a_kept_simulator_and_replays_the_same_episode():
    env = make_env("libero_spatial", libero_sim_cache=2)
    try:
        first = env.reset(options={"task": 0, "init_state": 4})[0]
        task0_sim = env.sim
        env.reset(options={"task": 1, "init_state": 0})
        again = env.reset(options={"task": 0, "init_state": 4})[0]
        assert env.sim is task0_sim and env.sims_built == 2  # back on task 0 without a rebuild
        for key in first:
            np.testing.assert_allclose(again[key], first[key], atol=1e-6, err_msg=key)
        # Full: a third task evicts the most recently used simulator (task 0's), and task 1's stays.
        env.reset(options={"task": 2, "init_state": 0})
        assert list(env.sims) == [1, 2] and env.sims_built == 3
    finally:
        env.close()


def test_without_a_cache_every_task_switch_rebuilds_the_simulator():
    env = make_env("libero_goal")
    try:
        for task in (0, 1, 0):
            env.reset(options={"task": task, "init_state": 0})
        assert env.sims_built == 3 and len(env.sims) == 1
    finally:
        env.close()


@pytest.mark.parametrize(
    "world_size, rank, tasks, sim_cache, built",
    [(2, 1, [], 5, [1, 3, 5, 7, 9]), (2, 1, [], 4, []), (1, 0, [3, 8], 10, [3, 8]), (2, 1, [0, 3, 8], 10, [3])],
)
@pytest.mark.slow
def test_a_training_env_with_room_for_every_task_of_its_rank_builds_their_simulators_at_start(
    monkeypatch, world_size, rank, tasks, sim_cache, built
):
    # Rank 1 of 2 deals tasks 1, 3, 5, 7, 9: an env keeping 5 simulators builds those five before its first reset
    # (no build stalls its worker later); one keeping 4 builds none until a reset asks for a task. With --tasks,
    # only the chosen tasks of its rank (rank 1 of 2 is dealt the second of 0, 3, 8).
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("RANK", str(rank))
    env = make_env("libero_object", libero_sim_cache=sim_cache, tasks=tasks)
    try:
        assert sorted(env.sims) == built and env.sims_built == len(built)
        env.reset(options={"task": 3, "init_state": 0})
        assert env.sims_built == max(len(built), 1)  # a kept task's reset builds nothing more
    finally:
        env.close()


def enabled_modalities(env) -> set[str]:
    return {o.modality for o in env.sim.env._observables.values() if o.is_enabled()}


def test_state_mode_computes_the_observables_the_policy_receives_and_no_others(spatial_env):
    obs, _ = spatial_env.reset(options={"task": 1, "init_state": 0})
    assert enabled_modalities(spatial_env) == {"robot0_proprio", "object"}
    assert np.count_nonzero(obs["object"]) > 0 and np.count_nonzero(obs["proprio"]) > 0


def test_rgb_mode_gives_upright_uint8_images_of_the_asked_size():
    env = make_env("libero_object", libero_obs_mode="rgb", libero_image_size=32)
    try:
        obs, _ = env.reset(options={"task": 0, "init_state": 0})
        obs, *_ = env.step(np.zeros(7, dtype=np.float32))
        assert env.observation_space.contains(obs)
        for key in ("agentview", "wrist"):
            assert obs[key].shape == (32, 32, 3) and obs[key].dtype == np.uint8 and obs[key].std() > 1
        # MuJoCo renders upside down: both axes are flipped to make the images upright.
        raw = env.sim.env._get_observations(force_update=True)
        np.testing.assert_array_equal(env._obs(raw)["agentview"], raw["agentview_image"][::-1, ::-1])
        # Only what the policy receives is computed: no object state in rgb mode.
        assert enabled_modalities(env) == {"robot0_proprio", "image"}
    finally:
        env.close()


@pytest.mark.parametrize(
    "machine, evaluation, envs_per_worker, sim_cache",
    [
        # This machine: 2 envs per split, each keeping all 10 simulators (0.1 GB each in state mode).
        (Machine(cores=2, available_gb=23.0), False, 4, 10),
        (Machine(cores=2, available_gb=6.0), False, 2, 8),  # short of memory: 1 env per split, fewer simulators
        (Machine(cores=2, available_gb=3.0), False, 2, 1),
        # An evaluation's env keeps to one task at a time: one simulator each, one env per split, whatever the memory.
        (Machine(cores=2, available_gb=23.0), True, 2, 1),
        (Machine(cores=2, available_gb=60.0), True, 2, 1),
    ],
)
def test_libero_defaults_size_workers_and_simulator_caches_from_cores_and_memory(
    tmp_path, machine, evaluation, envs_per_worker, sim_cache
):
    cfg = parse_config(["--env=libero_spatial", f"--train_dir={tmp_path}"])
    assert auto_options(cfg) == [
        "num_workers",
        "num_envs_per_worker",
        "num_inference_workers",
        "libero_sim_cache",
    ]  # configs/libero_spatial.yaml
    tasks = TaskInfo([f"t{i}" for i in range(10)], [50] * 10)
    line = resolve_auto_options(cfg, env_sizer("libero_spatial"), tasks, machine, evaluation)
    assert cfg.sampler.num_workers == machine.cores
    assert cfg.sampler.num_envs_per_worker == envs_per_worker and cfg.get("libero_sim_cache") == sim_cache
    assert line.startswith("auto: ") and f"{machine.available_gb:.1f} GB available" in line


def test_libero_simulator_cache_is_sized_for_the_tasks_of_the_run(tmp_path):
    # --tasks=0,1,2: an env is dealt three tasks, so it keeps three simulators, not one for each of the suite's 10.
    cfg = parse_config(["--env=libero_object", "--tasks=0,1,2", f"--train_dir={tmp_path}"])
    tasks = TaskInfo([f"t{i}" for i in range(10)], [50] * 10)
    line = resolve_auto_options(cfg, env_sizer("libero_object"), tasks, Machine(cores=2, available_gb=23.0))
    assert cfg.get("libero_sim_cache") == 3 and "keeping 3 of 3 task simulators" in line, line


@pytest.mark.parametrize(
    "args, inference_workers",
    [
        ([], 0),  # state observations, an MLP on the CPU, a rollout worker on every core: the workers act
        (["--libero_obs_mode=rgb"], 1),  # a CNN: an inference process batches it
        (["--num_workers=1"], 1),  # a core left for an inference process
        (["--num_inference_workers=2"], 2),  # given: kept
    ],
)
def test_libero_rollout_workers_act_themselves_when_a_cpu_mlp_would_share_their_cores(
    tmp_path, args, inference_workers
):
    cfg = parse_config(["--env=libero_object", f"--train_dir={tmp_path}", *args])
    tasks = TaskInfo([f"t{i}" for i in range(10)], [50] * 10)
    line = resolve_auto_options(cfg, env_sizer("libero_object"), tasks, Machine(cores=2, available_gb=23.0))
    assert cfg.sampler.num_inference_workers == inference_workers
    assert ("num_inference_workers=" in line) == ("--num_inference_workers=2" not in args)


def test_libero_keeps_an_inference_process_for_a_policy_on_the_gpu(tmp_path, monkeypatch):
    # The sizing alone: this machine has no GPU, so torch is told it has one.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = parse_config(["--env=libero_object", "--device=cuda", f"--train_dir={tmp_path}"])
    tasks = TaskInfo([f"t{i}" for i in range(10)], [50] * 10)
    resolve_auto_options(cfg, env_sizer("libero_object"), tasks, Machine(cores=2, available_gb=23.0))
    assert cfg.sampler.num_inference_workers == 1


FLAKY_LIBERO_SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.train import main
    from sfengine_envs.libero_suite import make_libero_env


    blown_up = set()  # env indices whose env already raised (a rebuilt env starts its counts again)


    class BlowsUpOnce(gym.Wrapper):
        # Raises inside step, as an unstable simulation would, in the 30th step of each env's second episode.

        def __init__(self, env, env_index):
            super().__init__(env)
            self.env_index = env_index
            self.episodes = self.steps = 0

        def reset(self, **kwargs):
            self.episodes += 1
            self.steps = 0
            return self.env.reset(**kwargs)

        def step(self, action):
            self.steps += 1
            if self.episodes == 2 and self.steps == 30 and self.env_index not in blown_up:
                blown_up.add(self.env_index)
                raise RuntimeError("MuJoCo: simulation unstable")
            return self.env.step(action)


    def make_flaky_libero(ctx):
        return BlowsUpOnce(make_libero_env("libero_goal", ctx), ctx.env_index)


    register_env("flaky_libero", make_flaky_libero)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_libero_env_that_raises_mid_episode_is_rebuilt_and_the_run_finishes(tmp_path, train_dir):
    script = tmp_path / "flaky_libero.py"
    script.write_text(FLAKY_LIBERO_SCRIPT)
    # One task: each env builds its simulator once, and again when it is rebuilt (each task switch would build one).
    args = ["--env=flaky_libero", "--tasks=0", "--num_workers=1", "--num_envs_per_worker=2", "--max_episode_steps=40"]
    args += ["--rollout=32", "--batch_size=256", "--num_batches_per_epoch=1", "--train_for_env_steps=768"]
    command = [sys.executable, str(script), *train_command(train_dir, "flaky", *args)[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "flaky")
    assert summary["env_failures"] == 2  # one per env: both were rebuilt and went on
    assert summary["env_steps"] >= 768 and summary["episodes"] >= 10
    assert "step failed; rebuilding the env" in result.stderr
