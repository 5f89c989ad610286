"""``Config``: a run's options, the engine's groups and the declared ones of its env and algorithm; the table of
every flat option name, and setting options by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sfengine.config.groups import (
    GROUPS,
    DebugConfig,
    EnvConfig,
    EvalConfig,
    LearnerConfig,
    ModelConfig,
    RunConfig,
    SamplerConfig,
)
from sfengine.config.options import AUTO, ConfigError, OptionInfo, _coerce, _options_of

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
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    # The declared env option groups, each created with its defaults when first used.
    env_options: dict[str, Any] = field(default_factory=dict)
    # The options some layer set (the env's preset, a saved run, --cfg, the command line); the rest are defaults.
    chosen: set[str] = field(default_factory=set)
    # The options this command's --cfg or command line set (a resumed run's saved ones not among them).
    asked: set[str] = field(default_factory=set)

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


def apply_overrides(cfg: Config, overrides: dict[str, Any], source: str) -> None:
    """Set flat options on ``cfg`` in place; unknown names are a ConfigError naming ``source``."""
    table = option_table()
    for name, value in overrides.items():
        if name not in table:
            raise ConfigError(f"unknown option '{name}' in {source}; see --help for the list of options")
        cfg.set(name, _coerce(name, value, table[name]))


def auto_capable_options(cfg: Config) -> list[str]:
    """The options of this run (the engine's and its env's) that take ``auto``."""
    groups = cfg.groups_in_use()
    return [name for name, info in option_table().items() if info.group in groups and info.field.metadata["auto"]]


def auto_options(cfg: Config) -> list[str]:
    """The options still set to ``auto``."""
    return [name for name in auto_capable_options(cfg) if cfg.get(name) == AUTO]
