"""The command line: a parser grouped by owner (the engine's groups, then each env's and algorithm's), a
command's own options (``sfengine.pretrain``'s, say), and ``parse_config``, which layers defaults, the env's
preset or the saved run, ``--init_from``'s architecture, ``--cfg`` and the command line, then validates."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import sys
from typing import Any

from sfengine.config.core import (
    DECLARED_GROUPS,
    GROUPS,
    Config,
    apply_overrides,
    group_owner,
    option_table,
)
from sfengine.config.files import (
    env_defaults_preset,
    init_from_model_options,
    load_preset,
    load_saved_config,
    preset_help,
)
from sfengine.config.options import ConfigError, OptionInfo, _coerce, _options_of, _type_name
from sfengine.config.validation import validate

TRAIN_DESCRIPTION = (
    "Train an RL agent with sfengine. Options are grouped below; every one can also be set in a YAML preset given "
    "with --cfg."
)


class CommandLineParser(argparse.ArgumentParser):
    """argparse that takes whole option names only (``--num_worker`` is not ``--num_workers``) and reports a
    mistake as one line, a ConfigError naming the nearest option, instead of the usage."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        prefix = "unrecognized arguments:"
        if message.startswith(prefix):
            known = [option for action in self._actions for option in action.option_strings]
            words = []
            for word in message[len(prefix) :].split():
                close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.75)
                words.append(f"{word} (did you mean {close[0]}?)" if close else word)
            message = f"unknown option{'s' if len(words) > 1 else ''} {', '.join(words)}"
        raise ConfigError(f"{message}; see --help")


def build_parser(
    prog: str = "python -m sfengine.train", description: str = TRAIN_DESCRIPTION
) -> argparse.ArgumentParser:
    parser = CommandLineParser(prog=prog, description=description)
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
            help=metadata["help"]
            + default_note(metadata["help"], info.default)
            + (f"; one of {', '.join(metadata['choices'])}" if metadata["choices"] else "")
            + ("; auto: chosen from the cores and memory at start" if metadata["auto"] else ""),
        )


def default_note(help_text: str, default: Any) -> str:
    """What ``--help`` adds after an option's help: its default, unless the help says it (what unset means)."""
    if "(default:" in help_text or "Default:" in help_text:
        return ""
    return f" (default: {'none' if default in ('', None) else default})"


def command_options(options_cls: type, argv: list[str]) -> tuple[Any, list[str]]:
    """The options of a command's own dataclass (``group`` names its ``--help`` group; sfengine.pretrain's, say),
    taken out of ``argv``: the filled-in dataclass, validated by its ``validate()`` if it has one, and the rest of
    ``argv``, for ``parse_config``. Add the group to the command's parser with ``add_command_options`` for --help."""
    options = _options_of({options_cls.group: options_cls})
    parser = CommandLineParser(add_help=False)
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


def check_command_line(argv: list[str], command: str, parser: argparse.ArgumentParser | None = None) -> None:
    """Answer ``--help`` (exit 0) and a misspelt or malformed option (its one line, exit 2) from the option names
    alone, before a command imports the engine and torch, which takes seconds: a command's ``__main__`` calls it
    first, with its own ``parser`` where it has one (sfengine.train's by default). Values, presets and saved
    configs are read later by ``parse_config``."""
    try:
        (parser or build_parser(f"python -m {command}")).parse_args(argv)
    except ConfigError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def check_option_values(argv: list[str], command: str) -> None:
    """Answer a value that breaks a rule (``--replay_size=-1``), a preset or saved run that does not fit, with its
    one line and exit 2, before ``python -m sfengine.train`` imports torch: ``parse_config`` reads no more than the
    option declarations, the presets and config files, and the algorithms' rules, none of which needs it. Anything
    else that fails here is left to the command's ``main``, which reads the options again and reports it, and what
    the reading prints on the way (a saved run's retired options) is printed there, once (here only before its
    error)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            parse_config(argv)
    except ConfigError as exc:
        print(f"{printed.getvalue()}{command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception:  # noqa: BLE001  (main() meets it again, where the command reports its failures)
        return


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
    asked_from = {source for _, source in layers}
    cfg = _layered(layers)
    saved = cfg.experiment_dir / "config.json"
    env_defaults = None
    if cfg.run.restart_behavior == "resume" and saved.is_file():
        # A resumed run keeps its saved settings; the preset and the command line still win.
        saved_options = load_saved_config(saved)
        trained_with = saved_options.get("algo", cfg.learner.algo)
        asked = any("algo" in overrides for overrides, _ in layers)  # (not given: the saved one)
        if asked and trained_with != cfg.learner.algo:  # before its rules meet the saved run's options
            raise ConfigError(
                f"'{cfg.run.experiment}' was trained with --algo={trained_with}, and this run asks --algo="
                f"{cfg.learner.algo}: resume it with --algo={trained_with}, or start a new --experiment (--init_from="
                "its checkpoint to start from its policy)"
            )
        layers.insert(0, (saved_options, str(saved)))
        given = layers[1:]  # (files written before envs declared their options hold every env's: not an error)
    else:
        env_defaults = env_defaults_preset(cfg.env.env)
        if env_defaults is not None:
            layers.insert(0, (load_preset(str(env_defaults)), str(env_defaults)))
        if inherited := init_from_model_options(cfg.run.init_from, cfg.run.train_dir):
            # Above the env's defaults, below --cfg and the command line: the network the weights were trained in.
            layers.insert(1 if env_defaults is not None else 0, inherited)
        given = layers
    # An algorithm's own defaults outrank the env's (those are PPO's: --num_epochs=4 would stop --algo=sac).
    chosen = [layer for layer in layers if env_defaults is None or layer[1] != str(env_defaults)]
    cfg = _layered(layers)
    cfg.chosen = {name for overrides, _ in layers for name in overrides}
    cfg.asked = {name for overrides, source in layers if source in asked_from for name in overrides}
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
    from sfengine.algorithms import algorithm_for

    algorithm = algorithm_for(cfg)
    if algorithm.defaults is not None:
        algorithm.defaults(cfg, {name for overrides, _ in chosen for name in overrides})
    validate(cfg)
    return cfg


def _layered(layers: list[tuple[dict[str, Any], str]]) -> Config:
    cfg = Config()
    for overrides, source in layers:
        apply_overrides(cfg, overrides, source)
    return cfg
