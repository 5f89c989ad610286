"""The engine's rules across options: each raises a one-line ``ConfigError`` that names the fix. An env's and an
algorithm's own rules live beside them (their ``validate``)."""

from __future__ import annotations

import dataclasses
import math
import os

from sfengine.config.core import Config, auto_options
from sfengine.config.options import ConfigError

# Workers report every second: with a shorter timeout (0.5 s), healthy workers were named hung and respawned until
# the run stopped.
MIN_HANG_TIMEOUT_SEC = 1.0


def validate(cfg: Config) -> None:
    """Reject inconsistent or impossible settings with a one-line message naming the fix. Options still at
    ``auto`` are checked once ``sfengine.engine.sizing`` has chosen them."""
    auto = set(auto_options(cfg))
    for group in cfg.groups_in_use().values():
        for f in dataclasses.fields(group):
            value = getattr(group, f.name)
            if f.metadata["choices"] and value not in f.metadata["choices"]:
                raise ConfigError(f"--{f.name}={value!r} is not one of {', '.join(f.metadata['choices'])}")
    env_options = cfg.own_env_options
    if hasattr(env_options, "validate"):
        env_options.validate(auto)
    s, lrn, run = cfg.sampler, cfg.learner, cfg.run
    for name in ("num_workers", "num_envs_per_worker", "worker_num_splits", "rollout"):
        if name not in auto and getattr(s, name) < 1:
            raise ConfigError(f"--{name}={getattr(s, name)} must be at least 1")
    if "num_inference_workers" not in auto and s.num_inference_workers < 0:
        raise ConfigError(
            f"--num_inference_workers={s.num_inference_workers} is negative; use 0 for rollout workers that act "
            "themselves, or 1 or more inference processes"
        )
    for name in ("task_group_size", "curriculum_window"):
        if getattr(cfg.env, name) < 1:
            raise ConfigError(f"--{name}={getattr(cfg.env, name)} must be at least 1")
    for name in ("batch_size", "num_batches_per_epoch", "num_epochs", "learner_threads"):
        if getattr(lrn, name) < 1:
            raise ConfigError(f"--{name}={getattr(lrn, name)} must be at least 1")
    if auto & {"num_workers", "num_envs_per_worker", "num_inference_workers"}:
        pass  # the checks on the worker layout wait until it is chosen
    elif s.num_envs_per_worker % s.worker_num_splits != 0:
        raise ConfigError(
            f"--num_envs_per_worker={s.num_envs_per_worker} is not divisible by --worker_num_splits="
            f"{s.worker_num_splits}; use a multiple of it"
        )
    elif s.num_inference_workers > s.num_workers:
        raise ConfigError(
            f"--num_inference_workers={s.num_inference_workers} exceeds --num_workers={s.num_workers}; "
            "an inference worker serves at least one rollout worker"
        )
    elif not s.async_rl and cfg.samples_per_training_batch % (s.num_workers * s.num_envs_per_worker * s.rollout):
        raise ConfigError(
            f"--async_rl=False needs batch_size x num_batches_per_epoch ({cfg.samples_per_training_batch}) to be "
            f"a multiple of num_workers x num_envs_per_worker x rollout "
            f"({s.num_workers * s.num_envs_per_worker * s.rollout}), so each update uses every env equally"
        )
    if cfg.samples_per_training_batch % s.rollout != 0:
        raise ConfigError(
            f"--batch_size x --num_batches_per_epoch = {cfg.samples_per_training_batch} is not a multiple of "
            f"--rollout={s.rollout}; a training batch is made of whole trajectories"
        )
    if s.serial_mode and s.num_inference_workers != 1:
        raise ConfigError("--serial_mode runs one inference component; leave --num_inference_workers at 1")
    for name in ("learning_rate", "gamma"):
        if getattr(lrn, name) <= 0:
            raise ConfigError(f"--{name}={getattr(lrn, name)} must be positive")
    if not 0 < lrn.gamma <= 1 or not 0 <= lrn.gae_lambda <= 1:
        raise ConfigError("--gamma must be in (0, 1] and --gae_lambda in [0, 1]")
    for name in (
        "max_grad_norm",
        "reward_clip",
        "entropy_coeff",
    ):
        if getattr(lrn, name) < 0:
            raise ConfigError(f"--{name}={getattr(lrn, name)} must not be negative")
    model = cfg.model
    if model.flow_steps < 1 or not model.flow_hidden_sizes or min(model.flow_hidden_sizes) < 1:
        raise ConfigError("--flow_steps must be at least 1 and --flow_hidden_sizes positive widths (e.g. 128,128)")
    from sfengine.algorithms import algorithm_for

    algorithm = algorithm_for(cfg)  # an unregistered --algo is an error here
    if algorithm.validate is not None:
        algorithm.validate(cfg)
    if cfg.model.action_chunk < 1:
        raise ConfigError(f"--action_chunk={cfg.model.action_chunk} must be at least 1 (1: one action per request)")
    if any(width < 1 for width in cfg.model.hidden_sizes) or not cfg.model.hidden_sizes:
        raise ConfigError(f"--hidden_sizes={cfg.model.hidden_sizes}: give positive layer widths, e.g. 64,64")
    if run.train_for_env_steps < 1:
        raise ConfigError(f"--train_for_env_steps={run.train_for_env_steps} must be at least 1")
    for name in (
        "train_for_seconds",
        "save_every_sec",
        "report_every_sec",
        "hang_timeout_sec",
        "startup_timeout_sec",
        "max_respawns",
        "respawn_window_sec",
    ):
        if getattr(run, name) < 0:
            raise ConfigError(f"--{name}={getattr(run, name)} must not be negative")
    if 0 < run.hang_timeout_sec < MIN_HANG_TIMEOUT_SEC:
        raise ConfigError(
            f"--hang_timeout_sec={run.hang_timeout_sec:g} is within the workers' own pace (they report every second): "
            f"healthy ones would be named hung; give 0 (off) or at least {MIN_HANG_TIMEOUT_SEC:g}"
        )
    if cfg.env.max_episode_steps < 0:
        raise ConfigError(f"--max_episode_steps={cfg.env.max_episode_steps} must not be negative (0: the env's own)")
    if cfg.debug.chaos_kill_every_sec < 0:
        raise ConfigError(f"--chaos_kill_every_sec={cfg.debug.chaos_kill_every_sec} must not be negative")
    if cfg.debug.chaos_kill_every_sec and not run.max_respawns:
        raise ConfigError(
            "--chaos_kill_every_sec kills workers for the run to respawn, and --max_respawns=0 turns respawning off: "
            "give --max_respawns of 1 or more (chaos kills do not count against it)"
        )
    if run.stop_at_success != math.inf and not 0 < run.stop_at_success <= 1:
        raise ConfigError(f"--stop_at_success={run.stop_at_success} is a success rate: give one in (0, 1], e.g. 0.8")
    if run.keep_checkpoints < 1 or run.stats_window < 1:
        raise ConfigError("--keep_checkpoints and --stats_window must be at least 1")
    if not run.experiment or os.sep in run.experiment or run.experiment in (".", ".."):
        raise ConfigError(f"--experiment={run.experiment!r} must be a plain directory name")
    ev = cfg.eval
    if ev.eval_episodes < 1:
        raise ConfigError(f"--eval_episodes={ev.eval_episodes} must be at least 1")
    for name in ("eval_every_env_steps", "eval_episodes_per_task"):
        if getattr(ev, name) < 0:
            raise ConfigError(f"--{name}={getattr(ev, name)} must not be negative")
    if lrn.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device=cuda but torch sees no CUDA device; use --device=cpu")


def check_group_layout(cfg: Config) -> None:
    """Group batches (critic-free advantages, FlowSAR): a training batch holds whole groups, so one group of
    episodes at their step limit (``--max_episode_steps``, filled in from the env when 0) must fit in it. Checked
    once the env is known."""
    from sfengine.algorithms import algorithm_for

    algorithm = algorithm_for(cfg)
    if not algorithm.grouped(cfg):
        return
    size, samples = cfg.env.task_group_size, cfg.samples_per_training_batch
    limit = -(-cfg.env.max_episode_steps // cfg.model.action_chunk)  # entries: one per chunk
    advantage = algorithm.summary(cfg)
    if limit < 1:
        raise ConfigError(
            f"{advantage} batches whole groups of episodes, and --env={cfg.env.env} declares no step limit: set "
            "--max_episode_steps"
        )
    if size * limit > samples:
        needed = -(-size * limit // cfg.learner.batch_size)
        raise ConfigError(
            f"{advantage}: a group of --task_group_size={size} episodes of up to {limit} steps ({size * limit} "
            f"samples) does not fit a training batch of --batch_size x --num_batches_per_epoch = {samples}: use "
            f"--num_batches_per_epoch={needed} or more, or a smaller --task_group_size or --max_episode_steps"
        )
