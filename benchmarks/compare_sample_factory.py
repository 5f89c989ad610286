"""sfengine vs Sample Factory 2.1.1 on CartPole-v1, side by side in one invocation.

    python -m benchmarks.compare_sample_factory --seconds=30 --sf_python=/path/to/sf-venv/bin/python

For each setting (num_workers=2, num_envs_per_worker=8, worker_num_splits 1 and 2; async, serial and
synchronous modes) it trains each engine for the same wall time with the same PPO sizes (rollout 32,
batch 1024, one epoch of one minibatch, MLP 64-64), alternating engines so that both see the same machine
state. Reported FPS is steady-state: env steps between the first and the last training batch, over that time.
Peak RSS is summed over each run's whole process tree.

Sample Factory needs its own venv (see SAMPLE_FACTORY.md); without ``--sf_python`` only sfengine runs.
Writes ``benchmarks/results/sample_factory_cartpole.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.process_tree import run_and_measure

RESULTS = Path(__file__).resolve().parent / "results"
SF_SCRIPT = Path(__file__).resolve().parent / "sample_factory_baseline.py"

MODES = {
    "async": {"serial_mode": 0, "async_rl": 1},
    "serial": {"serial_mode": 1, "async_rl": 1},
    "sync": {"serial_mode": 0, "async_rl": 0},
}


def run_sfengine(setting: dict, seconds: float, train_dir: Path) -> dict:
    name = f"sfe_{setting['mode']}_{setting['worker_num_splits']}"
    command = [
        sys.executable,
        "-m",
        "sfengine.train",
        "--env=CartPole-v1",
        f"--train_dir={train_dir}",
        f"--experiment={name}",
        "--restart_behavior=overwrite",
        f"--num_workers={setting['num_workers']}",
        f"--num_envs_per_worker={setting['num_envs_per_worker']}",
        f"--worker_num_splits={setting['worker_num_splits']}",
        f"--serial_mode={MODES[setting['mode']]['serial_mode']}",
        f"--async_rl={MODES[setting['mode']]['async_rl']}",
        "--rollout=32",
        "--batch_size=1024",
        "--num_batches_per_epoch=1",
        "--num_epochs=1",
        "--hidden_sizes=64,64",
        "--train_for_env_steps=1000000000",
        f"--train_for_seconds={seconds}",
        "--report_every_sec=5",
    ]
    run = run_and_measure(command, timeout=seconds + 180)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    summary = json.loads((train_dir / name / "summary.json").read_text())
    return {
        "fps": summary["fps_steady"],
        "env_steps": summary["env_steps"],
        "episode_return_mean": summary["episode_return_mean"],
        "peak_rss_mb": round(run.peak_rss_mb),
        "cpu_percent": round(run.cpu_percent),
    }


def run_sample_factory(sf_python: str, setting: dict, seconds: float, train_dir: Path) -> dict:
    command = [
        sf_python,
        str(SF_SCRIPT),
        f"--num_workers={setting['num_workers']}",
        f"--num_envs_per_worker={setting['num_envs_per_worker']}",
        f"--worker_num_splits={setting['worker_num_splits']}",
        f"--serial_mode={MODES[setting['mode']]['serial_mode']}",
        f"--async_rl={MODES[setting['mode']]['async_rl']}",
        f"--seconds={seconds}",
        f"--train_dir={train_dir}",
    ]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    run = run_and_measure(command, timeout=seconds + 240, env=env)
    lines = [line for line in run.stdout.strip().splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        tail = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or [f"exit {run.returncode}"]
        return {"error": tail[0][:200]}
    result = json.loads(lines[-1])
    return {
        "fps": round(result["fps"], 1),
        "env_steps": result["env_steps"],
        "peak_rss_mb": round(run.peak_rss_mb),
        "cpu_percent": round(run.cpu_percent),
    }


def fmt_fps(result: dict) -> str:
    if "fps" in result and result["fps"] is not None:
        return f"{result['fps']:,.0f}"
    return result.get("error", "-")


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| mode | splits | sfengine FPS | Sample Factory FPS | ratio | sfengine return | sfengine / SF peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, theirs = row["sfengine"], row.get("sample_factory", {})
        ratio = f"{ours['fps'] / theirs['fps']:.2f}" if ours.get("fps") and theirs.get("fps") else "-"
        lines.append(
            f"| {row['mode']} | {row['worker_num_splits']} | {fmt_fps(ours)} | {fmt_fps(theirs)} | {ratio} | "
            f"{ours.get('episode_return_mean', '-')} | {ours.get('peak_rss_mb', '-')} / {theirs.get('peak_rss_mb', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="training wall time per engine and setting")
    parser.add_argument("--sf_python", default=None, help="python of a venv with sample-factory==2.1.1")
    parser.add_argument("--modes", default="async,serial,sync")
    parser.add_argument("--splits", default="1,2")
    parser.add_argument("--out", default=str(RESULTS / "sample_factory_cartpole"))
    parser.add_argument("--table_from", default=None, help="only print the table of an earlier JSON result")
    args = parser.parse_args()
    if args.table_from:
        print(markdown_table(json.loads(Path(args.table_from).read_text())["rows"]))
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            for splits in (int(s) for s in args.splits.split(",")):
                setting = {"mode": mode, "num_workers": 2, "num_envs_per_worker": 8, "worker_num_splits": splits}
                row = dict(setting)
                row["sfengine"] = run_sfengine(setting, args.seconds, Path(tmp) / "sfe")
                if args.sf_python:
                    row["sample_factory"] = run_sample_factory(args.sf_python, setting, args.seconds, Path(tmp) / "sf")
                print(json.dumps(row), flush=True)
                rows.append(row)
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "seconds_per_run": args.seconds,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown_table(rows) + "\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
