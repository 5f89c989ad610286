"""Configuration: every option declared once, with its type, default and help.

Options live in small dataclasses, one per group. The command line is flat (``--num_workers=2``) and
``--help`` is grouped by dataclass. Precedence: defaults < the env's own preset (``configs/<env>.yaml``, when
one ships) or the saved run config (on resume) < YAML preset (``--cfg``) < command line.

    cfg = parse_config(["--env=CartPole-v1", "--num_workers=2"])
    cfg.sampler.num_workers  # 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from sfengine.algo.surrogates import SurrogateParams

PUBLISHED = SurrogateParams()  # the clip modes' published parameters


class ConfigError(ValueError):
    """A user-caused configuration problem. The message is one line that names the fix."""


AUTO = -(2**31)  # how an option given as "auto" is held until sfengine.sizing chooses it; no one types this value


def option(default: Any, help: str, choices: tuple | None = None, auto: bool = False) -> Any:
    """Declare one option: its default and its one line of help (the type comes from the annotation). With
    ``auto``, the option also takes the value ``auto``: chosen at start from the machine (``sfengine.sizing``)."""
    metadata = {"help": help, "choices": choices, "auto": auto}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class EnvConfig:
    env: str = option("CartPole-v1", "environment: a registered sfengine env or any gymnasium id")
    seed: int = option(0, "base random seed; each env gets its own seed derived from it")
    max_episode_steps: int = option(0, "truncate episodes after this many steps (0: the env's own limit)")
    tasks: list[int] = option([], "multi-task envs: train on only these task indices (default: every task)")
    task_group_size: int = option(
        1, "multi-task envs: each (task, init state) is handed out this many times in a row (RLOO/GRPO groups)"
    )
    task_sampling: str = option(
        "round_robin",
        "multi-task envs: tasks in turn, or drawn with probability (recent failures + 1); init states always cycle",
        ("round_robin", "curriculum"),
    )
    curriculum_window: int = option(20, "curriculum: recent episodes of each task whose failures weigh its draw")


@dataclass
class SamplerConfig:
    num_workers: int = option(2, "rollout worker processes", auto=True)
    num_envs_per_worker: int = option(8, "environments stepped by each rollout worker", auto=True)
    worker_num_splits: int = option(
        2, "groups of envs per worker; while one group waits for actions the other steps (double buffering)"
    )
    num_inference_workers: int = option(
        1,
        "inference worker processes that batch requests from all rollout workers; 0: each rollout worker runs the "
        "policy itself (no inference process: for small CPU policies on slow envs with a core per rollout worker)",
        auto=True,
    )
    inference_dtype: str = option(
        "float32",
        "precision of the image (CNN) encoders in inference workers; bfloat16 cuts their CPU cost by about 40 "
        "percent where the CPU has native bf16 (AVX512-BF16, AMX). The learner always trains in float32",
        ("float32", "bfloat16"),
    )
    inference_backend: str = option(
        "auto",
        "how inference workers run the policy: numpy for MLP policies over vector observations on CPU (4-5x less "
        "CPU per batch than torch at inference batch sizes), torch for everything else; auto picks",
        ("auto", "torch", "numpy"),
    )
    rollout: int = option(32, "env steps per trajectory handed to the learner")
    serial_mode: bool = option(False, "run every component on one event loop in one process (debugging, tiny machines)")
    async_rl: bool = option(
        True, "collect while the learner trains (policy lag > 0); False: on-policy, samplers wait for each update"
    )


@dataclass
class LearnerConfig:
    batch_size: int = option(1024, "samples per minibatch (one optimiser step)")
    num_batches_per_epoch: int = option(2, "minibatches per epoch; one training batch = batch_size x this")
    num_epochs: int = option(4, "passes over each training batch")
    learning_rate: float = option(1e-3, "Adam learning rate")
    lr_schedule: str = option("constant", "learning-rate schedule over train_for_env_steps", ("constant", "linear"))
    adam_eps: float = option(1e-6, "Adam epsilon")
    gamma: float = option(0.99, "discount factor")
    gae_lambda: float = option(0.95, "GAE lambda")
    ppo_clip_ratio: float = option(0.2, "PPO clip on the probability ratio")
    ppo_clip_value: float = option(1.0, "clip on the change of the value prediction (0: no value clipping)")
    value_loss_coeff: float = option(0.5, "weight of the value loss")
    entropy_coeff: float = option(0.003, "weight of the entropy bonus")
    kl_coeff: float = option(
        0.0,
        "weight of a penalty on the KL divergence from the policy the run started from (its --init_from clone; "
        "kept in checkpoints), estimated per sample as GRPO does; keeps a long fine-tuning near its clone; 0: off",
    )
    target_kl: float = option(
        0.0,
        "end an update early, before its next minibatch step, once a step's approximate KL from the acting policy "
        "passed 1.5 x this (the ranks' mean), as CleanRL and SB3 do: no batch moves the policy far; 0: off",
    )
    max_grad_norm: float = option(4.0, "gradient norm clip (0: off)")
    normalize_advantage: bool = option(True, "normalise advantages per minibatch")
    reward_scale: float = option(
        1.0,
        "multiply rewards by this before learning (stats keep the raw reward); rarely needed with --normalize_returns",
    )
    reward_clip: float = option(0.0, "clip scaled rewards to [-x, x] (0: off)")
    vtrace_rho: float = option(1.0, "V-trace importance-weight clip for the value targets")
    vtrace_c: float = option(1.0, "V-trace trace-cutting clip")
    learner_threads: int = option(1, "torch CPU threads in the learner process (rollout and inference use 1)")
    learner_backend: str = option(
        "auto",
        "how the learner runs its minibatch steps: numpy for MLP policies over vector observations on CPU with "
        "--clip_mode=ppo_clip (the same loss and Adam step, 2-3.4x less time a step than torch at minibatch sizes of 64-512), "
        "torch for everything else; auto picks",
        ("auto", "torch", "numpy"),
    )
    device: str = option("cpu", "device of the learner and inference workers", ("cpu", "cuda"))
    critic_warmup_batches: int = option(
        0,
        "train the value head alone for the first N training batches: the policy's weights, its log-std and the "
        "observation statistics stay as they start (the workers act with the initial policy, e.g. one from "
        "--init_from); with --actor_critic=shared the encoder is the policy's and stays too, only the value head moves",
    )
    algo: str = option(
        "ppo",
        "ppo (the policy surrogate of --clip_mode with the advantages of --advantage), flow_sar (a flow-matching "
        "policy, --policy_head=flow, trained by FlowSAR on whole episodes and their success: no critic, no "
        "likelihoods; its options are in the flow_sar group), or a name given to sfengine.register_algorithm",
    )


@dataclass
class AdvantageConfig:
    """How each step's advantage is estimated: with a critic (gae, vtrace) or, critic-free, from the outcomes of a
    group of episodes of one (task, init state) (``sfengine.algo.group_advantages``)."""

    advantage: str = option(
        "gae",
        "gae (with a critic), vtrace (with a critic, corrects policy lag), rloo or grpo (no critic: each episode "
        "against the other --task_group_size - 1 episodes of its (task, init state)), or a name given to "
        "register_group_advantage",
    )
    group_outcome: str = option(
        "return", "rloo/grpo: an episode's outcome is its return, or its success (0/1)", ("return", "success")
    )
    dynamic_sampling: bool = option(
        False, "rloo/grpo: drop groups whose outcomes are all equal (they carry no signal); counted and reported"
    )
    group_loss_weighting: str = option(
        "step",
        "rloo/grpo: how a group's episodes weigh in the loss: step (every step alike, so an episode that ran to the "
        "time limit outweighs a short success) or episode (every episode alike, whatever its length)",
        ("step", "episode"),
    )
    recompute_advantages: bool = option(
        False,
        "gae: recompute the values, advantages and value targets with the learner's current critic before every "
        "epoch, instead of once from the values the acting policy wrote (costs one critic pass over the batch per "
        "epoch)",
    )


@dataclass
class PolicyLossConfig:
    """The policy surrogate (``sfengine.algo.surrogates``): how the ratio r = pi / pi_old and the advantage make the
    policy loss. Defaults of the modes' parameters are the published ones."""

    clip_mode: str = option(
        "ppo_clip",
        "policy surrogate: ppo_clip (PPO's clipped ratio, eps = --ppo_clip_ratio), soft_clip (no cut, extreme ratios "
        "damped), sapo (sigmoid gate), ce_gppo (PPO's clip, but clipped samples keep a scaled gradient), cispo "
        "(clipped, detached ratio times log pi), or a name given to register_surrogate",
    )
    soft_clip_alpha: float = option(
        PUBLISHED.soft_clip_alpha, "soft_clip: the damping coefficient is (1 / max(r, 1/r))^alpha"
    )
    sapo_tau_pos: float = option(PUBLISHED.sapo_tau_pos, "sapo: gate temperature for A > 0 (the SAPO paper's default)")
    sapo_tau_neg: float = option(PUBLISHED.sapo_tau_neg, "sapo: gate temperature for A < 0 (the SAPO paper's default)")
    ce_gppo_beta_low: float = option(
        PUBLISHED.ce_gppo_beta_low,
        "ce_gppo: gradient scale of samples clipped below 1 - eps with A < 0 (CE-GPPO authors' default)",
    )
    ce_gppo_beta_high: float = option(
        PUBLISHED.ce_gppo_beta_high,
        "ce_gppo: gradient scale of samples clipped above 1 + eps with A > 0 (CE-GPPO authors' default)",
    )
    ce_gppo_dual_clip: float = option(
        PUBLISHED.ce_gppo_dual_clip,
        "ce_gppo: samples with A < 0 and a ratio above this keep the value c A and no gradient (dual clip, as in "
        "the CE-GPPO authors' code; 0: off)",
    )
    cispo_eps_low: float = option(
        PUBLISHED.cispo_eps_low,
        "cispo: the weight is clipped below at 1 - eps_low (1: no lower bound, as in MiniMax-M1's CISPO)",
    )
    cispo_eps_high: float = option(
        PUBLISHED.cispo_eps_high,
        "cispo: the weight is clipped above at 1 + eps_high (0.28, the default of Trinity-RFT's CISPO)",
    )


