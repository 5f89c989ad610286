"""Each clip mode alone on CartPole-v1, asynchronous: does it reach 400 within 300k env steps, and stay there?

    python -m benchmarks.clip_modes                                   # the four modes with their own target KL
    python -m benchmarks.clip_modes --modes=cispo --seeds=1,2,3 --extra="--target_kl=0.02" --label=K0.02

Every run is ``python -m sfengine.train --cfg=cartpole --clip_mode=<mode> --seed=<s> <extra>``. Per run: the env
step where the mean return (last 100 episodes) first reached 400, its lowest value after that, the final return
and the largest approximate KL of an update. Results: ``<out>/<label>.json`` (every run with its curve),
``<out>/summary.md`` (one row per mode and label, over every file in ``<out>``) and ``<out>/<label>.png``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_record import write_json
from sfengine.reporting.events import read_scalars

RETURN_TAG = "episodes/episode_return_mean"
COLORS = {
    "ppo_clip": "tab:gray",
    "soft_clip": "tab:blue",
    "sapo": "tab:green",
    "ce_gppo": "tab:red",
    "cispo": "tab:purple",
}


def run(mode: str, seed: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="sfengine_clip_modes_") as train_dir:
        command = [sys.executable, "-m", "sfengine.train", "--cfg=cartpole", f"--clip_mode={mode}", f"--seed={seed}"]
        command += [f"--train_dir={train_dir}", "--experiment=run", "--report_every_sec=0.5", *extra]
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return {"mode": mode, "seed": seed, "error": done.stderr.strip().splitlines()[-1:]}
        scalars = read_scalars(Path(train_dir) / "run")
        curve = [(point.step, point.value) for point in scalars[RETURN_TAG]]
        kl = [point.value for point in scalars.get("train/approx_kl", [])]
    cross = next((step for step, value in curve if value >= 400), None)
    after = [value for step, value in curve if cross is not None and step >= cross]
    return {
        "mode": mode,
        "seed": seed,
        "cross_step": cross,
        "min_after_cross": min(after) if after else None,
        "final": curve[-1][1],
        "max_approx_kl": max(kl, default=None),
        "wall_sec": round(time.time() - started, 1),
        "curve": curve,
    }


def summary_rows(out: Path) -> list[str]:
    rows = [
        "| label | mode | crossed 400 | steps to cross (k) | final return | lowest after crossing |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(out.glob("*.json")):
        runs = json.loads(path.read_text())["runs"]
        for mode in dict.fromkeys(run["mode"] for run in runs):
            mine = sorted((r for r in runs if r["mode"] == mode and "error" not in r), key=lambda r: r["seed"])
            crossed = [r for r in mine if r["cross_step"] is not None]
            steps = ", ".join(f"{r['cross_step'] / 1000:.0f}" if r["cross_step"] else "-" for r in mine)
            finals = ", ".join(f"{r['final']:.0f}" for r in mine)
            lows = ", ".join(f"{r['min_after_cross']:.0f}" if r["min_after_cross"] else "-" for r in mine)
            rows.append(f"| {path.stem} | {mode} | {len(crossed)}/{len(mine)} | {steps} | {finals} | {lows} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="soft_clip,sapo,ce_gppo,cispo")
    parser.add_argument("--seeds", default="1,2,3,4,5,6,7,8,9,10")
    parser.add_argument("--extra", default="", help="further sfengine options for every run")
    parser.add_argument("--label", default="own_target_kl", help="the name of this set of runs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/clip_modes"))
    args = parser.parse_args()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for mode in args.modes.split(","):
            runs.append(run(mode, seed, shlex.split(args.extra)))
            print({k: v for k, v in runs[-1].items() if k != "curve"}, flush=True)
            write_json(args.out / f"{args.label}.json", {"extra": args.extra, "runs": runs})
    write_plot(args.out, args.label, runs)
    (args.out / "summary.md").write_text("\n".join(summary_rows(args.out)) + "\n")
    print((args.out / "summary.md").read_text())


def write_plot(out: Path, label: str, runs: list[dict]) -> None:
    """One line per run, coloured by mode: the mean return against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    named = set()
    for r in (r for r in runs if "curve" in r):
        steps, values = zip(*r["curve"])
        name = None if r["mode"] in named else r["mode"]
        named.add(r["mode"])
        axes.plot(steps, values, color=COLORS.get(r["mode"]), alpha=0.6, label=name)
    axes.axhline(400, color="black", linewidth=0.8, linestyle="--")
    axes.set(xlabel="env steps", ylabel="mean return (last 100 episodes)", title=f"CartPole-v1, asynchronous: {label}")
    axes.legend()
    figure.savefig(out / f"{label}.png", dpi=100, bbox_inches="tight")
    plt.close(figure)


if __name__ == "__main__":
    main()
