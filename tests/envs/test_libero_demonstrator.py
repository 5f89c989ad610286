"""The scripted LIBERO demonstrator on real simulators: the footprint it grasps by, and a whole episode."""

from __future__ import annotations

from helpers import make_env, requires_libero

pytestmark = requires_libero


def test_an_object_standing_on_its_own_y_axis_is_measured_across_its_horizontal_footprint():
    # LIBERO-Object's alphabet soup can stands on its model's y axis: measured in its own x and y, its footprint
    # took its 7.6 cm height for a width, too wide for the fingers, and the demonstrator tried to hold the can by
    # a rim it does not have (0 of 50 init states). Its footprint is a 6.3 cm circle.
    from sfengine_envs.libero_demonstrator import FINGER_REACH, PickPlaceDemonstrator, body_box

    env = make_env("libero_object")
    try:
        env.reset(options={"task": 0, "init_state": 0})
        demonstrator = PickPlaceDemonstrator()
        demonstrator.reset(env)
        rs = env.sim.env
        box = body_box(rs.sim.model._model, rs.sim.data._data, demonstrator.object, demonstrator.object_id)
        height = box.hi[2] - box.lo[2]
        assert demonstrator.object.startswith("alphabet_soup")
        assert box.narrow_axis is None and abs(box.long_width - 0.063) < 0.003, box
        assert box.long_width < FINGER_REACH < height and not demonstrator.rim_grasp
        for _ in range(280):
            _, _, terminated, truncated, _ = env.step(demonstrator.act(env))
            if terminated or truncated:
                break
        assert terminated, "the can did not reach the basket"
    finally:
        env.close()
