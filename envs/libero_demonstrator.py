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
LIBERO-Object, and the pick-and-place tasks of the other suites (``reset`` raises ValueError for another
goal). The env must be a ``sfengine_envs.libero_suite.LiberoSuiteEnv``.

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
# The Panda hand seen from above, around the grip point: 21 x 7 cm, its underside 3 cm above the grip point
# (measured from the model's collision geoms); its open fingers hold at most about 7.5 cm.
HAND_HALF_LENGTH, HAND_HALF_WIDTH, HAND_ABOVE_GRIP = 0.105, 0.035, 0.03
FINGER_REACH = 0.075
PICK_PREDICATES = ("in", "on")


@dataclass
class Box:
    """An object's axis-aligned extent in the world frame (lo, hi), and its footprint in its own frame: the unit
    xy vector across its narrow side (None when the footprint is about round) and its widths across and along."""

    lo: np.ndarray
    hi: np.ndarray
    narrow_axis: np.ndarray | None
    narrow_width: float
    long_width: float

    @property
    def centre(self) -> np.ndarray:
        return (self.lo + self.hi) / 2


def _body_id(model, name: str) -> int:
    import mujoco

    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)


def _site_id(model, name: str) -> int:
    import mujoco

    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name)


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


def body_points(model, data, body_prefix: str) -> np.ndarray:
    """World positions of the collision geoms' points of the bodies named ``body_prefix...``: [N, 3]."""
    return np.concatenate([_geom_points(model, data, geom) for geom in _geoms_of(model, body_prefix)])


def body_box(model, data, body_prefix: str, body_id: int) -> Box:
    """The world extent of the collision geoms of the bodies named ``body_prefix...``, with the narrow side's
    direction measured in the frame of body ``body_id`` (the object's root)."""
    points = body_points(model, data, body_prefix)
    rotation = data.xmat[body_id].reshape(3, 3)
    local = (points - data.xpos[body_id]) @ rotation
    extent = local.max(0) - local.min(0)
    # The footprint lies across the two body axes nearest the horizontal: an object's model may stand on its own
    # x or y axis (LIBERO-Object's alphabet soup can stands on y, whose extent is its height).
    up = int(np.argmax(np.abs(rotation[2])))
    narrow_k, long_k = sorted((k for k in range(3) if k != up), key=lambda k: extent[k])
    narrow, long = extent[narrow_k], extent[long_k]
    narrow_axis = None
    if long - narrow > 0.2 * long:
        axis = rotation[:, narrow_k]
        narrow_axis = axis[:2] / np.linalg.norm(axis[:2])
    return Box(points.min(0), points.max(0), narrow_axis, narrow, long)


def unit(angle: float) -> np.ndarray:
    return np.array([np.cos(angle), np.sin(angle)])


def footprint_clearance(
    points_xy: np.ndarray, centre: np.ndarray, axis: np.ndarray, half_length: float, half_width: float
) -> float:
    """Signed distance from the nearest of ``points_xy`` to a rectangle centred at ``centre`` whose long side
    runs along ``axis``: positive outside, negative inside (by the depth). +inf for no points."""
    if not len(points_xy):
        return float("inf")
    offset = points_xy - centre
    along = np.abs(offset @ axis) - half_length
    across = np.abs(offset @ np.array([-axis[1], axis[0]])) - half_width
    outside = np.hypot(np.maximum(along, 0.0), np.maximum(across, 0.0))
    inside = np.minimum(np.maximum(along, across), 0.0)
    return float(np.min(np.where(outside > 0, outside, inside)))


def pick_goal(robosuite_env) -> tuple[str, str] | None:
    """(object, target region) of a task whose goal is one ``in``/``on`` predicate, else None."""
    goal = robosuite_env.parsed_problem["goal_state"]
    if len(goal) != 1 or goal[0][0] not in PICK_PREDICATES:
        return None
    _, obj, region = goal[0]
    if obj not in robosuite_env.obj_body_id:
        return None
    return obj, region


