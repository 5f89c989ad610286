"""Algorithms as registered units: the engine asks ``algorithm_for(cfg)`` what it needs to know of the run's
algorithm, and never branches on its name.

    from sfengine import Algorithm, register_algorithm
    register_algorithm("a2c", Algorithm(trainer=A2CTrainer, options=A2COptions, title="A2C"))
    # python my_train.py --algo=a2c --a2c_value_coeff=0.5 ...

A spec (``Algorithm``) declares what the engine needs and nothing more:

    trainer        (model, cfg, group) -> a Trainer (sfengine.learning.trainer): one update per training batch;
                   its state_dict() is kept in checkpoints under the algorithm's name. The built-in algorithms
                   give ``imported_on_call("module:Class")``: imported when a run builds its learner, so that
                   reading the options (--help) imports no torch
    options        a dataclass of option() fields (its ``group`` attribute names its --help group): flat on the
                   command line, saved in config.json, taken only with --algo=<name>; cfg.algorithm_options
    validate(cfg)  the algorithm's own rules: raise ConfigError with a one-line fix
    critic(cfg)    whether the model has a value head (PPO with GAE or V-trace: yes; RLOO, FlowSAR: no)
    batch(cfg)     what a training batch is: TRAJECTORIES (every env's rollouts of --rollout steps with their
                   bootstrap entry: TrajectoryBuffers, filled by the Batcher) or GROUPS (whole episodes of one
                   (task, init state), --task_group_size of them, with their outcomes: GroupBatch)
    annotate       the acting side's hook (FlowSAR's self-annotation): (cfg, reference, obs, actions) -> the
                   annotation fields of each step, computed with the trainer's ``reference`` policy, which is
                   published beside the policy; None for an algorithm that annotates nothing
    final_obs      whether a batch keeps each truncated episode's last observation at its step (``final_obs`` of
                   TrajectoryBuffers): what a Q-learning target bootstraps from at a time limit (SAC: yes)
    demos          whether it learns from --demos (SAC and TD3: in the replay); a run of another algorithm refuses them
    model(cfg, obs_spec, action_spec)   the policy it acts with when --model is the default (SAC's squashed
                   Gaussian); None: the engine's ActorCritic
    defaults(cfg, given)   the defaults it chooses from the run's other settings: it sets options that no layer
                   (preset, saved config, command line) gave; ``given`` names those that were given (PPO: the
                   --target_kl of its --clip_mode)
    numpy_learner(cfg)  whether the numpy learner (sfengine.numpy_backend.step, PPO's step restated) may take
                   its steps in this run: None if so, else why not; leave it None for an algorithm it cannot run
    title, describe(cfg)   how the start block names the algorithm and its settings
    check(cfg, obs_spec, action_spec)   its rules on the env's spaces, once they are known and before anything
                   starts (SAC: vector observations, a replay that fits in memory): raise ConfigError
    check_resume(cfg, model, state)   whether the trainer's part of a checkpoint (its ``state_dict()``) fits this
                   run's settings, tried before a resumed run starts (SAC, TD3: the critics' shapes): raise the
                   RuntimeError of ``load_state_dict``; None: nothing to check beyond the policy
    status(cfg, stats)     its words on the status line from its last update's statistics (PPO: the clip mode's
                   KL, clipped share, ratio range), or None; every statistic goes to TensorBoard in any case
    layout(cfg, env_step_sec)   the sampler layout it takes for an env whose random step was timed at start, where
                   no layer gives one (sizing.SAMPLER_LAYOUT), and what goes with it: it sets the options and
                   returns the start line that says so, or None to keep the engine's (SAC and TD3 on a cheap env:
                   few envs in step with the learner, critics without LayerNorm); one rank only
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sfengine.config import Config, ConfigError, declare_options

TRAJECTORIES = "trajectories"
GROUPS = "groups"


@dataclass(frozen=True)
class Algorithm:
    trainer: Callable[..., Any]
    options: type | None = None
    validate: Callable[[Config], None] | None = None
    critic: bool | Callable[[Config], bool] = True
    batch: str | Callable[[Config], str] = TRAJECTORIES
    annotate: Callable[..., Any] | None = None
    final_obs: bool = False
    demos: bool = False
    model: Callable[..., Any] | None = None
    defaults: Callable[[Config, set[str]], None] | None = None
    numpy_learner: Callable[[Config], str | None] | None = None
    title: str = ""
    describe: Callable[[Config], str] | None = None
    status: Callable[[Config, dict], str | None] | None = None
    check: Callable[..., None] | None = None
    check_resume: Callable[..., None] | None = None
    layout: Callable[[Config, float], str | None] | None = None
    name: str = ""  # set by register_algorithm

    def needs_critic(self, cfg: Config) -> bool:
        return self.critic(cfg) if callable(self.critic) else self.critic

    def batch_kind(self, cfg: Config) -> str:
        return self.batch(cfg) if callable(self.batch) else self.batch

    def grouped(self, cfg: Config) -> bool:
        """Training batches of whole groups of episodes: the run needs the task sequence (a group is one (task,
        init state)) and a step limit per episode (a group is batched whole)."""
        return self.batch_kind(cfg) == GROUPS

    def summary(self, cfg: Config) -> str:
        """The start block's words: ``PPO (GAE)``."""
        details = self.describe(cfg) if self.describe else ""
        return f"{self.title or self.name}" + (f" ({details})" if details else "")

    def allocate_batch(self, cfg: Config, obs_spec, action_spec):
        """One of the learner's training-batch slots, of this algorithm's batch kind."""
        if self.grouped(cfg):
            from sfengine.learning.group_batcher import GroupBatch

            return GroupBatch.allocate(
                cfg.samples_per_training_batch,
                cfg.env.task_group_size,
                obs_spec,
                action_spec,
                annotated=self.annotate is not None,
            )
        from sfengine.engine.buffers import TrajectoryBuffers

        return TrajectoryBuffers.allocate(
            cfg.trajectories_per_training_batch,
            cfg.sampler.rollout,
            obs_spec,
            action_spec,
            shared=False,
            final_obs=self.final_obs,
        )

    def make_batcher(self, cfg: Config, event_loop, buffers, task_sequence):
        """The batcher that fills those slots from the rollout workers' trajectories."""
        if self.grouped(cfg):
            from sfengine.learning.group_batcher import GroupBatcher

            return GroupBatcher(
                event_loop,
                buffers,
                cfg.sampler.rollout,
                cfg.env.task_group_size,
                cfg.samples_per_training_batch,
                # An algorithm's option: drop groups whose outcomes are all equal (PPO's --dynamic_sampling).
                bool(getattr(cfg.algorithm_options, "dynamic_sampling", False)),
                first_position=int(task_sequence.position[0]),
            )
        from sfengine.learning.batcher import Batcher

        return Batcher(event_loop, buffers, cfg.trajectories_per_training_batch)