@dataclass
class ModelConfig:
    model: str = option(
        "actor_critic",
        "the policy model: the built-in actor_critic (CNN and MLP encoders, the heads below), or a name given to "
        "sfengine.register_model (a model of your own, an ActorCritic subclass)",
    )
    hidden_sizes: list[int] = option([64, 64], "MLP encoder layer widths for vector observations")
    activation: str = option("tanh", "activation of the encoders", ("tanh", "relu", "elu"))
    normalize_input: bool = option(True, "running mean/std normalisation of vector observations")
    input_statistics: str = option(
        "running",
        "the normalisation's statistics: running (merged from every training batch) or frozen (kept as they start; "
        "use it with --init_from, so a clone's inputs keep the scale it learnt them in)",
        ("running", "frozen"),
    )
    continuous_log_std: str = option(
        "state_independent",
        "Gaussian head: log-std as a free parameter, or predicted from the state",
        ("state_independent", "state_dependent"),
    )
    initial_log_std: float = option(0.0, "initial log-std of the Gaussian head")
    actor_critic: str = option(
        "shared",
        "shared: one encoder feeds the policy and value heads; separate: the critic has encoders of its own, so a "
        "large value loss cannot take over the policy's features (the reference PPOs' choice for continuous control)",
        ("shared", "separate"),
    )
    normalize_returns: bool = option(
        True,
        "the critic learns returns scaled by their running mean and std, so no env needs a hand-set --reward_scale "
        "(sparse 0/1 successes and returns of thousands alike); the value clip is then in units of that std",
    )
    policy_head: str = option(
        "gaussian",
        "continuous actions: a Gaussian (PPO's likelihoods), or flow: a flow-matching velocity network integrated "
        "by --flow_steps Euler steps from noise (for --algo=flow_sar; no likelihood)",
        ("gaussian", "flow"),
    )
    flow_steps: int = option(10, "flow head: Euler steps from noise (t = 1) to the action chunk (t = 0)")
    flow_hidden_sizes: list[int] = option([128, 128], "flow head: the velocity network's layer widths (SiLU)")
    action_chunk: int = option(
        1,
        "actions the policy emits per inference request (continuous actions): the env steps through the chunk, then "
        "the policy sees the next observation, as VLA policies act (pi0: 5-10). A trajectory entry is one chunk: "
        "--rollout and --batch_size count chunks, rewards inside a chunk are summed with discounting, and gamma "
        "applies per env step",
    )


