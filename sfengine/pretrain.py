"""``python -m sfengine.pretrain``: behavioural cloning of the engine's policy from demonstrations.

    python -m sfengine.pretrain --demos=train_dir/demos/libero_object_state.hdf5 --experiment=object_bc
    python -m sfengine.evaluate --experiment=object_bc
    python -m sfengine.train --env=libero_object --init_from=object_bc --experiment=object_rl --critic_warmup_batches=20

The run's configuration is a training run's (the same options and presets; ``--env`` and ``--libero_obs_mode``
default to the demonstrations'), and the model is the one ``sfengine.train`` builds for that env from the env's
spaces. The actor learns the demonstrated actions (``sfengine.learning.behavior_cloning``) on the episodes not held
out for validation; the observation statistics are the training demonstrations'; the value head stays as
initialised. ``train_dir/<experiment>/`` then holds what a training run leaves: ``config.json``, a checkpoint
(policy version 0, 0 env steps), ``tensorboard/`` (``pretrain/train_loss``, ``pretrain/validation_loss`` per
epoch) and ``summary.json``. The checkpoint keeps the weights of the epoch with the lowest validation loss
(``--keep_weights=best``; ``summary.json``'s ``kept_epoch``): a clone of a few demonstrations overfits long before
its last epoch. ``--pretrain_patience=N`` stops once N epochs passed without a better one.

Exit codes: 0 done (also after Ctrl-C or SIGTERM, which stop after the optimiser step under way and save the
checkpoint), 2 bad input (options, demonstrations that do not fit the env, an experiment that already has
checkpoints), reported on one line.
"""

from __future__ import annotations

import sys

from sfengine.config import check_command_line
from sfengine.learning.pretrain_options import PretrainOptions, pretrain_parser

if __name__ == "__main__":
    # --help and a misspelt option are answered from the option names, before the engine and torch are imported.
    check_command_line(sys.argv[1:], "sfengine.pretrain", pretrain_parser())

import argparse
import copy
import math
import time
from typing import Any

import torch

from sfengine.config import Config, ConfigError, command_options, load_preset, parse_config
from sfengine.demos.dataset import DemoSet
from sfengine.demos.fit import IMAGE_SIZE_OPTION, OBS_MODE_OPTION, check_demos_fit, owns_obs_mode, read_demo_files
from sfengine.engine.checkpoint import CheckpointError, list_checkpoints, save_checkpoint
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.distributed import RankInfo, rank_device
from sfengine.engine.event_loop import start_command
from sfengine.engine.lifecycle import StopSignals
from sfengine.env.registry import resolve_env_factory
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.behavior_cloning import (
    demo_samples,
    fit_action_std,
    split_by_episode,
    train_epoch,
    validation_loss,
)
from sfengine.learning.trainer import adam
from sfengine.reporting.progress import format_duration
from sfengine.reporting.reporter import write_summary
from sfengine.reporting.writer import TensorBoardWriter
from sfengine.train import build_model, prepare_experiment_dir, probe_env