ALGORITHMS: dict[str, Algorithm] = {}


def imported(path: str) -> Any:
    """``module:name``'s object, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def imported_on_call(path: str) -> Callable[..., Any]:
    """A callable that imports ``module:name`` at its first call and calls it: a spec's trainer or model given this
    way keeps the registration free of torch, so that reading the options (``--help``, a misspelt option) imports
    no more than the config needs. The built-in algorithms register their parts so."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return imported(path)(*args, **kwargs)

    call.__qualname__ = call.__name__ = path.partition(":")[2]
    return call


def register_algorithm(name: str, spec: Algorithm) -> None:
    """Make ``--algo=name`` train with ``spec``. Call it at the top level of your training script (before
    ``sfengine.train.main``), as ``register_env`` and ``register_model``."""
    if not name.isidentifier():
        raise ValueError(f"register_algorithm({name!r}, ...): give a name of letters, digits and underscores")
    if not isinstance(spec, Algorithm):
        raise TypeError(f"register_algorithm({name!r}, ...): give an sfengine.Algorithm, not a {type(spec).__name__}")
    if spec.batch not in (TRAJECTORIES, GROUPS) and not callable(spec.batch):
        raise ValueError(f"register_algorithm({name!r}, ...): batch is {TRAJECTORIES!r} or {GROUPS!r}")
    if spec.options is not None:
        declare_options("algo", name, spec.options)
    ALGORITHMS[name] = dataclasses.replace(spec, name=name)


def load_builtin_algorithms() -> None:
    import sfengine.algorithms.flow_sar  # noqa: F401  (each registers itself)
    import sfengine.algorithms.ppo  # noqa: F401
    import sfengine.algorithms.sac  # noqa: F401
    import sfengine.algorithms.td3  # noqa: F401


def algorithm_for(cfg: Config) -> Algorithm:
    """The run's algorithm (``--algo``)."""
    load_builtin_algorithms()
    spec = ALGORITHMS.get(cfg.learner.algo)
    if spec is None:
        raise ConfigError(
            f"--algo={cfg.learner.algo!r} is not registered (known: {', '.join(ALGORITHMS)}); call "
            "sfengine.register_algorithm at the top level of your training script"
        )
    return spec
