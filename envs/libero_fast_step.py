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
in contact. Everything else is robosuite's own code, called in the stock order: the controller and gripper
(``_pre_action``), the observables' per-substep sampling (``_update_observables``), the bookkeeping and LIBERO's
object-state tracking (``_post_action``), and the observations.

**Parity.** A step from the same state agrees with the stock step within 1e-13 (qpos, qvel), not bit for bit:
``mj_step1`` normalises free joints' quaternions before the position stage and ``mj_forward`` does not, so the
controller and the two solves see a configuration a few ulps away from the stock step's. With warm starts
disabled (``mjDSBL_WARMSTART``) the results are bit-identical in the cases the tests check. Over longer sequences
these ulps grow as any perturbation does in contact-rich scenes: the stock step itself, started one ulp away in a
single joint angle, ends up to 0.1 away after 110 steps on some sequences, and the fast step stays within the
same envelope (``benchmarks/README.md``). One quantity differs in kind: robosuite's history of end-effector force
readings (``robot.recent_ee_forcetorques``), read from acceleration-stage sensors that ``mj_step1`` does not
compute; no LIBERO observation, reward or success uses it.
"""

from __future__ import annotations

import mujoco
import numpy as np


def _forward_already_done() -> None:
    """Stands in for ``MjSim.forward`` while the controller runs: ``mj_step1`` has just computed what it reads."""


def fast_step(env, action: np.ndarray) -> dict:
    """Advance robosuite env ``env`` (the task env inside LIBERO's ``ControlEnv``) by one control step with
    ``action`` (float64, the robots' action dimensions) and return its observations, as ``env.step`` would. The
    caller evaluates success (``env._check_success()``) as it would after a stock step."""
    if env.done:
        raise ValueError("executing action in terminated episode")
    sim = env.sim
    model, data = sim.model._model, sim.data._data
    env.timestep += 1
    policy_step = True  # the first substep sets the controller's goal; the others only track it
    sim.forward = _forward_already_done  # an instance attribute, removed below: the class's method returns
    try:
        for _ in range(int(env.control_timestep / env.model_timestep)):
            mujoco.mj_step1(model, data)
            for _ in range(2):  # the stock step's two solves with the previous ctrl, for the solver's warm start
                mujoco.mj_fwdActuation(model, data)
                mujoco.mj_fwdAcceleration(model, data)
                mujoco.mj_fwdConstraint(model, data)
            env._pre_action(action, policy_step)
            mujoco.mj_step2(model, data)
            env._update_observables()
            policy_step = False
    finally:
        del sim.forward
    env.cur_time += env.control_timestep  # at once, as the stock step does, to avoid accumulating rounding
    env._post_action(action)
    return env._get_observations()
