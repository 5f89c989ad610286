"""``sfengine.demos``' own options and its command line, apart from the recording so that reading them imports no
torch: ``python -m sfengine.demos`` answers ``--help`` and a misspelt option from them before it imports the
engine."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from sfengine.config import ConfigError, add_command_options, build_parser, option

DEMOS_HELP = (
    "Records the successful episodes of the env's scripted demonstrator as an HDF5 dataset (LIBERO's layout) for "
    "sfengine.pretrain. Env options (--libero_obs_mode, ...) and --num_workers apply as in sfengine.train."
)


@dataclass
class DemosOptions:
    group: ClassVar[str] = "demos"
    demos_per_task: int = option(10, "successful demonstrations to record per task (per env if it has no tasks)")
    demos_output: str = option("", "HDF5 file to write (default: <train_dir>/demos/<env>_<obs mode>.hdf5)")
    demo_attempts_per_task: int = option(
        0, "episodes a task may try (0: each of its init states once; single-task envs: 4x --demos_per_task)"
    )
    demo_action_noise: float = option(
        0.0, "std of Gaussian noise added to every demonstrator action (executed and recorded), clipped to [-1, 1]"
    )
    demo_tasks: str = option("", "comma-separated task ids to record (default: all)")

    def validate(self) -> None:
        if self.demos_per_task < 1:
            raise ConfigError(f"--demos_per_task={self.demos_per_task} must be at least 1")
        if self.demo_attempts_per_task < 0:
            raise ConfigError(f"--demo_attempts_per_task={self.demo_attempts_per_task} must be 0 (auto) or more")
        if self.demo_action_noise < 0:
            raise ConfigError(f"--demo_action_noise={self.demo_action_noise} must be 0 or more")


def demos_parser() -> argparse.ArgumentParser:
    """The command line of ``sfengine.demos``: the options of a training run (the env's among them), and the
    ``demos`` group."""
    parser = build_parser("python -m sfengine.demos", DEMOS_HELP)
    add_command_options(parser, DemosOptions)
    return parser
