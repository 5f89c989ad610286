"""``sfengine.pretrain``'s own options and its command line, apart from the command so that reading them imports
no torch: ``python -m sfengine.pretrain`` answers ``--help`` and a misspelt option from them before it imports the
engine."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from sfengine.config import ConfigError, add_command_options, build_parser, option

DESCRIPTION = "``python -m sfengine.pretrain``: behavioural cloning of the engine's policy from demonstrations."


@dataclass
class PretrainOptions:
    """sfengine.pretrain's own options (its group in --help)."""

    group: ClassVar[str] = "pretrain"
    pretrain_epochs: int = option(50, "passes over the training demonstrations")
    pretrain_batch_size: int = option(256, "samples (steps) per optimiser step")
    pretrain_learning_rate: float = option(3e-4, "Adam learning rate")
    validation_fraction: float = option(
        0.1, "share of the demonstrations (whole episodes) held out for the validation loss; 0: none"
    )
    keep_weights: str = option(
        "best",
        "the weights the checkpoint keeps: best (those of the epoch with the lowest validation loss: a clone of a "
        "few demonstrations overfits long before the last epoch; the last without a validation set) or last",
        ("best", "last"),
    )
    pretrain_patience: int = option(
        0, "stop once the validation loss has not improved for this many epochs (0: run every epoch)"
    )

    def validate(self) -> None:
        if self.pretrain_epochs < 1 or self.pretrain_batch_size < 1:
            raise ConfigError("--pretrain_epochs and --pretrain_batch_size must be at least 1")
        if self.pretrain_learning_rate <= 0:
            raise ConfigError(f"--pretrain_learning_rate={self.pretrain_learning_rate} must be positive")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"--validation_fraction={self.validation_fraction} must lie in [0, 1)")
        if self.pretrain_patience < 0:
            raise ConfigError(f"--pretrain_patience={self.pretrain_patience} must not be negative")
        if self.validation_fraction == 0 and self.pretrain_patience:
            raise ConfigError(
                "--pretrain_patience stops on the validation loss, and --validation_fraction=0 leaves none: drop "
                "one of them"
            )


def pretrain_parser() -> argparse.ArgumentParser:
    """The command line of ``sfengine.pretrain``: the options of a training run, and the ``pretrain`` group."""
    parser = build_parser("python -m sfengine.pretrain", DESCRIPTION)
    add_command_options(parser, PretrainOptions)
    return parser
