"""The demonstrations of a run (``--demos``): read as the run's env and observation mode, and checked against the
env's spaces before anything starts. ``sfengine.pretrain`` clones them; the off-policy algorithms (``--algo=sac``,
``--algo=td3``) keep them in their replay beside the online data."""

from __future__ import annotations

import numpy as np

from sfengine.config import GROUP_OWNERS, Config, ConfigError, option_table
from sfengine.demos.dataset import DemoSet, read_demos
from sfengine.env.spaces import ActionSpec, ObsSpec

OBS_MODE_OPTION = "libero_obs_mode"  # the env option a demonstration file's obs_mode sets
IMAGE_SIZE_OPTION = "libero_image_size"  # LIBERO's published files are replayed at this size in rgb mode


def owns_obs_mode(env: str) -> bool:
    """Whether ``env`` takes --libero_obs_mode (the LIBERO suites)."""
    return GROUP_OWNERS["env"].get(env) == option_table()[OBS_MODE_OPTION].group


def read_demo_files(paths: str, env: str | None, obs_mode: str | None, image_size: int | None = None) -> DemoSet:
    """The DemoSet of ``--demos`` (several files, comma-separated, are read as one set). ``env`` and ``obs_mode``,
    where given, must be the files'; LIBERO's published files are replayed in ``obs_mode`` (default: state)."""
    files = [path for path in paths.split(",") if path]
    if image_size is None:
        image_size = int(option_table()[IMAGE_SIZE_OPTION].default)
    try:
        demo_set = read_demos(files, env=env, obs_mode=obs_mode, image_size=image_size)
    except (OSError, ValueError) as exc:  # DemoFileError is a ValueError
        raise ConfigError(f"--demos: {exc}") from None
    check_finite(demo_set)
    return demo_set


def check_finite(demo_set: DemoSet) -> None:
    """No NaN or infinity in any demonstration's actions, rewards or float observations: one of them would turn
    every weight of a clone (or a critic) into NaN."""
    for index, demo in enumerate(demo_set.demos):
        named = [("actions", demo.actions), ("rewards", demo.rewards)]
        named += [(f"observation '{key}'", values) for key, values in demo.obs.items()]
        for what, values in named:
            values = np.asarray(values)
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                step = int(np.argwhere(~np.isfinite(values))[0][0])
                raise ConfigError(
                    f"--demos: demonstration {index} has a NaN or infinite value in its {what} at step {step}: fix "
                    "it or drop that demonstration"
                )


def read_run_demos(cfg: Config) -> DemoSet:
    """``--demos`` read as this run's env and observation mode."""
    libero = owns_obs_mode(cfg.env.env)
    return read_demo_files(
        cfg.learner.demos,
        cfg.env.env,
        cfg.get(OBS_MODE_OPTION) if libero else None,
        int(cfg.get(IMAGE_SIZE_OPTION)) if libero else None,
    )


def check_demos_fit(demo_set: DemoSet, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> None:
    """The demonstrations must have this env's observations and actions (``read_demos`` checked the env's name
    and observation mode)."""
    if not demo_set.demos:
        raise ConfigError("--demos: the demonstration files hold no episodes")
    if action_spec.discrete:
        raise ConfigError(f"env '{cfg.env.env}' has discrete actions; learning from --demos here needs a Box action")
    for index, demo in enumerate(demo_set.demos):
        where = f"--demos: demonstration {index} (task {demo.task}, init state {demo.init_state})"
        if set(demo.obs) != set(obs_spec.shapes):
            raise ConfigError(
                f"{where} has observations {sorted(demo.obs)}, env '{cfg.env.env}' {sorted(obs_spec.shapes)}"
            )
        for key, shape in obs_spec.shapes.items():
            if tuple(demo.obs[key].shape[1:]) != shape or len(demo.obs[key]) != len(demo.actions):
                raise ConfigError(
                    f"{where}: observation '{key}' is {tuple(demo.obs[key].shape)}, expected {len(demo.actions)} "
                    f"steps of {shape}"
                )
        if len(demo.actions) == 0 or demo.actions.ndim != 2 or demo.actions.shape[1] != action_spec.env_dim:
            raise ConfigError(
                f"{where}: actions are {tuple(demo.actions.shape)}, expected steps of {action_spec.env_dim} values"
            )
