"""sfengine's built-in environments, installed as the package ``sfengine_envs``.

Importing this package registers every built-in env with ``sfengine.register_env``. Plain gymnasium ids need no
registration: ``--env=CartPole-v1`` works as it is.
"""