LOSS_NAMES = {"gaussian": "negative log-likelihood", "flow": "flow-matching error"}


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The options that ``argv`` sets, on its command line or in its ``--cfg`` preset (``--help`` exits here)."""
    try:
        namespace = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            raise
        raise ConfigError("invalid command line; see the message above and --help") from None
    preset = load_preset(namespace.cfg) if namespace.cfg else {}
    return {**preset, **{name: value for name, value in vars(namespace).items() if name != "cfg"}}


def demo_defaults(given: dict[str, Any], demo_set: DemoSet) -> list[str]:
    """What the demonstrations say where the user said nothing: the env, its observation mode and image size. A flow head
    goes with --algo=flow_sar, the algorithm that fine-tunes it, so the checkpoint's config.json builds the same
    critic-free model in sfengine.evaluate and sfengine.train."""
    defaults = {"env": demo_set.env}
    env = given.get("env", demo_set.env)
    if owns_obs_mode(env):
        defaults[OBS_MODE_OPTION] = demo_set.obs_mode
        images = [obs for obs in demo_set.demos[0].obs.values() if obs.ndim == 4] if demo_set.demos else []
        if images:  # the cameras' size too
            defaults["libero_image_size"] = images[0].shape[1]
    if given.get("policy_head") == "flow":
        defaults.update(algo="flow_sar", group_outcome="success")
    return [f"--{name}={value}" for name, value in defaults.items() if name not in given]


class ProgressLine:
    """A progress bar on stderr: redrawn in place on a terminal; elsewhere (a log file) one line per epoch."""

    WIDTH = 24

    def __init__(self, epochs: int, steps_per_epoch: int):
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.live = sys.stderr.isatty()
        self.drawn = 0.0
        self.epoch = 1  # the epoch under way

    def step(self, done: int, loss: float) -> None:
        if not self.live or time.monotonic() - self.drawn < 0.2:
            return
        self.drawn = time.monotonic()
        filled = self.WIDTH * done // self.steps_per_epoch
        bar = "#" * filled + "." * (self.WIDTH - filled)
        sys.stderr.write(f"\repoch {self.epoch}/{self.epochs} [{bar}] {done}/{self.steps_per_epoch} loss {loss:.4f}")
        sys.stderr.flush()

    def epoch_done(self, epoch: int, train_loss: float, val_loss: float | None, started: float) -> None:
        elapsed = time.time() - started
        eta = elapsed / epoch * (self.epochs - epoch)
        validation = f", validation {val_loss:.4f}" if val_loss is not None else ""
        line = f"epoch {epoch}/{self.epochs}: train loss {train_loss:.4f}{validation} ({format_duration(eta)} to go)"
        sys.stderr.write(("\r\033[K" if self.live else "") + line + "\n")
        sys.stderr.flush()


def pretrain(
    cfg: Config, options: PretrainOptions, demo_set: DemoSet, obs_spec: ObsSpec, action_spec: ActionSpec
) -> dict:
    """Clone the demonstrations into the run's model; write the checkpoint, TensorBoard and summary.json."""
    device = rank_device(cfg.learner.device)
    set_cpu_threads(cfg.learner.learner_threads)
    samples = demo_samples(demo_set.demos, cfg.model.action_chunk)
    train_episodes, held_out = split_by_episode(len(demo_set.demos), options.validation_fraction, cfg.env.seed)
    train, validation = samples.of_episodes(train_episodes), samples.of_episodes(held_out)
    model = build_model(cfg, obs_spec, action_spec, None)
    model.update_normalizers(
        train.obs, initial=True
    )  # the running statistics the engine's model carries: the demonstrations'
    model.to(device)
    train, validation = train.to(device), validation.to(device)
    optimizer = adam(model.parameters(), options.pretrain_learning_rate, cfg)
    generator = torch.Generator(device=device).manual_seed(cfg.env.seed)
    batch_size, epochs = options.pretrain_batch_size, options.pretrain_epochs
    head = cfg.model.policy_head
    print(
        f"sfengine.pretrain: behavioural cloning of a {head} policy on {cfg.env.env} ({LOSS_NAMES[head]})\n"
        f"  demonstrations: {len(train_episodes)} episodes ({len(train)} samples) to train on, {len(held_out)} "
        f"({len(validation)} samples) held out; chunks of {cfg.model.action_chunk}\n"
        f"  {epochs} epochs of batches of {batch_size}, learning rate {options.pretrain_learning_rate:g}, on {device}\n"
        f"  files:  {cfg.experiment_dir} (config.json, checkpoints/, tensorboard/, summary.json)",
        flush=True,
    )

    def validate() -> float | None:
        return validation_loss(model, validation, batch_size, cfg.env.seed) if len(validation) else None

    writer = TensorBoardWriter(str(cfg.experiment_dir / "tensorboard"), flush_secs=10)
    started = time.time()
    losses: dict[str, list[float | None]] = {"train": [], "validation": [validate()]}
    if losses["validation"][0] is not None:
        writer.add_scalar("pretrain/validation_loss", losses["validation"][0], 0)
    progress = ProgressLine(epochs, -(-len(train) // batch_size))
    stop_reason = f"trained for {epochs} epochs"
    best = BestEpoch()

    def after_step(done: int, loss: float) -> None:
        progress.step(done, loss)
        stop.raise_if_requested()  # after a whole optimiser step, so the checkpoint below is a consistent one

    try:
        with StopSignals() as stop:
            for epoch in range(1, epochs + 1):
                progress.epoch = epoch
                train_loss = train_epoch(model, optimizer, train, batch_size, generator, after_step)
                val_loss = validate()
                losses["train"].append(train_loss)
                losses["validation"].append(val_loss)
                writer.add_scalar("pretrain/train_loss", train_loss, epoch)
                if val_loss is not None:
                    writer.add_scalar("pretrain/validation_loss", val_loss, epoch)
                progress.epoch_done(epoch, train_loss, val_loss, started)
                if val_loss is not None and best.offer(epoch, val_loss, model, optimizer):
                    writer.add_scalar("pretrain/best_epoch", epoch, epoch)
                if options.pretrain_patience and epoch - best.epoch >= options.pretrain_patience:
                    stop_reason = (
                        f"stopped after {epoch} epochs: no better validation loss in the last "
                        f"{options.pretrain_patience} (--pretrain_patience)"
                    )
                    break
    except StopSignals.Interrupted as exc:
        # The steps of the unfinished epoch stay in the weights; the losses list whole epochs only.
        stop_reason = f"interrupted by {exc} after {len(losses['train'])} epochs"
        print(f"\nsfengine.pretrain: {stop_reason}: saving a checkpoint", file=sys.stderr, flush=True)
    last_epoch = len(losses["train"])
    if options.keep_weights == "best" and best.epoch and best.epoch != last_epoch:
        best.restore(model, optimizer)  # the epoch that generalised best, not the last, most overfit one
    kept_epoch = best.epoch if options.keep_weights == "best" and best.epoch else last_epoch
    print(
        f"sfengine.pretrain: the checkpoint keeps the weights of epoch {kept_epoch} of {last_epoch}"
        + (
            f" (validation loss {losses['validation'][kept_epoch]:.4f})"
            if losses["validation"][kept_epoch] is not None
            else ""
        ),
        flush=True,
    )
    action_std = fit_action_std(model, train, batch_size)
    fitted_loss = validate() if action_std is not None else None  # the loss of the checkpoint's std
    if fitted_loss is not None:
        writer.add_scalar("pretrain/validation_loss_fitted_std", fitted_loss, len(losses["train"]))
    writer.close()
    path = save_checkpoint(
        cfg.experiment_dir, checkpoint_state(model, optimizer, cfg, options), cfg.run.keep_checkpoints
    )
    summary = {
        "demos": cfg.learner.demos,
        "env": cfg.env.env,
        "policy_head": head,
        "action_chunk": cfg.model.action_chunk,
        "train_episodes": len(train_episodes),
        "validation_episodes": len(held_out),
        "train_samples": len(train),
        "validation_samples": len(validation),
        "epochs": len(losses["train"]),
        "kept_epoch": kept_epoch,  # whose weights the checkpoint holds (--keep_weights)
        "keep_weights": options.keep_weights,
        "loss": LOSS_NAMES[head],
        "train_loss": losses["train"],
        "validation_loss": losses["validation"],  # entry 0: before training
        "action_std": None if action_std is None else [round(float(x), 4) for x in action_std],
        "validation_loss_fitted_std": fitted_loss,
        "wall_seconds": round(time.time() - started, 2),
        "checkpoint": str(path),
        "stop_reason": stop_reason,
        "exit_code": 0,
    }
    write_summary(cfg.experiment_dir / "summary.json", summary)
    return summary


class BestEpoch:
    """The weights (and optimiser state) of the epoch with the lowest validation loss so far, on the CPU."""

    def __init__(self):
        self.epoch, self.loss = 0, math.inf
        self.model_state: dict | None = None
        self.optimizer_state: dict | None = None

    def offer(self, epoch: int, loss: float, model, optimizer: torch.optim.Optimizer) -> bool:
        """Keep this epoch's weights if its validation loss is the lowest yet; whether it was."""
        if not loss < self.loss:
            return False
        self.epoch, self.loss = epoch, loss
        self.model_state = {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
        self.optimizer_state = copy.deepcopy(optimizer.state_dict())
        return True

    def restore(self, model, optimizer: torch.optim.Optimizer) -> None:
        model.load_state_dict(self.model_state)
        optimizer.load_state_dict(self.optimizer_state)


def checkpoint_state(model, optimizer: torch.optim.Optimizer, cfg: Config, options: PretrainOptions) -> dict:
    """A training run's checkpoint at its start (policy version 0, 0 env steps, no task sequence), so that
    sfengine.evaluate and sfengine.train --init_from read it as they read any other."""
    return {
        "model": {name: t.detach().cpu() for name, t in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "env_steps": 0,
        "policy_version": 0,
        "task_sequence": {"ranks": []},
        "pretrain": {"demos": cfg.learner.demos, "epochs": options.pretrain_epochs},
    }


def main(argv: list[str] | None = None) -> int:
    start_command()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = pretrain_parser()
        options, rest = command_options(PretrainOptions, argv)
        given = given_options(parser, rest)
        if not given.get("demos"):
            raise ConfigError("give the demonstrations: --demos=FILE[,FILE...] (written by python -m sfengine.demos)")
        image_size = given.get(IMAGE_SIZE_OPTION)
        demo_set = read_demo_files(
            given["demos"],
            given.get("env"),
            given.get(OBS_MODE_OPTION),
            None if image_size is None else int(image_size),
        )
        cfg = parse_config([*demo_defaults(given, demo_set), *rest], parser)
        obs_spec, action_spec, _ = probe_env(cfg, resolve_env_factory(cfg.env.env))
        check_demos_fit(demo_set, cfg, obs_spec, action_spec)
        split_by_episode(len(demo_set.demos), options.validation_fraction, cfg.env.seed)  # a bad split fails here
        if cfg.run.restart_behavior == "resume" and list_checkpoints(cfg.experiment_dir):
            raise ConfigError(
                f"experiment '{cfg.run.experiment}' already has checkpoints: choose another --experiment, or "
                "--restart_behavior=restart (moves it aside) or overwrite"
            )
        prepare_experiment_dir(cfg, RankInfo())
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"sfengine.pretrain: error: {exc}", file=sys.stderr)
        return 2
    summary = pretrain(cfg, options, demo_set, obs_spec, action_spec)
    first, last = summary["validation_loss"][0], summary["validation_loss"][-1]
    change = f"validation loss {first:.4f} -> {last:.4f}" if last is not None else "no validation split"
    kept, epochs = summary["kept_epoch"], len(summary["validation_loss"]) - 1
    if last is not None and kept != epochs:  # the checkpoint holds another epoch's weights than the last
        change += f" (the last epoch's); {summary['validation_loss'][kept]:.4f} at epoch {kept}, the one kept"
    print(
        f"done: {summary['stop_reason']} in {summary['wall_seconds']:.1f} s; {change}; {summary['checkpoint']}\n"
        f"  evaluate: python -m sfengine.evaluate --train_dir={cfg.run.train_dir} --experiment={cfg.run.experiment}\n"
        f"  fine-tune: python -m sfengine.train --train_dir={cfg.run.train_dir} --init_from={cfg.run.experiment} "
        "--experiment=<new name>",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
