"""Critic-free group advantages against PPO with a critic, side by side on one sparse-success multi-task env.

    python -m benchmarks.group_advantages                       # 4 variants x seeds 1,2,3, 150k env steps each
    python -m benchmarks.group_advantages --variants=rloo,grpo --seeds=1 --env_steps=100000

Variants, all on ``multitask_reach`` (8 tasks x 10 init states, success 0/1, about 17% at random) with the same
seeds, env steps, workers and batch sizes; the group ones compare ``--task_group_size`` episodes of one (task,
init state) by their success:
- ``ppo_gae``: PPO with a critic and GAE (the defaults);
- ``rloo``: ``--advantage=rloo``, no critic;
- ``grpo``: ``--advantage=grpo``, no critic;
- ``rloo_dynamic``: rloo with ``--dynamic_sampling`` (groups whose episodes all succeed or all fail are dropped);
- ``rloo_episode``: rloo with ``--group_loss_weighting=episode`` (every episode weighs the same, whatever its length).

Each run leaves ``<out>/<variant>_seed<k>.json`` (its success curve from TensorBoard, and the learner's time per
env step). The summary (``<out>/summary.{json,md}``) gives, per variant, the final success rate over seeds, the env
steps at which the success rate (mean of the last 100 episodes) first reaches ``--target``, and the learner's time
per sample; ``<out>/success.png`` plots every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_record import write_json
from sfengine.plot import Series, plot_metrics
from sfengine.reporting.events import read_scalars

GROUP = ["--task_group_size=8", "--group_outcome=success"]
VARIANTS = {
    "ppo_gae": [],
    "rloo": ["--advantage=rloo", *GROUP],
    "grpo": ["--advantage=grpo", *GROUP],
    "rloo_dynamic": ["--advantage=rloo", "--dynamic_sampling=true", *GROUP],
    "rloo_episode": ["--advantage=rloo", "--group_loss_weighting=episode", *GROUP],
}
COLORS = {
    "ppo_gae": "tab:blue",
    "rloo": "tab:orange",
    "grpo": "tab:green",
    "rloo_dynamic": "tab:red",
    "rloo_episode": "tab:purple",
}
SUCCESS_TAG = "episodes/success_rate"


def run_variant(variant: str, seed: int, env_steps: int, out: Path, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="sfengine_groups_") as train_dir:
        experiment = f"{variant}_seed{seed}"
        command = [sys.executable, "-m", "sfengine.train", "--env=multitask_reach", f"--seed={seed}"]
        command += [f"--train_for_env_steps={env_steps}", f"--train_dir={train_dir}", f"--experiment={experiment}"]
        command += ["--report_every_sec=1", "--restart_behavior=overwrite", *VARIANTS[variant], *extra]
        print(" ".join(command), flush=True)
        started = time.time()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads((Path(train_dir) / experiment / "summary.json").read_text())
        curves = read_scalars(Path(train_dir) / experiment)
    learner_busy = statistics.fmean(p.value for p in curves["perf/time_learner"])
    record = {
        "variant": variant,
        "seed": seed,
        "env_steps": summary["env_steps"],
        "wall_sec": summary["wall_seconds"],
        "final_success": summary["success_rate"],
        # The learner's share of wall time, spread over the env steps it consumed.
        "learner_us_per_env_step": round(1e6 * learner_busy * summary["wall_seconds"] / summary["env_steps"], 2),
        "groups_dropped_fraction": statistics.fmean(p.value for p in curves.get("train/groups_dropped_fraction", []))
        if curves.get("train/groups_dropped_fraction")
        else None,
        "curve": [[p.step, round(p.wall_time - started, 3), p.value] for p in curves[SUCCESS_TAG]],
    }
    write_json(out, record)
    print(f"{variant} seed {seed}: success {record['final_success']:.2f} in {record['wall_sec']:.0f} s", flush=True)


def steps_to_reach(curve: list[list[float]], target: float) -> int | None:
    return next((int(step) for step, _, value in curve if value >= target), None)


def aggregate(out_dir: Path, target: float) -> dict:
    runs: dict[str, list[dict]] = {}
    for path in sorted(out_dir.glob("*_seed*.json")):
        run = json.loads(path.read_text())
        runs.setdefault(run["variant"], []).append(run)
    table = {}
    for variant, variant_runs in runs.items():
        reached = [steps_to_reach(run["curve"], target) for run in variant_runs]
        table[variant] = {
            "seeds": [run["seed"] for run in variant_runs],
            "env_steps": min(run["env_steps"] for run in variant_runs),
            "final_success_mean": statistics.fmean(run["final_success"] for run in variant_runs),
            "final_success_std": statistics.pstdev(run["final_success"] for run in variant_runs),
            "steps_to_target": reached,
            "steps_to_target_mean": statistics.fmean(reached) if None not in reached else None,
            "learner_us_per_env_step": statistics.fmean(run["learner_us_per_env_step"] for run in variant_runs),
            "groups_dropped_fraction": variant_runs[0]["groups_dropped_fraction"],
        }
    return table


def markdown(table: dict, target: float) -> str:
    lines = [
        f"| variant | seeds | final success, mean ± std | env steps to success {target} (per seed) | learner us per env step |",
        "|---|---|---|---|---|",
    ]
    for variant, row in table.items():
        reached = ", ".join("-" if steps is None else f"{steps:,}" for steps in row["steps_to_target"])
        lines.append(
            f"| {variant} | {len(row['seeds'])} | {row['final_success_mean']:.2f} ± {row['final_success_std']:.2f} | "
            f"{reached} | {row['learner_us_per_env_step']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(out_dir: Path, target: float) -> Path:
    lines, labelled = [], set()
    for path in sorted(out_dir.glob("*_seed*.json")):
        run = json.loads(path.read_text())
        steps, seconds, values = (list(column) for column in zip(*run["curve"]))
        label = None if run["variant"] in labelled else run["variant"]
        labelled.add(run["variant"])
        lines.append(Series(label, steps, seconds, values, COLORS.get(run["variant"])))
    name = "success rate (last 100 episodes)"
    title = "multitask_reach: PPO with a critic against critic-free group advantages, one line per seed"
    return plot_metrics({name: lines}, out_dir / "success.png", title, references={name: [("target", target)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--env_steps", type=int, default=150_000)
    parser.add_argument("--target", type=float, default=0.9, help="success rate whose env steps are reported")
    parser.add_argument("--out", default="benchmarks/results/group_advantages")
    parser.add_argument("--sfengine_args", default="", help="extra options for every variant, space-separated")
    args = parser.parse_args()
    out_dir = Path(args.out)
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {variant!r}; use {', '.join(VARIANTS)}")
        for seed in (int(s) for s in args.seeds.split(",")):
            run_variant(
                variant, seed, args.env_steps, out_dir / f"{variant}_seed{seed}.json", args.sfengine_args.split()
            )
    table = aggregate(out_dir, args.target)
    write_json(out_dir / "summary.json", table)
    (out_dir / "summary.md").write_text(markdown(table, args.target))
    plot(out_dir, args.target)
    print(markdown(table, args.target))


if __name__ == "__main__":
    main()
