"""Checkpoints: written atomically, loaded with ``weights_only=True``, a failed load is an error.

A checkpoint holds only tensors and plain Python types (ints, floats, strings, dicts), so the safe loader
accepts it and a resumed run never silently falls back to step 0.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path

import torch

CHECKPOINT_PATTERN = re.compile(r"^checkpoint_(\d{9})_(\d+)\.pt$")
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used. The message is one line that names the file and the fix."""


def checkpoint_dir(experiment_dir: Path) -> Path:
    return Path(experiment_dir) / "checkpoints"


def list_checkpoints(experiment_dir: Path) -> list[Path]:
    """Checkpoints of an experiment, oldest first (ordered by policy version)."""
    directory = checkpoint_dir(experiment_dir)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


class CheckpointSaveError(OSError):
    """A checkpoint that could not be written (disk full, no permission): the older ones are untouched."""


def write_failure(exc: BaseException, directory: Path) -> str:
    """Why a write failed, in words: a full disk by name (torch reports one as "enforce fail at
    inline_container.cc ... unexpected pos"), else the error's first line."""
    try:
        free = shutil.disk_usage(directory if directory.is_dir() else directory.parent).free
    except OSError:
        free = None
    if getattr(exc, "errno", None) == errno.ENOSPC or (free is not None and free < 2**20):
        return "No space left on device" + (f" ({free / 2**20:.1f} MiB free)" if free is not None else "")
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def save_checkpoint(experiment_dir: Path, state: dict, keep: int) -> Path:
    """Write ``state`` as checkpoint_<version>_<env_steps>.pt through a temp file and a rename; keep the newest.
    A write that fails removes its temp file and raises CheckpointSaveError; no older checkpoint is deleted."""
    directory = checkpoint_dir(experiment_dir)
    path = directory / f"checkpoint_{state['policy_version']:09d}_{state['env_steps']}.pt"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = write_failure(exc, directory)
        raise CheckpointSaveError(f"cannot write checkpoint {path.name} in {directory} ({reason})") from exc
    for old in list_checkpoints(experiment_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def find_checkpoint(source: str, train_dir: str, option: str) -> Path:
    """The checkpoint an option names (``--init_from``, ``--residual_over``): a checkpoint file, or the latest of an
    experiment (a directory, or a name in ``train_dir``)."""
    path = Path(source)
    if path.is_file():
        return path
    experiment_dir = path if path.is_dir() else Path(train_dir) / source
    checkpoints = list_checkpoints(experiment_dir)
    if not checkpoints:
        raise CheckpointError(
            f"{option}={source}: no checkpoint file, and no experiment with checkpoints at {experiment_dir}; "
            "give a checkpoint path, or an experiment name in --train_dir"
        )
    return checkpoints[-1]


def load_checkpoint(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (any failure to read the file means the same to the user)
        raise CheckpointError(
            f"cannot load checkpoint {path} ({read_failure(exc)}); delete it to fall back to an older one, or start "
            "over with --restart_behavior=restart"
        ) from None
    required = ("format_version", "model", "optimizer", "env_steps", "policy_version")
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise CheckpointError(f"checkpoint {path} is incomplete (needs {', '.join(required)}); delete it")
    if state["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format {state['format_version']}, this sfengine reads {FORMAT_VERSION}"
        )
    for name, tensor in state["model"].items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"checkpoint {path} holds NaN or infinite weights ({name}): the run that wrote it diverged, and "
                "nothing can be trained or evaluated from it; give an earlier checkpoint"
            )
    return state


def read_failure(exc: BaseException) -> str:
    """Why torch could not read a file, in a few words. torch's own text for a file that is no checkpoint advises
    loading it with weights_only=False, which runs whatever the file holds: not repeated here."""
    text = str(exc).strip()
    # (A file cut short inside its zip's entries fails a seek: EINVAL, not the zip reader's own message.)
    cut = isinstance(exc, EOFError) or (isinstance(exc, OSError) and exc.errno == errno.EINVAL)
    if "Weights only load failed" in text or "zip archive" in text or cut:
        return "not a checkpoint file: damaged, cut short, or never one"
    return text.splitlines()[0] if text else type(exc).__name__


def load_latest_checkpoint(experiment_dir: Path) -> dict | None:
    checkpoints = list_checkpoints(experiment_dir)
    return load_checkpoint(checkpoints[-1]) if checkpoints else None
