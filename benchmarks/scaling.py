"""Scaling curves: the engine's sampling FPS as one option varies at a time around a base layout, on the
``synthetic`` env, whose cost per step is known.

    python -m benchmarks.scaling --seconds=10 --warmup=3

Sweeps (base: 2 ms a step, ``vector:64``, 2 workers x 8 envs, 2 splits): ``num_workers``,
``num_envs_per_worker``, ``worker_num_splits``, ``synthetic_step_ms`` and ``synthetic_obs``. Each point is one
sampling-only engine run (``benchmarks.throughput.run_engine``). Next to the FPS, "of ideal" is the FPS over
what the cores could do if they did nothing but step envs (cores x 1000 / step ms, capped by the envs that can
step at once). Writes ``benchmarks/results/scaling_synthetic.{json,png}``, the machine named on the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.throughput import RESULTS, run_engine

BASE = {
    "num_workers": 2,
    "num_envs_per_worker": 8,
    "worker_num_splits": 2,
    "synthetic_step_ms": 2.0,
    "synthetic_obs": "vector:64",
}
SWEEPS = {
    "num_workers": [1, 2, 3, 4],
    "num_envs_per_worker": [2, 4, 8, 16],
    "worker_num_splits": [1, 2, 4],
    "synthetic_step_ms": [0.5, 1.0, 2.0, 5.0],
    "synthetic_obs": ["vector:64", "image:42x42x3", "image:84x84x3"],
}


def ideal_fps(point: dict, cores: int) -> float:
    stepping_at_once = min(point["num_workers"], cores)
    return stepping_at_once * 1000.0 / point["synthetic_step_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--startup", type=float, default=30.0)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    curves: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="sfe_scaling_") as tmp:
        for option, values in SWEEPS.items():
            for value in values:
                point = {**BASE, option: value}
                train_args = ["--env=synthetic", "--batch_size=512", "--num_batches_per_epoch=1", "--rollout=32"]
                train_args += [f"--{name}={v}" for name, v in point.items()]
                row = run_engine(train_args, True, args, Path(tmp), experiment=f"{option}_{value}")
                fps = row.get("fps", 0.0)
                curves.setdefault(option, []).append(
                    {"value": value, "fps": fps, "of_ideal": round(fps / ideal_fps(point, cores), 3), **row}
                )
                print(f"{option}={value}: {fps:,.0f} FPS ({fps / ideal_fps(point, cores):.2f} of ideal)", flush=True)
    machine = f"{cores} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GB"
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine, "base": BASE, "curves": curves}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scaling_synthetic.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(curves, f"sfengine sampling on the synthetic env, base {BASE}; {machine}, {report['date']}")


def plot(curves: dict[str, list[dict]], title: str) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.6))
    for ax, (option, points) in zip(axes, curves.items()):
        labels = [str(p["value"]) for p in points]
        ax.plot(labels, [p["fps"] for p in points], marker="o")
        for label, p in zip(labels, points):
            ax.annotate(
                f"{p['of_ideal']:.2f}", (label, p["fps"]), textcoords="offset points", xytext=(0, 6), ha="center"
            )
        ax.set_xlabel(option)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("FPS (labels: fraction of ideal)")
    figure.suptitle(textwrap.fill(title, 180), fontsize=8)
    figure.tight_layout()
    figure.savefig(RESULTS / "scaling_synthetic.png", dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
