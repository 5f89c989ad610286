"""Options from files: YAML presets (``--cfg``, and the env's own preset in ``configs/``), a run's saved
``config.json`` (resume, ``sfengine.evaluate``, ``--init_from``)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from sfengine.config.core import AUTO, Config, option_table
from sfengine.config.options import ConfigError

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs"


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


def preset_purpose(path: Path) -> str:
    """What a preset is for: the first sentence of the comment that opens it (``--help`` and docs/ show it)."""
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    return " ".join(comment).split(". ")[0].rstrip(".")


def preset_help() -> str:
    """``--cfg``'s help: each shipped preset with what it is for (``preset_purpose``). An env's own defaults
    (``configs/<env>.yaml``, the LIBERO suites) apply by themselves and are only named."""
    described, env_defaults = [], []
    for path in sorted(shipped_presets().glob("*.yaml")):
        purpose = preset_purpose(path)
        if purpose.startswith("Defaults of --env="):
            env_defaults.append(path.stem)
        else:
            described.append(f"{path.stem}: {purpose}")
    return (
        "YAML preset: a path, or the name of one shipped in configs/: "
        + "; ".join(described)
        + (f". Applied by themselves with their --env: {', '.join(env_defaults)}" if env_defaults else "")
    )


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


# Options saved in every run's config.json until 2026-11-26, then moved to sfengine.evaluate's own group: a run
# does not keep them (an evaluation takes them from its command line).
COMMAND_OPTIONS = ("checkpoint", "episodes_per_init", "eval_tasks", "eval_init_states", "video_per_task", "video_size")


def load_saved_config(path: Path) -> dict[str, Any]:
    try:
        nested = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is corrupt ({exc}); fix it or use --restart_behavior=restart") from None
    return saved_options(nested, path)


def saved_options(nested: Any, where: Path | str) -> dict[str, Any]:
    """The options of a run's saved config (config.json's groups, or a copy of them), as this version has them."""
    try:
        flat = {name: value for group in nested.values() for name, value in group.items()}
    except AttributeError as exc:
        raise ConfigError(f"{where} is corrupt ({exc}); fix it or use --restart_behavior=restart") from None
    if "with_vtrace" in flat:  # written before --advantage existed
        flat["advantage"] = "vtrace" if flat.pop("with_vtrace") else "gae"
    # An option this version no longer has (written by an older or a trial version) cannot change what the run
    # does now: it is named and left out, where a user's preset or command line with it is an error.
    table = option_table()
    for name in COMMAND_OPTIONS:
        flat.pop(name, None)  # saved before they moved to their command's own options: nothing to warn about
    # What to do with an existing run is each invocation's own choice: a run once started with
    # --restart_behavior=restart resumes when started again without it.
    flat.pop("restart_behavior", None)
    retired = sorted(name for name in flat if name not in table)
    if retired:
        print(f"{where}: ignoring {', '.join(retired)}, which this version of sfengine does not have", file=sys.stderr)
    return {name: value for name, value in flat.items() if name in table}


def save_config(cfg: Config, path: Path) -> None:
    # An option still at auto (a run that sized nothing: sfengine.pretrain) is written as "auto", which loads back.
    data = {name: {k: "auto" if v is AUTO else v for k, v in group.items()} for name, group in cfg.to_dict().items()}
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # no empty config.json.tmp left behind
        raise
