"""sfengine's built-in environments, installed as the package ``sfengine_envs``.

Importing this package registers every built-in env with ``sfengine.register_env``. Plain gymnasium ids need no
registration: ``--env=CartPole-v1`` works as it is.

- ``image_bandit``: a dict observation (16x16 uint8 image + vector) whose answer is only in the image.
"""

from sfengine.env_registry import register_env
from sfengine_envs.image_bandit import make_image_bandit

register_env("image_bandit", make_image_bandit)
