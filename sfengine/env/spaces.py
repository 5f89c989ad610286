"""What the engine needs to know about an env's observation and action spaces, and nothing more.

Every observation is handled as a dict of named arrays: a plain Box becomes ``{"obs": array}``. Images are
``uint8`` arrays of shape H x W x C; everything else is a float32 vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

DEFAULT_OBS_KEY = "obs"


@dataclass(frozen=True)
class ObsSpec:
    """Shapes and dtypes of the observation keys (``image`` keys are uint8 H x W x C)."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]

    def is_image(self, key: str) -> bool:
        return self.dtypes[key] == torch.uint8 and len(self.shapes[key]) == 3


@dataclass(frozen=True)
class ActionSpec:
    """A Discrete action (``num_actions``) or a 1-D Box action (``low``/``high``, shape ``(dim,)``)."""

    discrete: bool
    num_actions: int = 0
    dim: int = 0  # with chunks: the whole chunk's, chunk x the env's action dim
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    chunk: int = 1  # env actions per policy output (--action_chunk), laid out one after the other

    @property
    def env_dim(self) -> int:
        """The env's own action dimension (one action of a chunk)."""
        return self.dim // self.chunk

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.discrete else (self.dim,)

    @property
    def dtype(self) -> torch.dtype:
        return torch.int64 if self.discrete else torch.float32


class UnsupportedSpaceError(ValueError):
    pass


def _box_spec(key: str, space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    if not isinstance(space, gym.spaces.Box):
        raise UnsupportedSpaceError(
            f"observation '{key}' is a {type(space).__name__}; sfengine supports Box and Dict-of-Box observations "
            "(wrap the env to convert it)"
        )
    if space.dtype == np.uint8 and len(space.shape) == 3:
        return tuple(space.shape), torch.uint8
    if len(space.shape) != 1:
        raise UnsupportedSpaceError(
            f"observation '{key}' has shape {space.shape}; use a flat vector or a uint8 H x W x C image"
        )
    return tuple(space.shape), torch.float32


def obs_spec_from_space(space: gym.Space) -> ObsSpec:
    items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else [(DEFAULT_OBS_KEY, space)]
    shapes, dtypes = {}, {}
    for key, sub in items:
        shapes[key], dtypes[key] = _box_spec(key, sub)
    return ObsSpec(shapes, dtypes)


def action_spec_from_space(space: gym.Space, chunk: int = 1) -> ActionSpec:
    """The policy's action: one env action, or with ``chunk`` > 1 (Box only) ``chunk`` of them side by side."""
    if isinstance(space, gym.spaces.Discrete):
        if chunk > 1:
            raise UnsupportedSpaceError(
                f"--action_chunk={chunk} needs a continuous (Box) action space; this env's is {space}: use "
                "--action_chunk=1"
            )
        return ActionSpec(discrete=True, num_actions=int(space.n))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return ActionSpec(
            discrete=False,
            dim=int(space.shape[0]) * chunk,
            low=tuple(float(x) for x in space.low) * chunk,
            high=tuple(float(x) for x in space.high) * chunk,
            chunk=chunk,
        )
    raise UnsupportedSpaceError(
        f"action space {space} is not supported; sfengine supports Discrete and 1-D Box actions"
    )


def obs_as_dict(obs) -> dict[str, np.ndarray]:
    return obs if isinstance(obs, dict) else {DEFAULT_OBS_KEY: obs}
