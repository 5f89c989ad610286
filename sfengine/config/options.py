"""The option mechanism: ``option()`` declares one option (default, help, choices, whether it takes ``auto``) as a
dataclass field; ``OptionInfo`` is what the parser knows of it; values from the command line, presets and saved
configs are coerced to the field's type here. It knows nothing of the engine's groups."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, get_type_hints


class ConfigError(ValueError):
    """A user-caused configuration problem. The message is one line that names the fix."""


class Auto:
    """The value of an option given as ``auto`` until ``sfengine.engine.sizing`` chooses it from the machine: a marker of
    its own type, which no number equals and no arithmetic takes (one copy, also across processes)."""

    _one: Auto | None = None

    def __new__(cls) -> Auto:
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __reduce__(self) -> tuple:
        return (Auto, ())

    def __repr__(self) -> str:
        return "auto"


AUTO = Auto()


def option(default: Any, help: str, choices: tuple | None = None, auto: bool = False) -> Any:
    """Declare one option: its default and its one line of help (the type comes from the annotation). With
    ``auto``, the option also takes the value ``auto``: chosen at start from the machine (``sfengine.engine.sizing``)."""
    metadata = {"help": help, "choices": choices, "auto": auto}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


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
            number = float(value)
            if math.isnan(number) or (math.isinf(number) and number != info.default):
                never = "; inf (never) is its default" if math.isinf(info.default) else ""
                raise ConfigError(f"--{name}={value!r} is not a finite number: give a finite value{never}")
            return number
        if text == "list":
            items = value if isinstance(value, list) else [v for v in str(value).replace(" ", "").split(",") if v]
            return [int(v) for v in items]
        return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}={value!r} is not a valid {text}") from None
