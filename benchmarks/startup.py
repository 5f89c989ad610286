"""What a short command costs beyond its work: a run's start (command to first trained env step) and its end (the
last env step to the end of its output), this tree against a git revision, in one invocation.

    python -m benchmarks.startup --baseline_ref=HEAD~1 --repeats=5

Each repeat runs a short training run (``--train_args``, CartPole by default) and an evaluation of its checkpoint
from the baseline's checkout and from this tree, in turn, so both see the same drift of the machine. Reported per
side, the median over the repeats: ``train_s`` (command start to the end of its output, as a caller that reads it
waits), ``to_training_s`` (to the status line of the first trained env steps), ``evaluate_s``, and the CPU seconds
(user and system) of each command's processes that were waited for (``train_cpu_s``, ``evaluate_cpu_s``: what the
command takes from other work on a loaded machine); and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.throughput import PACKAGE_LINKS, checkout_of

RESULTS = Path(__file__).resolve().parent / "results" / "startup"
TRAIN_ARGS = "--env=CartPole-v1 --train_for_env_steps=4096"


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], source: Path | None) -> tuple[float, float | None, float]:
    """Seconds to the end of the command's output, to its first status line that shows trained env steps, and the
    CPU seconds of its processes (those reaped by the command's tree: its components through the fork server)."""
    env = os.environ if source is None else {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)}
    started, first_steps, cpu_before = time.perf_counter(), None, children_cpu_seconds()
    # In the checkout's directory: ``-m`` puts the working directory first on the path, before PYTHONPATH.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=source
    )
    output = []
    for line in process.stdout:
        output.append(line)
        if first_steps is None and "FPS" in line and line.split("steps")[1].split()[0] != "0":
            first_steps = time.perf_counter() - started
    ended = time.perf_counter() - started
    if process.wait() != 0:
        sys.exit(f"benchmarks.startup: {' '.join(command)} failed:\n{''.join(output[-20:])}")
    return ended, first_steps, children_cpu_seconds() - cpu_before


def one_side(source: Path | None, train_args: list[str], train_dir: Path) -> dict[str, float]:
    python = [sys.executable, "-m"]
    common = [f"--train_dir={train_dir}", "--experiment=startup"]
    train_s, to_training_s, train_cpu_s = timed(
        [*python, "sfengine.train", *train_args, *common, "--restart_behavior=overwrite"], source
    )
    evaluate_s, _, evaluate_cpu_s = timed([*python, "sfengine.evaluate", *common, "--eval_episodes=8"], source)
    return {
        "train_s": train_s,
        "to_training_s": to_training_s,
        "evaluate_s": evaluate_s,
        "train_cpu_s": train_cpu_s,
        "evaluate_cpu_s": evaluate_cpu_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline_ref", required=True, help="the git revision to compare this tree with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train_args", default=TRAIN_ARGS, help="the short run's options, space-separated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    train_args = args.train_args.split()
    runs: dict[str, list[dict]] = {"baseline": [], "this tree": []}
    with checkout_of(args.baseline_ref) as baseline, tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            runs["baseline"].append(one_side(baseline, train_args, Path(tmp) / "baseline"))
            runs["this tree"].append(one_side(None, train_args, Path(tmp) / "tree"))
    medians = {
        side: {key: round(statistics.median(run[key] for run in measured), 2) for key in measured[0]}
        for side, measured in runs.items()
    }
    ratios = {key: round(medians["this tree"][key] / medians["baseline"][key], 2) for key in medians["baseline"]}
    commit = ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", args.baseline_ref]
    report = {
        "baseline_ref": subprocess.run(commit, capture_output=True, text=True).stdout.strip() or args.baseline_ref,
        "train_args": train_args,
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "date": time.strftime("%Y-%m-%d"),
        "median": medians,
        "ratio_this_tree_to_baseline": ratios,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(report, indent=2) + "\n")
    keys = ("train_s", "to_training_s", "evaluate_s", "train_cpu_s", "evaluate_cpu_s")
    lines = [
        "| | train (to the end of its output) | to the first trained steps | evaluate | train CPU | evaluate CPU |",
        "|---|---|---|---|---|---|",
    ]
    for side, row in medians.items():
        lines.append(f"| {side} | " + " | ".join(f"{row[key]:.2f} s" for key in keys) + " |")
    lines.append("| ratio | " + " | ".join(str(ratios[key]) for key in keys) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
