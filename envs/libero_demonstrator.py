"""A scripted demonstrator for LIBERO's pick-and-place tasks, from privileged simulator state.

It reads what a policy does not see (the pose and size of the object of interest and of the target region, from
the task's BDDL goal and the MuJoCo model) and sends the same 7-dim OSC actions a policy sends: a position
delta (scaled by the controller to at most 5 cm a step), a rotation delta (at most 0.5 rad) and the gripper
(-1 open, +1 closed). One episode walks through these phases::

    align    above the object, gripper open, yawed so the fingers close across the object's narrow side
    descend  to the grasp height (below the top for a tall object, the middle for a flat one)
    grasp    close, holding still
    lift     straight up, until the object clears the target's rim
    carry    over the target region
    lower    to just above the rim
    release  open, then move up and wait for the success check

It solves the goals ``(In obj region)`` and ``(On obj region)`` whose object can be picked from above: all of
LIBERO-Object, and the pick-and-place tasks of the other suites (``solvable`` says which). The env must be a
``sfengine_envs.libero_suite.LiberoSuiteEnv``.

Example::

    env = LiberoSuiteEnv("libero_object")
    demonstrator = PickPlaceDemonstrator()
    obs, info = env.reset(options={"task": 0, "init_state": 3})
    demonstrator.reset(env)
    while True:
        obs, reward, terminated, truncated, info = env.step(demonstrator.act(env))
        if terminated or truncated:
            break
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POSITION_STEP = 0.05  # metres a unit of position action moves the controller's goal (OSC output_max)
ROTATION_STEP = 0.5  # radians a unit of rotation action turns it
OPEN, CLOSED = -1.0, 1.0
PICK_PREDICATES = ("in", "on")


@dataclass
class Box:
    """An axis-aligned extent in the world frame (lo, hi) and the object's yaw of its narrow horizontal side."""

    lo: np.ndarray
    hi: np.ndarray
    narrow_axis: np.ndarray | None  # unit xy vector across the narrow side; None when the footprint is round

    @property
    def centre(self) -> np.ndarray:
        return (self.lo + self.hi) / 2


def _geoms_of(model, body_prefix: str) -> list[int]:
    import mujoco

    found = []
    for geom in range(model.ngeom):
        body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, model.geom_bodyid[geom]) or ""
        collides = model.geom_contype[geom] or model.geom_conaffinity[geom]
        if body.startswith(body_prefix) and collides:
            found.append(geom)
    return found


def _geom_points(model, data, geom: int) -> np.ndarray:
    """The world positions of a geom's mesh vertices, or of its bounding box corners."""
    import mujoco

    rotation = data.geom_xmat[geom].reshape(3, 3)
    if model.geom_type[geom] == mujoco.mjtGeom.mjGEOM_MESH:
        mesh = model.geom_dataid[geom]
        start, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
        local = model.mesh_vert[start : start + count]
    else:
        size = model.geom_size[geom]
        half = size if model.geom_type[geom] == mujoco.mjtGeom.mjGEOM_BOX else np.full(3, model.geom_rbound[geom])
        local = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) * half
    return local @ rotation.T + data.geom_xpos[geom]


def body_box(model, data, body_prefix: str, body_id: int) -> Box:
    """The world extent of the collision geoms of the bodies named ``body_prefix...``, with the narrow side's
    direction measured in the frame of body ``body_id`` (the object's root)."""
    points = np.concatenate([_geom_points(model, data, geom) for geom in _geoms_of(model, body_prefix)])
    rotation = data.xmat[body_id].reshape(3, 3)
    local = (points - data.xpos[body_id]) @ rotation
    extent = local.max(0) - local.min(0)
    narrow_axis = None
    if abs(extent[0] - extent[1]) > 0.2 * max(extent[0], extent[1]):
        axis = rotation[:, 0] if extent[0] < extent[1] else rotation[:, 1]
        narrow_axis = axis[:2] / np.linalg.norm(axis[:2])
    return Box(points.min(0), points.max(0), narrow_axis)


def pick_goal(robosuite_env) -> tuple[str, str] | None:
    """(object, target region) of a task whose goal is one ``in``/``on`` predicate, else None."""
    goal = robosuite_env.parsed_problem["goal_state"]
    if len(goal) != 1 or goal[0][0] not in PICK_PREDICATES:
        return None
    _, obj, region = goal[0]
    if obj not in robosuite_env.obj_body_id:
        return None
    return obj, region


def solvable(env, task: int) -> bool:
    """Whether the demonstrator handles ``task`` of ``env``'s suite (its goal is one pick-and-place predicate)."""
    env.reset(options={"task": task, "init_state": 0})
    return pick_goal(env.sim.env) is not None


