"""Configuration: every option declared once, with its type, default and help.

Options live in small dataclasses, one per group. The command line is flat (``--num_workers=2``) and
``--help`` is grouped by owner: the engine's groups (``groups``), then the options an env or an algorithm declares
beside its own code (``core.declare_options``). Precedence: defaults < the env's own preset
(``configs/<env>.yaml``, when one ships) or the saved run config (on resume) < YAML preset (``--cfg``) < command
line.

    cfg = parse_config(["--env=CartPole-v1", "--num_workers=2"])
    cfg.sampler.num_workers  # 2

The package: ``options`` (the mechanism: ``option()``, coercion), ``groups`` (the engine's groups), ``core``
(``Config``, declared groups, the option table), ``files`` (presets, saved configs), ``parsing`` (the command
line), ``validation`` (the engine's cross-option rules).
"""

from sfengine.config.core import (
    DECLARED_GROUPS,
    GROUP_OWNERS,
    Config,
    apply_overrides,
    auto_capable_options,
    auto_options,
    declare_env_options,
    declare_options,
    group_owner,
    load_builtin_algorithms,
    load_builtin_envs,
    option_table,
)
from sfengine.config.files import (
    ARCHITECTURE_OPTIONS,
    PRESET_DIR,
    env_defaults_preset,
    init_from_model_options,
    load_preset,
    load_saved_config,
    preset_help,
    resolve_preset,
    save_config,
    shipped_presets,
)
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
from sfengine.config.options import AUTO, ConfigError, OptionInfo, option
from sfengine.config.parsing import (
    TRAIN_DESCRIPTION,
    add_command_options,
    add_option_group,
    build_parser,
    check_command_line,
    check_option_values,
    command_options,
    parse_config,
)
from sfengine.config.validation import check_group_layout, validate

__all__ = [
    "ARCHITECTURE_OPTIONS",
    "AUTO",
    "DECLARED_GROUPS",
    "GROUPS",
    "GROUP_OWNERS",
    "PRESET_DIR",
    "TRAIN_DESCRIPTION",
    "Config",
    "DebugConfig",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LearnerConfig",
    "ModelConfig",
    "OptionInfo",
    "RunConfig",
    "SamplerConfig",
    "add_command_options",
    "add_option_group",
    "apply_overrides",
    "auto_capable_options",
    "auto_options",
    "build_parser",
    "check_command_line",
    "check_option_values",
    "check_group_layout",
    "command_options",
    "declare_env_options",
    "declare_options",
    "env_defaults_preset",
    "group_owner",
    "init_from_model_options",
    "load_builtin_algorithms",
    "load_builtin_envs",
    "load_preset",
    "load_saved_config",
    "option",
    "option_table",
    "parse_config",
    "preset_help",
    "resolve_preset",
    "save_config",
    "shipped_presets",
    "validate",
]
