"""The fast LIBERO step (``--libero_fast_step``, the default) against robosuite's stock step, on real LIBERO.

Each test builds a fast env and a stock env of the same task; an init state replays exactly, so both start from
the same state, and any difference comes from the step itself.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

pytest.importorskip("libero", reason="the libero extra is not installed: pip install -e '.[libero]'")

from helpers import make_env  # noqa: E402
from sfengine.config import parse_config  # noqa: E402

GRIPPER_OPEN_NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)


def make(suite: str, fast: bool, **env_options):
    return make_env(suite, libero_fast_step=fast, **env_options)


def physics_state(env) -> np.ndarray:
    data = env.sim.env.sim.data
    return np.concatenate([[data.time], data.qpos, data.qvel])


def robot_state(env) -> np.ndarray:
    """The arm's and the gripper's joint positions and velocities: what the actions drive."""
    robot, data = env.sim.env.robots[0], env.sim.env.sim.data
    qpos = robot._ref_joint_pos_indexes + robot._ref_gripper_joint_pos_indexes
    qvel = robot._ref_joint_vel_indexes + robot._ref_gripper_joint_vel_indexes
    return np.concatenate([data.qpos[qpos], data.qvel[qvel]])


def disable_warm_starts(env) -> None:
    env.sim.env.sim.model._model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_WARMSTART


def action_sequence(seed: int, steps: int) -> np.ndarray:
    """A seeded sequence of the kind a policy produces: the arm lifts, then wanders smoothly (an Ornstein-Uhlenbeck
    walk) above the table while the gripper opens and closes every 20 steps."""
    rng = np.random.default_rng(seed)
    actions = np.zeros((steps, 7), dtype=np.float32)
    arm = np.zeros(6)
    for t in range(steps):
        arm = 0.8 * arm + 0.2 * rng.standard_normal(6)
        actions[t, :6] = np.clip(arm, -0.5, 0.5)
        actions[t, 2] = 0.6 if t < 15 else 0.3 * actions[t, 2]
        actions[t, 6] = 1.0 if (t // 20) % 2 else -1.0
    return actions


@pytest.fixture(scope="module")
def spatial_pair():
    fast, stock = make("libero_spatial", True), make("libero_spatial", False)
    yield fast, stock
    fast.close()
    stock.close()


def test_libero_fast_step_is_the_default_and_false_selects_the_stock_step():
    assert parse_config(["--env=libero_spatial"]).own_env_options.libero_fast_step is True
    assert parse_config(["--env=libero_spatial", "--libero_fast_step=false"]).own_env_options.libero_fast_step is False
    stock = make("libero_spatial", False)
    try:
        assert stock.fast_step is None
    finally:
        stock.close()


@pytest.mark.slow
def test_one_fast_step_from_each_init_state_equals_the_stock_step_within_1e12():
    """From every init state of a LIBERO-Object task (objects start in contact there, the hardest case for the
    constraint solver), one step with a fixed action: qpos and qvel within 1e-12 of the stock step's. Not bit for
    bit: mj_step1 normalises the free joints' quaternions before the position stage, mj_forward does not, so the
    controller reads kinematics a few ulps away (``test_..._bit_for_bit_without_warm_starts`` checks equality where
    the solver's warm start is out of play)."""
    fast, stock = make("libero_object", True), make("libero_object", False)
    action = np.array([0.3, -0.2, 0.1, 0.05, 0.0, -0.1, 1.0], dtype=np.float32)
    try:
        for env in (fast, stock):
            env.settle_steps = 0  # the step from the init state itself, as the env's data holds it
        for init_state in range(fast.num_init_states(0)):
            for env in (fast, stock):
                env.reset(options={"task": 0, "init_state": init_state})
            np.testing.assert_array_equal(physics_state(fast), physics_state(stock))
            for env in (fast, stock):
                env.step(action)
            difference = np.abs(physics_state(fast) - physics_state(stock)).max()
            assert difference <= 1e-12, f"init state {init_state}: {difference:.3g}"
    finally:
        fast.close()
        stock.close()


def test_the_fast_step_is_the_stock_step_bit_for_bit_without_warm_starts():
    fast, stock = make("libero_object", True), make("libero_object", False)
    try:
        actions = action_sequence(seed=3, steps=6)
        for init_state in (0, 1):
            for env in (fast, stock):
                env.reset(options={"task": 1, "init_state": init_state})
                disable_warm_starts(env)  # a reset keeps the model's options, so the flag holds from here
                env.reset(options={"task": 1, "init_state": init_state})
            np.testing.assert_array_equal(physics_state(fast), physics_state(stock))
            for action in actions:
                fast_obs = fast.step(action)[0]
                stock_obs = stock.step(action)[0]
                np.testing.assert_array_equal(physics_state(fast), physics_state(stock))
                for key in fast_obs:
                    np.testing.assert_array_equal(fast_obs[key], stock_obs[key], err_msg=key)
                # robosuite's own bookkeeping advances as in a stock step
                assert (fast.sim.env.timestep, fast.sim.env.cur_time) == (
                    stock.sim.env.timestep,
                    stock.sim.env.cur_time,
                )
    finally:
        fast.close()
        stock.close()


@pytest.mark.slow
def test_observables_on_clocks_of_their_own_sample_as_in_the_stock_step():
    """The fast step advances the observables' shared sampling clock once per substep; an observable with its own
    rate or a delay sends it back to robosuite's per-substep updates. Either way the observations and every
    observable's clock match the stock step's, bit for bit with warm starts off."""
    fast, stock = make("libero_object", True), make("libero_object", False)
    try:
        for env in (fast, stock):
            env.reset(options={"task": 1, "init_state": 0})
            disable_warm_starts(env)
        for own_clocks in (False, True):
            for env in (fast, stock):
                if own_clocks:
                    proprio = [o.name for o in env.sim.env._observables.values() if o.modality == "robot0_proprio"]
                    env.sim.env.modify_observable(proprio[0], "sampling_rate", 10)
                    env.sim.env.modify_observable(proprio[1], "delayer", lambda: 0.011)
                env.reset(options={"task": 1, "init_state": 0})
            for action in action_sequence(seed=4, steps=5):
                fast_obs, stock_obs = fast.step(action)[0], stock.step(action)[0]
                for key in fast_obs:
                    np.testing.assert_array_equal(fast_obs[key], stock_obs[key], err_msg=f"{key}, {own_clocks=}")
                for name, observable in fast.sim.env._observables.items():
                    theirs = stock.sim.env._observables[name]
                    assert (observable._time_since_last_sample, observable._sampled) == (
                        theirs._time_since_last_sample,
                        theirs._sampled,
                    ), name
    finally:
        fast.close()
        stock.close()


@pytest.mark.parametrize(
    "suite, task, init_states", [("libero_spatial", 0, (0, 2)), ("libero_goal", 2, (5,)), ("libero_10", 1, (2,))]
)
@pytest.mark.slow
def test_over_100_steps_the_robot_stays_within_1e6_and_rewards_and_episode_ends_agree(suite, task, init_states):
    """Seeded 100-step sequences from init states of three suites. The robot's joints stay within 1e-6 of the stock
    step's. Resting objects get a bound that catches a broken step but not rounding: an object's contact can switch
    on an ulp (the stock step itself, started one ulp away, shows the same 1e-5..1e-4 jumps on these sequences)."""
    fast, stock = make(suite, True, max_episode_steps=100), make(suite, False, max_episode_steps=100)
    try:
        for init_state in init_states:
            fast.reset(options={"task": task, "init_state": init_state})
            stock.reset(options={"task": task, "init_state": init_state})
            robot, everything = 0.0, 0.0
            for t, action in enumerate(action_sequence(seed=init_state + 10 * task, steps=100)):
                _, fast_reward, fast_terminated, fast_truncated, fast_info = fast.step(action)
                _, stock_reward, stock_terminated, stock_truncated, stock_info = stock.step(action)
                robot = max(robot, np.abs(robot_state(fast) - robot_state(stock)).max())
                everything = max(everything, np.abs(physics_state(fast) - physics_state(stock)).max())
                where = f"init state {init_state}, step {t + 1}"
                assert robot <= 1e-6, f"{where}: the robot's joints differ by {robot:.3g}"
                assert everything <= 1e-3, f"{where}: the scene differs by {everything:.3g}"
                assert (fast_reward, fast_terminated, fast_truncated) == (
                    stock_reward,
                    stock_terminated,
                    stock_truncated,
                ), where
                assert fast_info == stock_info, where
            assert fast_truncated and not fast_terminated  # the sequences succeed at nothing: the step limit ends both
    finally:
        fast.close()
        stock.close()


def test_success_is_detected_at_the_same_step_by_the_fast_and_stock_step(spatial_pair):
    # libero_spatial task 0, "put the black bowl on the plate": the bowl placed just above the plate settles onto
    # it under gripper-open no-ops; both steps must see the success at the same step, with the same reward.
    outcomes = []
    for env in spatial_pair:
        env.reset(options={"task": 0, "init_state": 0})
        sim = env.sim.env.sim
        joint = "akita_black_bowl_1_joint0"
        qpos = sim.data.get_joint_qpos(joint).copy()
        qpos[:3] = sim.data.get_body_xpos("plate_1_main") + np.array([0.0, 0.0, 0.05])
        sim.data.set_joint_qpos(joint, qpos)
        sim.data.set_joint_qvel(joint, np.zeros(6))
        sim.forward()
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated) and steps < 20:
            _, reward, terminated, truncated, info = env.step(GRIPPER_OPEN_NOOP)
            steps += 1
        outcomes.append((steps, reward, terminated, truncated, info.get("success")))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2:] == (True, False, True)