@dataclass
class RunConfig:
    experiment: str = option("default_experiment", "experiment name; files go to <train_dir>/<experiment>")
    train_dir: str = option("train_dir", "directory that holds experiment directories")
    restart_behavior: str = option(
        "resume",
        "resume: continue from the latest checkpoint; restart: move the old run aside and start over; "
        "overwrite: delete the old run and start over",
        ("resume", "restart", "overwrite"),
    )
    train_for_env_steps: int = option(300_000, "stop after this many env steps (counted across resumes)")
    train_for_seconds: float = option(0.0, "stop after this many seconds of this run (0: no limit)")
    stop_at_return: float = option(
        math.inf, "stop once the mean return of the last --stats_window episodes reaches this (inf: never)"
    )
    stop_at_success: float = option(
        math.inf, "stop once the success rate of the last --stats_window episodes reaches this, 0-1 (inf: never)"
    )
    save_every_sec: float = option(120.0, "seconds between checkpoints")
    keep_checkpoints: int = option(3, "newest checkpoints kept")
    report_every_sec: float = option(5.0, "seconds between status lines")
    hang_timeout_sec: float = option(
        120.0, "a rollout or inference worker silent this long is hung: print its stack and respawn it (0: off)"
    )
    max_respawns: int = option(
        3,
        "respawns of one rollout or inference worker allowed within --respawn_window_sec; one more stops the run "
        "(0: a dead or hung worker stops the run)",
    )
    respawn_window_sec: float = option(3600.0, "the window --max_respawns counts in")
    chaos_kill_every_sec: float = option(
        0.0,
        "fault injection: SIGKILL a random rollout or inference worker this often, to check that a run "
        "survives it (respawns it causes do not count towards --max_respawns; 0: off)",
    )
    stats_window: int = option(100, "episodes averaged for the return, length and success statistics")
    benchmark: bool = option(False, "sampling only: collect and discard trajectories, no training")
    init_from: str = option(
        "",
        "start from the weights and observation statistics of an experiment in --train_dir (its latest checkpoint) "
        "or of a checkpoint file, e.g. a sfengine.pretrain run; the network options come from that run's config.json; "
        "the optimiser, step count, return statistics and task sequence start fresh. An experiment that resumes "
        "from a checkpoint of its own ignores it",
    )