class PickPlaceDemonstrator:
    """Phase machine that turns privileged state into OSC actions; see the module docstring."""

    def __init__(self, gain: float = 12.0, yaw_gain: float = 2.0, clearance: float = 0.05):
        self.gain, self.yaw_gain, self.clearance = gain, yaw_gain, clearance

    def reset(self, env) -> None:
        rs = env.sim.env
        goal = pick_goal(rs)
        if goal is None:
            raise ValueError(f"task {env.task} ({env.task_names[env.task]}) is not a single pick-and-place goal")
        self.object, self.region = goal
        model, data = rs.sim.model._model, rs.sim.data._data
        self.object_id = rs.obj_body_id[self.object]
        box = body_box(model, data, self.object, self.object_id)
        self.height = box.hi[2] - box.lo[2]
        # Fingers reach about 4 cm down from the grip site: hold a tall object that far below its top, a flat
        # one by its middle.
        self.grasp_above_bottom = max(self.height - 0.035, self.height / 2)
        self.narrow_axis = box.narrow_axis
        # A region is named after the object that holds it ("basket_1_contain_region"); a fixture's region
        # (a table area) has no object, and its rim is the region itself.
        owners = [name for name in rs.obj_body_id if self.region.startswith(name + "_")]
        self.target_body = max(owners, key=len) if owners else None
        self.phase, self.phase_steps = "align", 0

    def _target(self, env) -> tuple[np.ndarray, float]:
        """Where the object goes (xy of the region) and the height of the target's rim."""
        rs = env.sim.env
        model, data = rs.sim.model._model, rs.sim.data._data
        site = rs.object_sites_dict[self.region]
        import mujoco

        site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site.name)
        xy = data.site_xpos[site_id][:2].copy()
        rim = data.site_xpos[site_id][2]
        if self.target_body is not None:
            rim = body_box(model, data, self.target_body, rs.obj_body_id[self.target_body]).hi[2]
        return xy, rim

    def _yaw_error(self, env) -> float:
        """Radians to turn the gripper about z so its fingers close across the object's narrow side."""
        if self.narrow_axis is None:
            return 0.0
        rs = env.sim.env
        data = rs.sim.data._data
        model = rs.sim.model._model
        import mujoco

        left = data.xpos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "gripper0_leftfinger")]
        right = data.xpos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "gripper0_rightfinger")]
        fingers = (left - right)[:2]
        error = np.arctan2(self.narrow_axis[1], self.narrow_axis[0]) - np.arctan2(fingers[1], fingers[0])
        return (error + np.pi / 2) % np.pi - np.pi / 2  # the fingers are symmetric: a half turn is no turn

    def act(self, env) -> np.ndarray:
        rs = env.sim.env
        data = rs.sim.data._data
        eef = np.array(rs._eef_xpos)
        obj = data.xpos[self.object_id]
        model = rs.sim.model._model
        box = body_box(model, data, self.object, self.object_id)
        bottom = box.lo[2]
        target_xy, rim = self._target(env)
        grasp_z = bottom + self.grasp_above_bottom
        carry_z = rim + self.grasp_above_bottom + self.clearance
        gripper, yaw = OPEN, 0.0
        self.phase_steps += 1
        phase = self.phase
        if phase == "align":
            goal = np.array([*box.centre[:2], max(box.hi[2] + 0.06, eef[2] - 0.02)])
            yaw = self._yaw_error(env)
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.01 and abs(yaw) < 0.05:
                self._next("descend")
        elif phase == "descend":
            goal = np.array([*box.centre[:2], grasp_z])
            yaw = self._yaw_error(env)
            if abs(eef[2] - grasp_z) < 0.01 or self.phase_steps > 60:
                self._next("grasp")
        elif phase == "grasp":
            goal, gripper = np.array([*box.centre[:2], grasp_z]), CLOSED
            if self.phase_steps >= 12:
                self._next("lift")
        elif phase == "lift":
            goal, gripper = np.array([*eef[:2], carry_z + 0.02]), CLOSED
            if eef[2] > carry_z - 0.01:
                self._next("carry")
        elif phase == "carry":
            goal, gripper = np.array([*target_xy - (box.centre[:2] - eef[:2]), carry_z]), CLOSED
            if np.linalg.norm(box.centre[:2] - target_xy) < 0.015:
                self._next("lower")
        elif phase == "lower":
            goal, gripper = np.array([*eef[:2], rim + self.grasp_above_bottom + 0.01]), CLOSED
            if bottom < rim + 0.015 or self.phase_steps > 20:
                self._next("release")
        elif phase == "release":
            goal = eef.copy()
            if self.phase_steps >= 10:
                self._next("retreat")
        else:
            goal = np.array([*eef[:2], carry_z + 0.1])
        del obj
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip(self.gain * (goal - eef), -1.0, 1.0)
        action[5] = np.clip(self.yaw_gain * yaw / ROTATION_STEP, -1.0, 1.0)
        action[6] = gripper
        return action

    def _next(self, phase: str) -> None:
        self.phase, self.phase_steps = phase, 0
