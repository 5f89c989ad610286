"""What a short command costs beyond its work: a run's start (command to first trained env step) and its end (the
last env step to the end of its output), this tree against a git revision, in one invocation.

    python -m benchmarks.startup --baseline_ref=HEAD~1 --repeats=5

Each repeat runs a short training run (``--train_args``, CartPole by default) and an evaluation of its checkpoint
from the baseline's checkout and from this tree, in turn, so both see the same drift of the machine. Reported per
side, the median over the repeats: ``train_s`` (command start to the end of its output, as a caller that reads it
waits), ``to_training_s`` (to the status line of the first trained env steps), ``evaluate_s``; and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.throughput import PACKAGE_LINKS, checkout_of

RESULTS = Path(__file__).resolve().parent / "results" / "startup"
TRAIN_ARGS = "--env=CartPole-v1 --train_for_env_steps=4096"


def timed(command: list[str], source: Path | None) -> tuple[float, float | None]:
    """Seconds to the end of the command's output, and to its first status line that shows trained env steps."""
    env = os.environ if source is None else {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)}
    started, first_steps = time.perf_counter(), None
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
    return ended, first_steps


def one_side(source: Path | None, train_args: list[str], train_dir: Path) -> dict[str, float]:
    python = [sys.executable, "-m"]
    common = [f"--train_dir={train_dir}", "--experiment=startup"]
    train_s, to_training_s = timed(
        [*python, "sfengine.train", *train_args, *common, "--restart_behavior=overwrite"], source
    )
    evaluate_s, _ = timed([*python, "sfengine.evaluate", *common, "--eval_episodes=8"], source)
    return {"train_s": train_s, "to_training_s": to_training_s, "evaluate_s": evaluate_s}


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
    lines = ["| | train (to the end of its output) | to the first trained steps | evaluate |", "|---|---|---|---|"]
    for side, row in medians.items():
        lines.append(f"| {side} | {row['train_s']:.2f} s | {row['to_training_s']:.2f} s | {row['evaluate_s']:.2f} s |")
    lines.append(f"| ratio | {ratios['train_s']} | {ratios['to_training_s']} | {ratios['evaluate_s']} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
