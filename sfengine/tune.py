"""``python -m sfengine.tune --env=<env> --budget_seconds=300``: the fastest worker layout for this machine.

    1. probe   build one env here: time its steps (wall and CPU time: does it compute or wait?) and the memory
               it adds
    2. prune   a CPU-bound env gains nothing from more rollout processes than cores; a layout whose envs do not
               fit in the memory available is never run
    3. search  short sampling-only runs (``--benchmark``) of the real engine, one option at a time: the number of
               rollout workers first, then envs per worker, then splits, then inference workers; each stage
               keeps the best so far
    4. report  a ranked table, and the winner written as a preset that ``--cfg`` loads
               (``configs/tuned_<env>.yaml``)

Options this command does not declare (``--synthetic_step_ms=5``, ``--libero_obs_mode=rgb``...) are passed to
every run, and go into the preset.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from sfengine.config import ConfigError, parse_config, shipped_presets
from sfengine.engine.sizing import Machine
from sfengine.env.registry import env_context, resolve_env_factory

WORKER_PROCESS_GB = 0.35  # a rollout worker process before its envs: Python, torch, the engine
MEMORY_HEADROOM = 0.85
PROBE_STEPS = 200
ENVS_PER_WORKER = (2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Layout:
    num_workers: int
    num_envs_per_worker: int
    worker_num_splits: int
    num_inference_workers: int

    def options(self) -> list[str]:
        return [f"--{name}={value}" for name, value in self.__dict__.items()]


@dataclass(frozen=True)
class EnvProbe:
    step_ms: float  # wall time of one step
    cpu_fraction: float  # CPU time / wall time of a step: about 1 for a simulator, about 0 for an env that waits
    env_gb: float  # resident memory one env adds


def probe_env(train_args: list[str]) -> EnvProbe:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_config([*train_args, f"--train_dir={tmp}"])
    me = psutil.Process()
    rss_before = me.memory_info().rss
    env = resolve_env_factory(cfg.env.env)(env_context(cfg, 0, 0, cfg.env.seed))
    env.reset(seed=cfg.env.seed)
    env.action_space.seed(cfg.env.seed)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(PROBE_STEPS):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    env_gb = max(me.memory_info().rss - rss_before, 0) / 2**30
    env.close()
    return EnvProbe(1000 * wall / PROBE_STEPS, min(cpu / max(wall, 1e-9), 1.0), env_gb)


def worker_counts(machine: Machine, probe: EnvProbe) -> list[int]:
    """Rollout worker counts worth trying: up to the cores for an env that computes, up to twice as many for one
    that mostly waits (its process sleeps while another steps)."""
    most = machine.cores if probe.cpu_fraction > 0.5 else 2 * machine.cores
    return list(range(1, most + 1))


def fits(layout: Layout, machine: Machine, probe: EnvProbe) -> bool:
    needed = layout.num_workers * (WORKER_PROCESS_GB + layout.num_envs_per_worker * probe.env_gb)
    return needed <= MEMORY_HEADROOM * machine.available_gb


def measure(layout: Layout, train_args: list[str], seconds: float, train_dir: Path) -> float:
    """Steady sampling FPS of a short ``--benchmark`` run (start-up excluded), 0 if it failed."""
    experiment = "tune_" + "_".join(str(v) for v in layout.__dict__.values())
    per_round = layout.num_workers * layout.num_envs_per_worker
    command = [sys.executable, "-m", "sfengine.train", *train_args, *layout.options()]
    # One training batch per round of rollouts: a slow env still delivers batches often enough to time.
    command += ["--rollout=16", f"--batch_size={16 * per_round}", "--num_batches_per_epoch=1", "--benchmark=true"]
    command += [f"--train_for_seconds={seconds}", "--train_for_env_steps=1000000000000", f"--train_dir={train_dir}"]
    command += [f"--experiment={experiment}", "--restart_behavior=overwrite", "--report_every_sec=1000"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    summary_path = train_dir / experiment / "summary.json"
    if result.returncode != 0 or not summary_path.is_file():
        return 0.0
    return float(json.loads(summary_path.read_text()).get("fps_steady") or 0.0)


def search(
    train_args: list[str], budget_seconds: float, machine: Machine, probe: EnvProbe
) -> list[tuple[Layout, float]]:
    """Coordinate search from a layout that is usually good: each stage varies one option around the best."""
    counts = worker_counts(machine, probe)
    best = Layout(machine.cores if machine.cores in counts else counts[-1], 8, 2, 1)
    stages = [
        lambda b: [Layout(n, b.num_envs_per_worker, b.worker_num_splits, 1) for n in counts],
        lambda b: [Layout(b.num_workers, e, b.worker_num_splits, 1) for e in ENVS_PER_WORKER],
        lambda b: [Layout(b.num_workers, b.num_envs_per_worker, s, 1) for s in (1, 2, 4)],
        lambda b: [Layout(b.num_workers, b.num_envs_per_worker, b.worker_num_splits, i) for i in (0, 1, 2)],
    ]
    planned = sum(len(counts) if i == 0 else 3 for i in range(len(stages)))
    seconds = max(budget_seconds / planned, 12.0)
    results: dict[Layout, float] = {}
    deadline = time.time() + budget_seconds
    with tempfile.TemporaryDirectory(prefix="sfengine_tune_") as tmp:
        for stage in stages:
            for layout in stage(best):
                valid = layout.num_envs_per_worker % layout.worker_num_splits == 0
                valid &= layout.num_inference_workers <= layout.num_workers
                if layout in results or not valid or not fits(layout, machine, probe) or time.time() > deadline:
                    continue
                results[layout] = measure(layout, train_args, seconds, Path(tmp))
                print(f"  {' '.join(layout.options())}: {results[layout]:,.0f} FPS", flush=True)
            best = max(results, key=results.get, default=best)
    return sorted(results.items(), key=lambda item: -item[1])


def write_preset(
    directory: Path, env_name: str, train_args: list[str], layout: Layout, fps: float, machine: Machine
) -> Path:
    path = directory / f"tuned_{re.sub(r'[^A-Za-z0-9_.-]', '_', env_name)}.yaml"
    lines = [
        f"# Written by python -m sfengine.tune on {time.strftime('%Y-%m-%d')}: {fps:,.0f} FPS sampling on "
        f"{machine.cores} cores, {machine.available_gb:.0f} GB available.",
        *(f"{arg[2:].split('=', 1)[0]}: {json.dumps(arg.split('=', 1)[1])}" for arg in train_args if "=" in arg),
        *(f"{name}: {value}" for name, value in layout.__dict__.items()),
    ]
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text("\n".join(lines) + "\n")
    scratch.replace(path)  # a preset is whole or absent, never half written
    return path


def writable_directory(directory: Path) -> None:
    """Create ``directory`` (--out) if it is missing, and check that a preset can be written there: found out
    before the search spends its budget, not after."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out={directory}: cannot create it ({exc.strerror}); give a writable directory") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--out={directory}: not writable; give a writable directory")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m sfengine.tune",
        description=__doc__.splitlines()[0],
        epilog="Any other option is a python -m sfengine.train option, given to every run and kept in the preset.",
    )
    parser.add_argument("--budget_seconds", type=float, default=300.0, help="wall time for all the short runs")
    parser.add_argument(
        "--out", type=Path, default=None, help="directory of the preset (default: the shipped configs/, for --cfg)"
    )
    args, train_args = parser.parse_known_args(argv)
    out = args.out or shipped_presets()
    try:
        writable_directory(out)
        with tempfile.TemporaryDirectory() as tmp:
            cfg = parse_config([*train_args, f"--train_dir={tmp}"])
        resolve_env_factory(cfg.env.env)
        probe = probe_env(train_args)
    except (ConfigError, ValueError) as exc:
        print(f"sfengine.tune: error: {exc}", file=sys.stderr)
        return 2
    machine = Machine.here()
    kind = "computes" if probe.cpu_fraction > 0.5 else "mostly waits"
    print(
        f"env {cfg.env.env}: {probe.step_ms:.3g} ms a step, {kind} (CPU {100 * probe.cpu_fraction:.0f}% of it), "
        f"{1024 * probe.env_gb:.0f} MB an env; {machine.cores} cores, {machine.available_gb:.1f} GB available",
        flush=True,
    )
    ranked = search(train_args, args.budget_seconds, machine, probe)
    if not ranked or ranked[0][1] <= 0:
        print("sfengine.tune: error: no layout ran; try the env with python -m sfengine.train first", file=sys.stderr)
        return 1
    print("\n| rank | num_workers | num_envs_per_worker | worker_num_splits | num_inference_workers | FPS |")
    print("|---|---|---|---|---|---|")
    for rank, (layout, fps) in enumerate(ranked, 1):
        print(f"| {rank} | {' | '.join(str(v) for v in layout.__dict__.values())} | {fps:,.0f} |")
    path = write_preset(out, cfg.env.env, train_args, *ranked[0], machine)
    print(f"\nbest: {' '.join(ranked[0][0].options())}; written to {path} (use it with --cfg={path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