@dataclass
class EvalConfig:
    checkpoint: str = option(
        "", "sfengine.evaluate: the checkpoint file to evaluate (default: the experiment's latest)"
    )
    eval_episodes: int = option(10, "single-task envs: episodes per evaluation, with seeds 0..N-1")
    episodes_per_init: int = option(1, "multi-task envs: episodes of each (task, init state) per evaluation")
    eval_tasks: list[int] = option([], "multi-task envs: evaluate only these task indices (default: every task)")
    eval_init_states: int = option(0, "multi-task envs: evaluate only each task's first N init states (0: all)")
    eval_deterministic: bool = option(True, "evaluate with the action distribution's mode; False: sample actions")
    video_per_task: int = option(0, "sfengine.evaluate: record this many episodes of each task as mp4")
    video_size: int = option(256, "width and height of recorded videos in pixels (even)")
    eval_every_env_steps: int = option(
        0, "training: evaluate the current weights every this many env steps, in a separate process (0: off)"
    )
    eval_episodes_per_task: int = option(
        0,
        "training evaluator, multi-task envs: episodes of each task per evaluation (0: every init state); the "
        "init states cycle across evaluations, so over time every one is seen",
    )
    eval_at_end: bool = option(
        True,
        "training evaluator: also evaluate the final weights once training's workers have stopped, when the run "
        "ends by its step or time limit or a --stop_at target (not after a signal or a failure)",
    )


GROUPS: dict[str, type] = {
    "env": EnvConfig,
    "sampler": SamplerConfig,
    "learner": LearnerConfig,
    "advantage": AdvantageConfig,
    "policy_loss": PolicyLossConfig,
    "model": ModelConfig,
    "run": RunConfig,
    "eval": EvalConfig,
}

# Options declared by their owner: an env next to its factory (``register_env(name, factory, options=...)``) or an
# algorithm in its spec (``register_algorithm(name, Algorithm(..., options=...))``): a dataclass of ``option()``
# fields, named by its ``group`` class attribute (default: the first owner registered with it). Declarations come
# at import time, before any option is parsed; option_table() caches what they add up to. A run takes the options
# of its own env and of its own algorithm; another owner's option is an error that names the owner.
DECLARED_GROUPS: dict[str, type] = {}  # group name -> options dataclass
GROUP_OWNERS: dict[str, dict[str, str]] = {"env": {}, "algo": {}}  # "env"/"algo" -> owner name -> its group


def declare_options(kind: str, owner: str, options_cls: type) -> None:
    """Record that ``--<kind>=owner`` (``--env=libero_spatial``, ``--algo=flow_sar``) takes the options of the
    dataclass ``options_cls``. Several owners may share one class (the five LIBERO suites do)."""
    call = {"env": "register_env", "algo": "register_algorithm"}[kind]
    if not (isinstance(options_cls, type) and dataclasses.is_dataclass(options_cls)):
        raise TypeError(f"{call}({owner!r}, ...): options must be a dataclass of option() fields")
    known = [name for name, cls in DECLARED_GROUPS.items() if cls is options_cls]
    group = known[0] if known else getattr(options_cls, "group", owner)
    declared = DECLARED_GROUPS.get(group)
    if declared is not None and declared is not options_cls or (not known and group in GROUPS):
        taken_by = declared.__name__ if declared is not None else "the engine"
        raise TypeError(f"{kind} options {options_cls.__name__}: the group name {group!r} is taken by {taken_by}")
    taken = set(_static_options()) | {
        f.name for other, cls in DECLARED_GROUPS.items() if other != group for f in dataclasses.fields(cls)
    }
    clash = sorted(f.name for f in dataclasses.fields(options_cls) if f.name in taken)
    if clash:
        raise TypeError(
            f"{kind} options {options_cls.__name__}: {', '.join(clash)} already exist; prefix them with the {kind}"
        )
    DECLARED_GROUPS[group] = options_cls
    GROUP_OWNERS[kind][owner] = group
    _declared_options.cache_clear()


def declare_env_options(env_name: str, options_cls: type) -> None:
    declare_options("env", env_name, options_cls)


