"""A LIBERO env step with the stock physics at a fraction of the cost (``--libero_fast_step``, on by default).

robosuite 1.4 advances an env step (20 Hz control) in 25 MuJoCo substeps of 2 ms. Stock, each substep runs::

    mj_forward              base.step: the controller must see the current state
    mj_forward              the controller's update(): the same state again
    controller, gripper     Python: torques and gripper commands into ctrl
    mj_step                 normalise quaternions, the forward dynamics a third time (with the new ctrl), Euler

Each forward pass is a position stage (kinematics, collisions, constraints, mass matrix: about 70% of it), a
velocity stage, and a constraint solve. The fast step computes the position and velocity stages once::

    mj_step1                normalise quaternions; position and velocity stages
    solve, solve            actuation, acceleration, constraint solver with the previous ctrl, twice
    controller, gripper     the same Python, reading what mj_step1 computed
    mj_step2                actuation, acceleration and the constraint solver with the new ctrl; Euler

The two solves with the previous ctrl look redundant but are not: the constraint solver (Newton's method, which
stops at a tolerance) starts from the acceleration of its last solve (``qacc_warmstart``), so the stock step's
last solve starts from the second of them. Without them (``mj_step1``, controller, ``mj_step2``: about 20% faster
still) the first step after a reset already differs by up to 1e-5 in qvel on LIBERO-Object, where objects start
in contact. The Python between the solves is robosuite's own on the policy step (``_pre_action``: the new goal, the
robot's history buffers). On the other 24 substeps the controller only tracks that goal, and ``ArmTracker`` does
that work with the same numpy and robosuite functions in the same order, without robosuite's per-call name
lookups, property arrays and repeated Jacobians (about 3x less Python); it serves robosuite's operational-space
controller with a fixed impedance and no interpolator (LIBERO's ``OSC_POSE``) and hands anything else back to
robosuite's code. The rest is robosuite's too, in the stock order: the observables' per-substep sampling
(``_update_observables``; when the observables share one clock, as they do in LIBERO, ``tick`` advances it once
per substep and calls their updates only on the substeps where they sample or start a new period), the
bookkeeping and LIBERO's object-state tracking (``_post_action``), and the observations.

**Parity.** A step from the same state agrees with the stock step within 1e-13 (qpos, qvel), not bit for bit:
``mj_step1`` normalises free joints' quaternions before the position stage and ``mj_forward`` does not, so the
controller and the two solves see a configuration a few ulps away from the stock step's. With warm starts
disabled (``mjDSBL_WARMSTART``) the results are bit-identical in the cases the tests check. Over longer sequences
these ulps grow as any perturbation does in contact-rich scenes: the stock step itself, started one ulp away in
qvel, ends up to 0.1 away after 110 steps on some sequences, and the fast step's differences (a few ulps every
substep, not one at the start) span the same range, though not always on the same sequences
(``benchmarks/README.md``). One quantity differs in kind: robosuite's history of end-effector force
readings (``robot.recent_ee_forcetorques``), read from acceleration-stage sensors that ``mj_step1`` does not
compute; no LIBERO observation, reward or success uses it.
"""

from __future__ import annotations

from typing import NamedTuple

import mujoco
import numpy as np
from robosuite.controllers.osc import OperationalSpaceController
from robosuite.utils.control_utils import nullspace_torques, opspace_matrices, orientation_error
from robosuite.utils.observables import NO_DELAY, Observable


def _forward_already_done() -> None:
    """Stands in for ``MjSim.forward`` while the controller runs: ``mj_step1`` has just computed what it reads."""


