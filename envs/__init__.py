"""sfengine's built-in environments, installed as the package ``sfengine_envs``.

Importing this package registers every built-in env with ``sfengine.register_env``. Plain gymnasium ids need no
registration: ``--env=CartPole-v1`` works as it is.

- ``chunk_probe``, ``chunk_probe_truncated``: 6-step episodes that show the order actions arrive in (action chunks).
- ``image_bandit``: a dict observation (16x16 uint8 image + vector) whose answer is only in the image.
- ``image_reach``: sparse_reach with the goal shown only in a 12x12 image (off-policy learning from pixels).
- ``multitask_toy``: 4 tasks x 5 init states, for the task scheduling machinery.
- ``sparse_reach``: a 2-dim continuous reach with a sparse 0/1 success reward (learning must not depend on the
  reward's scale).
- ``multitask_reach``: sparse_reach as 8 tasks x 10 init states, for critic-free group advantages (rloo, grpo).
- ``synthetic``: a fixed CPU cost per step and a configurable observation, to measure the engine's overhead.
- ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, ``libero_90``: LIBERO suites (needs the
  ``libero`` extra: ``pip install -e '.[libero]'``; LIBERO is imported only when such an env is built).

The reach envs and the LIBERO suites also register a scripted demonstrator (``python -m sfengine.demos``): the
reach one heads for the goal, LIBERO's picks and places (``libero_demonstrator``).
"""

from functools import partial

from sfengine.env.registry import register_env
from sfengine_envs.chunk_probe import make_chunk_probe, make_chunk_probe_truncated
from sfengine_envs.image_bandit import make_image_bandit
from sfengine_envs.image_reach import make_image_reach
from sfengine_envs.libero_demonstrator import PickPlaceDemonstrator
from sfengine_envs.libero_suite import SUITE_STEP_LIMITS, LiberoOptions, make_libero_env, size_libero
from sfengine_envs.multitask_toy import make_multitask_toy
from sfengine_envs.sparse_reach import ReachDemonstrator, make_multitask_reach, make_sparse_reach
from sfengine_envs.synthetic import SyntheticOptions, make_synthetic

register_env("chunk_probe", make_chunk_probe)
register_env("chunk_probe_truncated", make_chunk_probe_truncated)
register_env("image_bandit", make_image_bandit)
register_env("image_reach", make_image_reach, demonstrator=ReachDemonstrator)
register_env("multitask_toy", make_multitask_toy)
register_env("sparse_reach", make_sparse_reach, demonstrator=ReachDemonstrator)
register_env("multitask_reach", make_multitask_reach, demonstrator=ReachDemonstrator)
register_env("synthetic", make_synthetic, options=SyntheticOptions)
for suite in SUITE_STEP_LIMITS:
    register_env(
        suite,
        partial(make_libero_env, suite),
        sizer=size_libero,
        options=LiberoOptions,
        demonstrator=PickPlaceDemonstrator,
    )