def group_owner(group: str) -> tuple[str, list[str]]:
    """Who declared an option group: ("env", the envs) or ("algo", the algorithms)."""
    for kind, owners in GROUP_OWNERS.items():
        names = [owner for owner, owned in owners.items() if owned == group]
        if names:
            return kind, names
    raise KeyError(group)


def load_builtin_envs() -> None:
    import sfengine_envs  # noqa: F401  (registers the built-in envs and declares their options)


def load_builtin_algorithms() -> None:
    from sfengine.algorithms import load_builtin_algorithms

    load_builtin_algorithms()


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # The declared env option groups, each created with its defaults when first used.
    env_options: dict[str, Any] = field(default_factory=dict)

    def options_group(self, group: str) -> Any:
        """The options of an engine group (``"sampler"``) or of a declared env or algorithm group (``"libero"``,
        ``"flow_sar"``)."""
        if group in GROUPS:
            return getattr(self, group)
        if group not in self.env_options:
            self.env_options[group] = DECLARED_GROUPS[group]()
        return self.env_options[group]

    @property
    def own_env_options(self) -> Any:
        """The options declared by this run's env (a ``LiberoOptions`` for ``--env=libero_spatial``), or None
        for an env that declares none."""
        group = GROUP_OWNERS["env"].get(self.env.env)
        return self.options_group(group) if group else None

    @property
    def algorithm_options(self) -> Any:
        """The options declared by this run's algorithm (FlowSAR's for ``--algo=flow_sar``), or None."""
        group = GROUP_OWNERS["algo"].get(self.learner.algo)
        return self.options_group(group) if group else None

    @property
    def needs_critic(self) -> bool:
        """Whether this run's model has a value head: its algorithm's answer (PPO with GAE or V-trace: yes)."""
        from sfengine.algorithms import algorithm_for

        return algorithm_for(self).needs_critic(self)

    @property
    def critic_free(self) -> bool:
        """``not needs_critic``, the name model factories written before algorithms were registered use."""
        return not self.needs_critic

    @property
    def experiment_dir(self) -> Path:
        return Path(self.run.train_dir) / self.run.experiment

    @property
    def envs_per_split(self) -> int:
        return self.sampler.num_envs_per_worker // self.sampler.worker_num_splits

    @property
    def samples_per_training_batch(self) -> int:
        return self.learner.batch_size * self.learner.num_batches_per_epoch

    @property
    def trajectories_per_training_batch(self) -> int:
        return self.samples_per_training_batch // self.sampler.rollout

    def groups_in_use(self) -> dict[str, Any]:
        """Every engine group, and this env's and this algorithm's own options: what config.json records."""
        groups = {name: getattr(self, name) for name in GROUPS}
        for group in self.own_groups():
            groups[group] = self.options_group(group)
        return groups

    def own_groups(self) -> list[str]:
        """The declared groups this run takes: its env's and its algorithm's."""
        owned = (GROUP_OWNERS["env"].get(self.env.env), GROUP_OWNERS["algo"].get(self.learner.algo))
        return [group for group in owned if group]

    def to_dict(self) -> dict:
        return {name: dataclasses.asdict(group) for name, group in self.groups_in_use().items()}

    def get(self, name: str) -> Any:
        """The value of the flat option ``name`` (``cfg.get("libero_sim_cache")``)."""
        return getattr(self.options_group(option_table()[name].group), name)

    def set(self, name: str, value: Any) -> None:
        setattr(self.options_group(option_table()[name].group), name, value)


@dataclass(frozen=True)
class OptionInfo:
    group: str
    field: dataclasses.Field
    annotation: Any

    @property
    def default(self) -> Any:
        f = self.field
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _options_of(groups: dict[str, type]) -> dict[str, OptionInfo]:
    table = {}
    for group_name, group_cls in groups.items():
        hints = get_type_hints(group_cls)
        for f in dataclasses.fields(group_cls):
            table[f.name] = OptionInfo(group_name, f, hints[f.name])
    return table


@cache
def _static_options() -> dict[str, OptionInfo]:
    return _options_of(GROUPS)


@cache
def _declared_options() -> dict[str, OptionInfo]:
    return _options_of(DECLARED_GROUPS)


def option_table() -> dict[str, OptionInfo]:
    """Every flat option name: the engine's and those declared by the registered envs and algorithms."""
    load_builtin_envs()
    load_builtin_algorithms()
    return {**_static_options(), **_declared_options()}


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation)) if annotation in (bool, int, float, str) else "list"


def _coerce(name: str, value: Any, info: OptionInfo) -> Any:
    text = _type_name(info.annotation)
    if info.field.metadata["auto"] and str(value).strip().lower() == "auto":
        return AUTO
    try:
        if text == "bool":
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if text == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if text == "float":
            return float(value)
        if text == "list":
            items = value if isinstance(value, list) else [v for v in str(value).replace(" ", "").split(",") if v]
            return [int(v) for v in items]
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}={value!r} is not a valid {text}") from None