class ArmTracker:
    """A substep of robosuite's control that only tracks the goal set on the policy step (``robot.control(action,
    policy_step=False)``), for one arm under operational-space control: the same arithmetic, the lookups done once.

    ``ArmTracker.for_env(env)`` is None when the env's robots or controller are of another kind; the fast step then
    calls robosuite's own code on every substep."""

    def __init__(self, env):
        sim = env.sim
        self.robot = robot = env.robots[0]
        controller = robot.controller  # replaced by a new one at every reset: __call__ looks it up
        self.model, self.data = sim.model._model, sim.data._data
        self.site = sim.model.site_name2id(controller.eef_name)
        self.qpos_index = np.asarray(controller.qpos_index)
        self.qvel_index = np.asarray(controller.qvel_index)
        self.arm_actuators = np.asarray(robot._ref_joint_actuator_indexes)
        self.torque_low, self.torque_high = (np.array(limit) for limit in robot.torque_limits)
        self.gripper_actuators = np.asarray([sim.model.actuator_name2id(name) for name in robot.gripper.actuators])
        ctrl_range = sim.model.actuator_ctrlrange[self.gripper_actuators]
        self.gripper_bias = 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0])
        self.gripper_weight = 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])
        nv = self.model.nv
        self.jacp, self.jacr, self.full_mass_matrix = np.zeros((3, nv)), np.zeros((3, nv)), np.zeros((nv, nv))

    @classmethod
    def for_env(cls, env) -> ArmTracker | None:
        if len(env.robots) != 1 or not getattr(env.robots[0], "has_gripper", False):
            return None
        controller = env.robots[0].controller
        if (
            type(controller) is not OperationalSpaceController
            or controller.impedance_mode != "fixed"
            or controller.interpolator_pos is not None
            or controller.interpolator_ori is not None
        ):
            return None
        return cls(env)

    def __call__(self, action: np.ndarray) -> None:
        c, data = self.robot.controller, self.data
        # The controller's update(), its state read from what mj_step1 computed.
        mujoco.mj_jacSite(self.model, data, self.jacp, self.jacr, self.site)
        c.ee_pos = np.array(data.site_xpos[self.site])
        c.ee_ori_mat = np.array(data.site_xmat[self.site].reshape([3, 3]))
        c.ee_pos_vel = np.dot(self.jacp, data.qvel)
        c.ee_ori_vel = np.dot(self.jacr, data.qvel)
        c.joint_pos = data.qpos[self.qpos_index]
        c.joint_vel = data.qvel[self.qvel_index]
        c.J_pos = self.jacp[:, self.qvel_index]
        c.J_ori = self.jacr[:, self.qvel_index]
        c.J_full = np.vstack([c.J_pos, c.J_ori])
        mujoco.mj_fullM(self.model, self.full_mass_matrix, data.qM)
        c.mass_matrix = self.full_mass_matrix[self.qvel_index, :][:, self.qvel_index]
        # run_controller(): operational-space torques towards the goal, plus gravity and the nullspace posture.
        position_error = np.array(c.goal_pos) - c.ee_pos
        ori_error = orientation_error(np.array(c.goal_ori), c.ee_ori_mat)
        desired_force = np.multiply(position_error, c.kp[0:3]) + np.multiply(-c.ee_pos_vel, c.kd[0:3])
        desired_torque = np.multiply(ori_error, c.kp[3:6]) + np.multiply(-c.ee_ori_vel, c.kd[3:6])
        lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(
            c.mass_matrix, c.J_full, c.J_pos, c.J_ori
        )
        if c.uncoupling:
            wrench = np.concatenate([np.dot(lambda_pos, desired_force), np.dot(lambda_ori, desired_torque)])
        else:
            wrench = np.dot(lambda_full, np.concatenate([desired_force, desired_torque]))
        torques = np.dot(c.J_full.T, wrench) + data.qfrc_bias[self.qvel_index]
        torques += nullspace_torques(c.mass_matrix, nullspace_matrix, c.initial_joint, c.joint_pos, c.joint_vel)
        c.torques = torques
        c.new_update = True  # as run_controller() leaves it: the next policy step's set_goal() reads the state
        # robot.control(): clip, then the gripper (its own format_action keeps its state) and the ctrl.
        robot = self.robot
        robot.torques = np.clip(torques, self.torque_low, self.torque_high)
        gripper_action = robot.gripper.format_action(action[c.control_dim :])
        data.ctrl[self.gripper_actuators] = self.gripper_bias + self.gripper_weight * gripper_action
        data.ctrl[self.arm_actuators] = robot.torques


