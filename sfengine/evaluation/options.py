"""``sfengine.evaluate``'s own options and its command line, apart from the command so that reading them imports no
torch: ``python -m sfengine.evaluate`` answers ``--help`` and a misspelt option from them before it imports the
engine."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sfengine.config import ConfigError, add_command_options, build_parser, option

DESCRIPTION = "``python -m sfengine.evaluate``: how good is this checkpoint?"
EVALUATE_HELP = (
    "Evaluates a checkpoint (--checkpoint, or the latest of --experiment) with the options of the 'evaluate' and "
    "'eval' groups; the run's saved config supplies the rest, and any option given here overrides it."
)


@dataclass
class EvaluateOptions:
    """sfengine.evaluate's own options (the ``evaluate`` group of its ``--help``); the ``eval`` group's, which the
    training evaluator shares, and every other option come through the run's saved config."""

    group = "evaluate"

    checkpoint: str = option("", "the checkpoint file to evaluate (default: the experiment's latest)")
    episodes_per_init: int = option(1, "multi-task envs: episodes of each (task, init state)")
    eval_tasks: list[int] = option([], "multi-task envs: evaluate only these task indices (default: every task)")
    eval_init_states: int = option(0, "multi-task envs: evaluate only each task's first N init states (0: all)")
    video_per_task: int = option(0, "record this many episodes of each task as mp4")
    video_size: int = option(256, "width and height of recorded videos in pixels (even)")
    compare_to: str = option(
        "",
        "another evaluation of the same pairs to test this one against (McNemar's paired test): an experiment "
        "(its latest complete evaluation with the same kind of actions), or a results.json or its folder",
    )

    resume: bool = option(
        False,
        "continue an evaluation of this checkpoint that was cut short (Ctrl-C, a time limit, a failed worker): "
        "play only the episodes its results.json lacks, then write the merged results",
    )

    def validate(self) -> None:
        if self.episodes_per_init < 1:
            raise ConfigError(f"--episodes_per_init={self.episodes_per_init} must be at least 1")
        if any(task < 0 for task in self.eval_tasks):
            raise ConfigError(f"--eval_tasks={self.eval_tasks}: task indices start at 0")
        for name in ("video_per_task", "eval_init_states"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name}={getattr(self, name)} must not be negative")
        if self.video_size < 16 or self.video_size % 2:
            raise ConfigError(f"--video_size={self.video_size}: give an even number of pixels, at least 16 (e.g. 256)")


def evaluate_parser() -> argparse.ArgumentParser:
    """The command line of ``sfengine.evaluate``: every option of a training run, and the ``evaluate`` group."""
    parser = build_parser("python -m sfengine.evaluate", f"{DESCRIPTION} {EVALUATE_HELP}")
    add_command_options(parser, EvaluateOptions)
    return parser
