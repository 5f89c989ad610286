"""Learning before and after an engine change: the same presets and seeds trained from a revision and from this tree.

    python -m benchmarks.learning_before_after                       # cartpole, pendulum, halfcheetah; seeds 1-3
    python -m benchmarks.learning_before_after --presets=cartpole --seeds=1,2 --baseline_ref=HEAD~3

For each preset and seed, two runs of ``python -m sfengine.train --cfg=<preset> --seed=<seed>`` (the preset's own
``train_for_env_steps``), one after the other: "before" from a git worktree of ``--baseline_ref``
(``benchmarks.throughput.checkout_of``: its own engine, envs and presets), then "after" from this working tree.
Alternating seed by seed, both see the same drift of the machine. One training at a time.

Per run: the final return (the last point of the ``episodes/episode_return_mean`` curve, the mean of the last
stats window), the env steps, the wall seconds (the whole command, start-up included) and the curve. Per preset
and revision: the mean ± sample std (n-1) of the final returns over the seeds. Verdict rule: "within noise" when
|mean_after - mean_before| <= max(std_before, std_after), else "differs". A run that fails is recorded with its
error and left out of the means. Writes ``<out>/<preset>/<before|after>_seed<k>.json`` (one per run, as it ends),
``<out>/summary.json``, ``<out>/summary.md`` and ``<out>/<preset>.png`` (return against env steps and wall time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_record import write_json
from benchmarks.throughput import PACKAGE_LINKS, checkout_of
from sfengine.plot import Series, plot_metrics
from sfengine.reporting.events import read_scalars

RETURN_TAG = "episodes/episode_return_mean"
COLORS = {"before": "tab:blue", "after": "tab:orange"}
REPOSITORY = Path(__file__).resolve().parent.parent


def train(preset: str, seed: int, revision: str, source: Path | None, label: str) -> dict:
    """One training run through the CLI, from ``source`` (a checkout) or this working tree (None)."""
    with tempfile.TemporaryDirectory(prefix="sfe_before_after_") as train_dir:
        experiment = f"{preset}_{revision}_seed{seed}"
        command = [sys.executable, "-m", "sfengine.train", f"--cfg={preset}", f"--seed={seed}"]
        command += [f"--train_dir={train_dir}", f"--experiment={experiment}", "--restart_behavior=overwrite"]
        command += ["--report_every_sec=5"]
        env = None if source is None else {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)}
        print(f"[{label}] {' '.join(command)}", flush=True)
        started = time.time()
        run = subprocess.run(
            command, env=env, cwd=source or REPOSITORY, stdout=subprocess.DEVNULL, text=True, stderr=subprocess.PIPE
        )
        wall_sec = round(time.time() - started, 1)
        record = {"preset": preset, "revision": revision, "seed": seed, "wall_sec": wall_sec}
        if run.returncode != 0:
            tail = run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            return {**record, "error": tail[0][:300], "command": command}
        summary = json.loads((Path(train_dir) / experiment / "summary.json").read_text())
        points = read_scalars(Path(train_dir) / experiment).get(RETURN_TAG, [])
    if not points:
        return {**record, "error": f"no {RETURN_TAG} points", "command": command}
    return {
        **record,
        "env_steps": summary["env_steps"],
        "final_return": points[-1].value,
        "command": command,
        "curve": [[p.step, round(p.wall_time - started, 3), p.value] for p in points],
    }


def stats(runs: list[dict]) -> dict:
    returns = [run["final_return"] for run in runs if "final_return" in run]
    return {
        "final_returns": {run["seed"]: run.get("final_return") for run in runs},
        "mean": statistics.fmean(returns) if returns else None,
        "std": statistics.stdev(returns) if len(returns) > 1 else 0.0,
        "n": len(returns),
        "failed": {run["seed"]: run["error"] for run in runs if "error" in run},
        "wall_sec_mean": statistics.fmean(run["wall_sec"] for run in runs if "final_return" in run)
        if returns
        else None,
        "env_steps": [run.get("env_steps") for run in runs],
    }


def verdict(before: dict, after: dict) -> dict:
    if before["mean"] is None or after["mean"] is None:
        return {"difference": None, "threshold": None, "verdict": "no result"}
    difference, threshold = after["mean"] - before["mean"], max(before["std"], after["std"])
    return {
        "difference": difference,
        "threshold": threshold,
        "verdict": "within noise" if abs(difference) <= threshold else "differs",
    }


def markdown(summary: dict, baseline: str) -> str:
    lines = [
        "| preset | revision | n | final return mean ± std | per seed | wall s (mean) | env steps | "
        "after - before | max std | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, entry in summary.items():
        for side in ("before", "after"):
            row = entry[side]
            name = f"before ({baseline})" if side == "before" else "after (working tree)"
            seeds = ", ".join(f"{s}: {'failed' if v is None else f'{v:.1f}'}" for s, v in row["final_returns"].items())
            mean = "-" if row["mean"] is None else f"{row['mean']:.1f} ± {row['std']:.1f}"
            wall = "-" if row["wall_sec_mean"] is None else f"{row['wall_sec_mean']:.0f}"
            steps = "/".join(sorted({f"{s:,}" for s in row["env_steps"] if s is not None})) or "-"
            tail = ["", "", ""]
            if side == "after":
                v = entry["verdict"]
                diff = "-" if v["difference"] is None else f"{v['difference']:+.1f}"
                tail = [diff, "-" if v["threshold"] is None else f"{v['threshold']:.1f}", f"**{v['verdict']}**"]
            lines.append(
                f"| {preset} | {name} | {row['n']} | {mean} | {seeds} | {wall} | {steps} | {' | '.join(tail)} |"
            )
    failures = [
        f"- {p} {side} seed {s}: {e}"
        for p, entry in summary.items()
        for side in ("before", "after")
        for s, e in entry[side]["failed"].items()
    ]
    rule = "Verdict: within noise when |mean_after - mean_before| <= max(std_before, std_after) (sample std, n-1)."
    return "\n".join([*lines, "", rule, *([""] + failures if failures else [])]) + "\n"


def plot(preset: str, runs: list[dict], baseline: str, path: Path) -> None:
    lines, labelled = [], set()
    for run in runs:
        if run.get("curve"):
            side = "after" if run["revision"] == "working_tree" else "before"
            steps, seconds, returns = (list(column) for column in zip(*run["curve"]))
            label = None if side in labelled else (f"before ({baseline})" if side == "before" else "after (tree)")
            labelled.add(side)
            lines.append(Series(label, steps, seconds, returns, COLORS[side]))
    if lines:
        title = f"{preset}: one line per seed, before vs after"
        plot_metrics({"return (mean of last stats window)": lines}, path, title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="cartpole,pendulum,halfcheetah")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--baseline_ref", default="6b90fd2", help="the 'before' git revision")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/learning_before_after"))
    parser.add_argument(
        "--reuse_before",
        action="store_true",
        help="take the 'before' runs from <out> (a fixed revision's runs stay valid) and train only the tree's",
    )
    args = parser.parse_args()
    presets, seeds = args.presets.split(","), [int(s) for s in args.seeds.split(",")]
    head = subprocess.run(
        ["git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPOSITORY), "status", "--short", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.split("\n")
    started = time.monotonic()
    runs: dict[str, list[dict]] = {preset: [] for preset in presets}
    with contextlib.ExitStack() as stack:
        source = None if args.reuse_before else stack.enter_context(checkout_of(args.baseline_ref))
        for preset in presets:
            for seed in seeds:
                for side, revision, src in (("before", args.baseline_ref, source), ("after", "working_tree", None)):
                    saved = args.out / preset / f"{side}_seed{seed}.json"
                    if side == "before" and args.reuse_before:
                        runs[preset].append(json.loads(saved.read_text()))
                        continue
                    run = train(preset, seed, revision, src, side)
                    write_json(args.out / preset / f"{side}_seed{seed}.json", run)
                    runs[preset].append(run)
                    result = run.get("error") or f"return {run['final_return']:.1f}"
                    print(f"{preset} {side} seed {seed}: {result} in {run['wall_sec']:.0f} s", flush=True)
    summary = {}
    for preset, preset_runs in runs.items():
        before = stats([run for run in preset_runs if run["revision"] != "working_tree"])
        after = stats([run for run in preset_runs if run["revision"] == "working_tree"])
        summary[preset] = {"before": before, "after": after, "verdict": verdict(before, after)}
        plot(preset, preset_runs, args.baseline_ref, args.out / f"{preset}.png")
    report = {
        "baseline_ref": args.baseline_ref,
        "working_tree_head": head,
        "working_tree_modified_files": [line.strip() for line in dirty if line.strip()],
        "seeds": seeds,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "date": time.strftime("%Y-%m-%d"),
        "total_wall_sec": round(time.monotonic() - started, 1),
        "rule": "within noise iff |mean_after - mean_before| <= max(std_before, std_after), sample std (n-1)",
        "presets": summary,
    }
    write_json(args.out / "summary.json", report)
    table = markdown(summary, args.baseline_ref)
    (args.out / "summary.md").write_text(table)
    print(table + f"\ntotal wall time {report['total_wall_sec']:.0f} s on {os.cpu_count()} CPUs", flush=True)


if __name__ == "__main__":
    main()