def apply_overrides(cfg: Config, overrides: dict[str, Any], source: str) -> None:
    """Set flat options on ``cfg`` in place; unknown names are a ConfigError naming ``source``."""
    table = option_table()
    for name, value in overrides.items():
        if name not in table:
            raise ConfigError(f"unknown option '{name}' in {source}; see --help for the list of options")
        cfg.set(name, _coerce(name, value, table[name]))


PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def shipped_presets() -> Path:
    try:
        import sfengine_configs

        return Path(sfengine_configs.__file__).parent
    except ImportError:
        return PRESET_DIR


def resolve_preset(path_or_name: str) -> Path:
    """A preset is a YAML path, or the name of one shipped in configs/ (``--cfg=cartpole``)."""
    shipped = shipped_presets()
    name = Path(path_or_name).name
    for candidate in (Path(path_or_name), shipped / name, shipped / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in shipped.glob("*.yaml"))
    raise ConfigError(f"--cfg={path_or_name}: no such preset file; give a YAML path or one of {known}")


def env_defaults_preset(env_name: str) -> Path | None:
    """The preset shipped under the env's own name (``configs/libero_spatial.yaml``): that env's defaults."""
    path = shipped_presets() / f"{env_name}.yaml"
    return path if path.is_file() else None


def load_preset(path_or_name: str, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The options of a preset. ``base: <preset>`` in it starts from another preset (a shipped name or a path
    relative to this one), whose options it then overrides: ``configs/halfcheetah.yaml`` is ``base: mujoco`` and
    the few settings that env wants on top."""
    path = resolve_preset(path_or_name).resolve()
    if path in _seen:
        raise ConfigError(
            f"--cfg={path}: its base presets form a cycle ({' -> '.join(p.name for p in _seen)}); remove one base"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--cfg={path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--cfg={path}: a preset must be a mapping of option: value")
    if "base" not in data:
        return data
    base = str(data.pop("base"))
    relative = path.parent / base
    return {**load_preset(str(relative) if relative.is_file() else base, (*_seen, path)), **data}


def preset_help() -> str:
    """``--cfg``'s help: each shipped preset with the first line of its own comment, which says when to use it.
    An env's own defaults (``configs/<env>.yaml``, the LIBERO suites) apply by themselves and are only named."""
    described, env_defaults = [], []
    for path in sorted(shipped_presets().glob("*.yaml")):
        first_line = path.read_text().splitlines()[0] if path.stat().st_size else ""
        if first_line.startswith("# Defaults of --env="):
            env_defaults.append(path.stem)
        else:
            described.append(f"{path.stem}: {first_line.lstrip('# ').rstrip('.')}")
    return (
        "YAML preset: a path, or the name of one shipped in configs/: "
        + "; ".join(described)
        + (f". Applied by themselves with their --env: {', '.join(env_defaults)}" if env_defaults else "")
    )


TRAIN_DESCRIPTION = (
    "Train an RL agent with sfengine. Options are grouped below; every one can also be set in a YAML preset given "
    "with --cfg."
)


def build_parser(
    prog: str = "python -m sfengine.train", description: str = TRAIN_DESCRIPTION
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--cfg", default=None, help=preset_help())
    table = option_table()
    for group_name in [*GROUPS, *DECLARED_GROUPS]:
        description = None
        if group_name in DECLARED_GROUPS:
            kind, owners = group_owner(group_name)
            description = f"options of --{kind}={', '.join(owners)}"
        options = {name: info for name, info in table.items() if info.group == group_name}
        add_option_group(parser, group_name, options, description)
    return parser


def add_option_group(
    parser: argparse.ArgumentParser, title: str, options: dict[str, OptionInfo], description: str | None = None
) -> None:
    """Add ``options`` to ``parser`` as one titled group of ``--help``."""
    group = parser.add_argument_group(title, description)
    for name, info in options.items():
        metadata, type_name = info.field.metadata, _type_name(info.annotation)
        # SUPPRESS keeps unset options out of the namespace, so a preset is not overridden by defaults.
        group.add_argument(
            f"--{name}",
            default=argparse.SUPPRESS,
            metavar={"list": "INT,INT,..."}.get(type_name, type_name.upper()),
            help=f"{metadata['help']} (default: {info.default})"
            + (f"; one of {', '.join(metadata['choices'])}" if metadata["choices"] else "")
            + ("; auto: chosen from the cores and memory at start" if metadata["auto"] else ""),
        )


def command_options(options_cls: type, argv: list[str]) -> tuple[Any, list[str]]:
    """The options of a command's own dataclass (``group`` names its ``--help`` group; sfengine.pretrain's, say),
    taken out of ``argv``: the filled-in dataclass, validated by its ``validate()`` if it has one, and the rest of
    ``argv``, for ``parse_config``. Add the group to the command's parser with ``add_command_options`` for --help."""
    options = _options_of({options_cls.group: options_cls})
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_option_group(parser, options_cls.group, options)
    try:
        namespace, rest = parser.parse_known_args(argv)
    except SystemExit:
        raise ConfigError("invalid command line; see the message above and --help") from None
    given = {name: _coerce(name, value, options[name]) for name, value in vars(namespace).items()}
    instance = options_cls(**given)
    if hasattr(instance, "validate"):
        instance.validate()
    return instance, rest


def add_command_options(parser: argparse.ArgumentParser, options_cls: type) -> None:
    """Show a command's own options (see ``command_options``) as a group of its ``--help``."""
    add_option_group(parser, options_cls.group, _options_of({options_cls.group: options_cls}))


def auto_capable_options(cfg: Config) -> list[str]:
    """The options of this run (the engine's and its env's) that take ``auto``."""
    groups = cfg.groups_in_use()
    return [name for name, info in option_table().items() if info.group in groups and info.field.metadata["auto"]]


def auto_options(cfg: Config) -> list[str]:
    """The options still set to ``auto``."""
    return [name for name in auto_capable_options(cfg) if cfg.get(name) == AUTO]


def validate(cfg: Config) -> None:
    """Reject inconsistent or impossible settings with a one-line message naming the fix. Options still at
    ``auto`` are checked once ``sfengine.sizing`` has chosen them."""
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
        if getattr(s, name) < 1 and name not in auto:
            raise ConfigError(f"--{name}={getattr(s, name)} must be at least 1")
    if s.num_inference_workers < 0 and "num_inference_workers" not in auto:
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
    if auto & {"num_workers", "num_envs_per_worker"}:
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
    for name in ("learning_rate", "gamma", "ppo_clip_ratio"):
        if getattr(lrn, name) <= 0:
            raise ConfigError(f"--{name}={getattr(lrn, name)} must be positive")
    if not 0 < lrn.gamma <= 1 or not 0 <= lrn.gae_lambda <= 1:
        raise ConfigError("--gamma must be in (0, 1] and --gae_lambda in [0, 1]")
    for name in (
        "ppo_clip_value",
        "max_grad_norm",
        "reward_clip",
        "entropy_coeff",
        "value_loss_coeff",
        "kl_coeff",
        "target_kl",
    ):
        if getattr(lrn, name) < 0:
            raise ConfigError(f"--{name}={getattr(lrn, name)} must not be negative")
    model = cfg.model
    if model.flow_steps < 1 or not model.flow_hidden_sizes or min(model.flow_hidden_sizes) < 1:
        raise ConfigError("--flow_steps must be at least 1 and --flow_hidden_sizes positive widths (e.g. 128,128)")
    from sfengine.algorithms import algorithm_for

    algorithm = algorithm_for(cfg)  # an unregistered --algo is an error here
    if lrn.critic_warmup_batches < 0:
        raise ConfigError(f"--critic_warmup_batches={lrn.critic_warmup_batches} must not be negative")
    if lrn.critic_warmup_batches and not algorithm.needs_critic(cfg):
        raise ConfigError(
            f"--critic_warmup_batches trains the value head, and this run has none ({algorithm.summary(cfg)}): drop "
            "it, or train with --advantage=gae or vtrace"
        )
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
        "max_respawns",
        "respawn_window_sec",
        "chaos_kill_every_sec",
    ):
        if getattr(run, name) < 0:
            raise ConfigError(f"--{name}={getattr(run, name)} must not be negative")
    if run.stop_at_success != math.inf and not 0 < run.stop_at_success <= 1:
        raise ConfigError(f"--stop_at_success={run.stop_at_success} is a success rate: give one in (0, 1], e.g. 0.8")
    if run.keep_checkpoints < 1 or run.stats_window < 1:
        raise ConfigError("--keep_checkpoints and --stats_window must be at least 1")
    if not run.experiment or os.sep in run.experiment or run.experiment in (".", ".."):
        raise ConfigError(f"--experiment={run.experiment!r} must be a plain directory name")
    ev = cfg.eval
    for name in ("eval_episodes", "episodes_per_init"):
        if getattr(ev, name) < 1:
            raise ConfigError(f"--{name}={getattr(ev, name)} must be at least 1")
    if any(task < 0 for task in ev.eval_tasks):
        raise ConfigError(f"--eval_tasks={ev.eval_tasks}: task indices start at 0")
    for name in ("video_per_task", "eval_every_env_steps", "eval_episodes_per_task", "eval_init_states"):
        if getattr(ev, name) < 0:
            raise ConfigError(f"--{name}={getattr(ev, name)} must not be negative")
    if ev.video_size < 16 or ev.video_size % 2:
        raise ConfigError(f"--video_size={ev.video_size}: give an even number of pixels, at least 16 (e.g. 256)")
    if lrn.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device=cuda but torch sees no CUDA device; use --device=cpu")


def check_group_layout(cfg: Config) -> None:
    """Group batches (critic-free advantages, FlowSAR): a training batch holds whole groups, so one group of episodes at their step limit
    (``--max_episode_steps``, filled in from the env when 0) must fit in it. Checked once the env is known."""
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


def parse_config(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> Config:
    """Parse the command line into a validated Config. Raises ConfigError on bad input."""
    parser = parser or build_parser()
    try:
        namespace = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            raise
        raise ConfigError("invalid command line; see the message above and --help") from None
    cli = {k: v for k, v in vars(namespace).items() if k != "cfg"}
    # Layers from the lowest to the highest precedence; the defaults are below them all.
    layers = [
        (load_preset(namespace.cfg) if namespace.cfg else {}, f"--cfg={namespace.cfg}"),
        (cli, "the command line"),
    ]
    cfg = _layered(layers)
    saved = cfg.experiment_dir / "config.json"
    if cfg.run.restart_behavior == "resume" and saved.is_file():
        # A resumed run keeps its saved settings; the preset and the command line still win.
        layers.insert(0, (load_saved_config(saved), str(saved)))
        given = layers[1:]  # (files written before envs declared their options hold every env's: not an error)
    else:
        env_defaults = env_defaults_preset(cfg.env.env)
        if env_defaults is not None:
            layers.insert(0, (load_preset(str(env_defaults)), str(env_defaults)))
        if inherited := init_from_model_options(cfg.run.init_from, cfg.run.train_dir):
            # Above the env's defaults, below --cfg and the command line: the network the weights were trained in.
            layers.insert(1 if env_defaults is not None else 0, inherited)
        given = layers
    cfg = _layered(layers)
    table, own_groups = option_table(), cfg.own_groups()
    for overrides, source in given:
        for name in overrides:
            group = table[name].group
            if group not in GROUPS and group not in own_groups:
                kind, owners = group_owner(group)
                current = cfg.env.env if kind == "env" else cfg.learner.algo
                raise ConfigError(
                    f"--{name} (in {source}) is an option of --{kind}={', '.join(owners)}, not of --{kind}={current}; "
                    f"drop it or change --{kind}"
                )
    validate(cfg)
    return cfg


# What the weights of an --init_from checkpoint fit: a fine-tuning run takes these from the checkpoint's own run.
ARCHITECTURE_OPTIONS = (
    "model",
    "hidden_sizes",
    "activation",
    "normalize_input",
    "continuous_log_std",
    "actor_critic",
    "policy_head",
    "flow_steps",
    "flow_hidden_sizes",
    "action_chunk",
)


def init_from_model_options(source: str, train_dir: str) -> tuple[dict[str, Any], str] | None:
    """The architecture options (``ARCHITECTURE_OPTIONS``) of the run that wrote ``--init_from``'s checkpoint, and
    the config file they come from; None where there is no such file (a checkpoint moved out of its run)."""
    if not source:
        return None
    path = Path(source)
    if path.is_file():
        saved = path.parent.parent / "config.json"  # <experiment>/checkpoints/<file>
    else:
        saved = (path if path.is_dir() else Path(train_dir) / source) / "config.json"
    if not saved.is_file():
        return None
    flat = load_saved_config(saved)
    return {name: flat[name] for name in ARCHITECTURE_OPTIONS if name in flat}, f"{saved} (--init_from's run)"


def _layered(layers: list[tuple[dict[str, Any], str]]) -> Config:
    cfg = Config()
    for overrides, source in layers:
        apply_overrides(cfg, overrides, source)
    return cfg


def load_saved_config(path: Path) -> dict[str, Any]:
    try:
        nested = json.loads(path.read_text())
        flat = {name: value for group in nested.values() for name, value in group.items()}
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"{path} is corrupt ({exc}); fix it or use --restart_behavior=restart") from None
    if "with_vtrace" in flat:  # written before --advantage existed
        flat["advantage"] = "vtrace" if flat.pop("with_vtrace") else "gae"
    # An option this version no longer has (written by an older or a trial version) cannot change what the run
    # does now: it is named and left out, where a user's preset or command line with it is an error.
    table = option_table()
    retired = sorted(name for name in flat if name not in table)
    if retired:
        print(f"{path}: ignoring {', '.join(retired)}, which this version of sfengine does not have", file=sys.stderr)
    return {name: value for name, value in flat.items() if name in table}


def save_config(cfg: Config, path: Path) -> None:
    # An option still at auto (a run that sized nothing: sfengine.pretrain) is written as "auto", which loads back.
    data = {name: {k: "auto" if v == AUTO else v for k, v in group.items()} for name, group in cfg.to_dict().items()}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