class ObservableClock(NamedTuple):
    """The sampling clock that robosuite's observables each keep, when they all keep the same one."""

    elapsed: float  # seconds since the last sampling period began
    sampled: bool  # sampled in this period yet
    period: float  # the sampling timestep


def shared_clock(observables: list[Observable]) -> ObservableClock | None:
    """The clock of the enabled ``observables`` if they all keep the same one with no delay (robosuite's default:
    one sampling rate, ``NO_DELAY``, all reset together), else None."""
    if not observables:
        return None
    first = observables[0]
    clock = ObservableClock(first._time_since_last_sample, first._sampled, first._sampling_timestep)
    for observable in observables:
        if (
            observable._delayer is not NO_DELAY
            or observable._time_since_last_sample != clock.elapsed
            or observable._sampled != clock.sampled
            or observable._sampling_timestep != clock.period
        ):
            return None
    return clock


def tick(observables: list[Observable], clock: ObservableClock, timestep: float, obs_cache: dict) -> ObservableClock:
    """One substep of ``Observable.update`` for observables sharing ``clock``. On most substeps an update only adds
    ``timestep`` to each observable's clock: that is done once, here, and written back at the end of the step. On a
    substep where the clock makes them sample or start a new period, each runs its own ``update`` from the clock's
    value, so the observations and the clock's arithmetic are robosuite's, operation for operation."""
    elapsed = clock.elapsed + timestep
    if (not clock.sampled and clock.period >= elapsed) or elapsed >= clock.period:
        for observable in observables:
            observable._time_since_last_sample = clock.elapsed
            observable.update(timestep=timestep, obs_cache=obs_cache)
        first = observables[0]
        return ObservableClock(first._time_since_last_sample, first._sampled, clock.period)
    return clock._replace(elapsed=elapsed)


def fast_step(env, action: np.ndarray, tracker: ArmTracker | None = None) -> dict:
    """Advance robosuite env ``env`` (the task env inside LIBERO's ``ControlEnv``) by one control step with
    ``action`` (float64, the robots' action dimensions) and return its observations, as ``env.step`` would. The
    caller evaluates success (``env._check_success()``) as it would after a stock step. ``tracker``
    (``ArmTracker.for_env(env)``, built once per simulator) does the substeps after the first."""
    if env.done:
        raise ValueError("executing action in terminated episode")
    sim = env.sim
    model, data = sim.model._model, sim.data._data
    env.timestep += 1
    policy_step = True  # the first substep sets the controller's goal; the others only track it
    observables = [observable for observable in env._observables.values() if observable._enabled]
    clock = shared_clock(observables)
    obs_cache, model_timestep = env._obs_cache, env.model_timestep
    sim.forward = _forward_already_done  # an instance attribute, removed below: the class's method returns
    try:
        for _ in range(int(env.control_timestep / env.model_timestep)):
            mujoco.mj_step1(model, data)
            for _ in range(2):  # the stock step's two solves with the previous ctrl, for the solver's warm start
                mujoco.mj_fwdActuation(model, data)
                mujoco.mj_fwdAcceleration(model, data)
                mujoco.mj_fwdConstraint(model, data)
            if policy_step or tracker is None:
                env._pre_action(action, policy_step)
            else:
                tracker(action)
            mujoco.mj_step2(model, data)
            if clock is None:
                env._update_observables()
            else:
                clock = tick(observables, clock, model_timestep, obs_cache)
            policy_step = False
    finally:
        del sim.forward
    if clock is not None:
        for observable in observables:
            observable._time_since_last_sample = clock.elapsed
    env.cur_time += env.control_timestep  # at once, as the stock step does, to avoid accumulating rounding
    env._post_action(action)
    return env._get_observations()