class PickPlaceDemonstrator:
    """Phase machine that turns privileged state into OSC actions; see the module docstring."""

    def __init__(self, gain: float = 0.6, yaw_gain: float = 2.0, clearance: float = 0.05):
        """``gain``: the share of the remaining distance (``yaw_gain``: of the remaining yaw) the controller's goal
        moves each step, up to the controller's limit; ``clearance``: metres the carried object clears the rim by."""
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
        # The fingertips reach about 4 cm below the hand: hold a tall object that far below its top, a flat one
        # by its middle.
        self.grasp_above_bottom = max(self.height - 0.035, self.height / 2)
        # Too wide for the fingers and round (a bowl): held by its rim, one finger inside.
        self.rim_grasp = box.narrow_axis is None and box.long_width > FINGER_REACH
        if self.rim_grasp:
            self.grasp_above_bottom = self.height - 0.02
        # A region is named after the object that holds it ("basket_1_contain_region"); a fixture's region
        # (a table area) has no object, and its rim is the region itself.
        # The target may also be an object itself ("On bowl plate_1").
        owners = [name for name in rs.obj_body_id if self.region == name or self.region.startswith(name + "_")]
        self.target_body = max(owners, key=len) if owners else None
        self.left_finger = _body_id(model, "gripper0_leftfinger")
        self.right_finger = _body_id(model, "gripper0_rightfinger")
        self.finger_axis, self.grasp_offset = self._choose_grasp(rs, box)
        self.phase, self.phase_steps = "align", 0

    def _choose_grasp(self, rs, box: Box) -> tuple[np.ndarray, np.ndarray]:
        """The direction the fingers close along and the grasp point's offset from the object's centre, chosen
        so that the hand (a 21 x 7 cm block whose underside is 3 cm above the grip point) misses the neighbours
        standing taller than it. A box is held across its narrow side, turned at most 25 degrees (while its
        width across stays under the fingers' reach) and moved along its long side; a round object at any yaw; a
        bowl by its rim, from any side."""
        model, data = rs.sim.model._model, rs.sim.data._data
        hand_bottom = box.lo[2] + self.grasp_above_bottom + HAND_ABOVE_GRIP
        standing = [body_points(model, data, name) for name in rs.obj_body_id if name != self.object]
        points = np.concatenate(
            [p[:, :2] for p in standing if p[:, 2].max() > hand_bottom - 0.01] or [np.zeros((0, 2))]
        )
        centre = box.centre[:2]
        current = self._finger_direction(data)
        turns = (0, 15, -15, 30, -30, 45, -45, 60, -60, 75, -75, 90)
        if self.rim_grasp:  # the fingers close across the rim: the grip point sits on it, the axis radial
            base, rim = np.arctan2(current[1], current[0]), box.long_width / 2 - 0.005
            candidates = [
                (unit(base + np.radians(d)), side * rim * unit(base + np.radians(d))) for d in turns for side in (1, -1)
            ]
        elif box.narrow_axis is None:
            base = np.arctan2(current[1], current[0])
            candidates = [(unit(base + np.radians(d)), np.zeros(2)) for d in turns]
        else:
            base = np.arctan2(box.narrow_axis[1], box.narrow_axis[0])
            long_axis = np.array([-box.narrow_axis[1], box.narrow_axis[0]])
            reach = max(box.long_width / 2 - 0.015, 0.0)
            candidates = [
                (unit(base + np.radians(d)), s * long_axis)
                for d in (0, 10, -10, 20, -20, 25, -25)
                if box.narrow_width * np.cos(np.radians(d)) + box.long_width * abs(np.sin(np.radians(d))) < FINGER_REACH
                for s in sorted({0.0, reach / 2, -reach / 2, reach, -reach}, key=abs)
            ]
        scored = [
            (footprint_clearance(points, centre + offset, axis, HAND_HALF_LENGTH, HAND_HALF_WIDTH), axis, offset)
            for axis, offset in candidates
        ]
        for clearance, axis, offset in scored:  # the first (the least turned and moved) that is clear
            if clearance > 0.01:
                return axis, offset
        _, axis, offset = max(scored, key=lambda c: c[0])
        return axis, offset

    def _target(self, env) -> tuple[np.ndarray, float]:
        """Where the object goes (xy of the region) and the height of the target's rim."""
        rs = env.sim.env
        model, data = rs.sim.model._model, rs.sim.data._data
        target = None
        if self.target_body is not None:
            target = body_box(model, data, self.target_body, rs.obj_body_id[self.target_body])
        if self.region in rs.object_sites_dict:
            site_xpos = data.site_xpos[_site_id(model, rs.object_sites_dict[self.region].name)]
            return site_xpos[:2].copy(), site_xpos[2] if target is None else target.hi[2]
        return target.centre[:2], target.hi[2]

    def _finger_direction(self, data) -> np.ndarray:
        fingers = (data.xpos[self.left_finger] - data.xpos[self.right_finger])[:2]
        return fingers / np.linalg.norm(fingers)

    def _yaw_error(self, env) -> float:
        """Radians to turn the gripper about z so its fingers close along the chosen direction."""
        fingers = self._finger_direction(env.sim.env.sim.data._data)
        error = np.arctan2(self.finger_axis[1], self.finger_axis[0]) - np.arctan2(fingers[1], fingers[0])
        return (error + np.pi / 2) % np.pi - np.pi / 2  # the fingers are symmetric: a half turn is no turn

    def act(self, env) -> np.ndarray:
        rs = env.sim.env
        data = rs.sim.data._data
        eef = np.array(rs._eef_xpos)
        model = rs.sim.model._model
        box = body_box(model, data, self.object, self.object_id)
        bottom = box.lo[2]
        target_xy, rim = self._target(env)
        grasp_z = bottom + self.grasp_above_bottom
        grasp_xy = box.centre[:2] + self.grasp_offset
        carry_z = rim + self.grasp_above_bottom + self.clearance
        gripper, yaw = OPEN, 0.0
        self.phase_steps += 1
        phase = self.phase
        if phase == "align":
            goal = np.array([*grasp_xy, max(box.hi[2] + 0.06, eef[2] - 0.02)])
            yaw = self._yaw_error(env)
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.01 and abs(yaw) < 0.05:
                self._next("descend")
        elif phase == "descend":
            goal = np.array([*grasp_xy, grasp_z])
            yaw = self._yaw_error(env)
            if abs(eef[2] - grasp_z) < 0.01 or self.phase_steps > 60:
                self._next("grasp")
        elif phase == "grasp":
            goal, gripper = np.array([*grasp_xy, grasp_z]), CLOSED
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
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip(self.gain * (goal - eef) / POSITION_STEP, -1.0, 1.0)
        action[5] = np.clip(self.yaw_gain * yaw / ROTATION_STEP, -1.0, 1.0)
        action[6] = gripper
        return action

    def _next(self, phase: str) -> None:
        self.phase, self.phase_steps = phase, 0
