"""What one SAC gradient step costs on this machine: ``SACTrainer.step`` (a critic step, the actor and temperature
step, the target update) on minibatches from a filled replay, for the shapes of a few envs, the critic ensemble's
size and the learner's threads, all in one invocation.

    python -m benchmarks.sac_step                        # HalfCheetah-v5, Hopper-v5 and a 7-dim arm
    python -m benchmarks.sac_step --critics=2,10 --threads=1,2
    python -m benchmarks.sac_step --baseline_ref=HEAD~1 --critics=2   # this tree against a revision, row by row

The step time bounds the env steps per second a run can take at a replay ratio: ``1000 / (ms x replay_ratio)``.
With ``--baseline_ref`` every row is measured ``--repeats`` times on each side, alternating (a fresh process each,
the revision's from a git worktree of it), and the table gives both medians and their ratio. Results:
``<out>/sac_step.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

from benchmarks.throughput import PACKAGE_LINKS, checkout_of
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.algorithms.sac.trainer import SACTrainer
from sfengine.config import parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec

# (observation dimensions, action dimensions): the shapes a SAC run meets most.
SHAPES = {"HalfCheetah-v5": (17, 6), "Hopper-v5": (11, 3), "7-dim arm, 128 state dims": (128, 7)}


def step_milliseconds(obs_dim: int, action_dim: int, critics: int, threads: int, steps: int = 200) -> float:
    torch.set_num_threads(threads)
    cfg = parse_config(["--algo=sac", "--env=Pendulum-v1", "--rollout=32", "--learning_starts=0"])
    cfg.set("num_critics", critics)
    obs_spec = ObsSpec({"obs": (obs_dim,)}, {"obs": torch.float32})
    action_spec = ActionSpec(False, dim=action_dim, low=(-1.0,) * action_dim, high=(1.0,) * action_dim)
    torch.manual_seed(0)
    trainer = SACTrainer(SquashedGaussianActor.build(cfg, obs_spec, action_spec), cfg)
    batch = TrajectoryBuffers.allocate(64, 32, obs_spec, action_spec, shared=False, final_obs=True)
    batch.obs["obs"].normal_()
    batch.actions.uniform_(-1, 1)
    batch.rewards.normal_()
    batch.chunk_steps[:] = 1
    trainer.train(batch, 0, 0)  # fills the replay (2048 steps) and warms up
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(steps // 5):
            trainer.step()
        rounds.append((time.perf_counter() - started) / (steps // 5) * 1e3)
    return statistics.median(rounds)


def measured_in_process(obs_dim: int, action_dim: int, critics: int, threads: int, source: Path | None = None) -> float:
    """``step_milliseconds`` in a fresh process: of this tree, or (``source``) of a worktree of another revision."""
    code = (
        "from benchmarks.sac_step import step_milliseconds; "
        f"print(step_milliseconds({obs_dim}, {action_dim}, {critics}, {threads}))"
    )
    env = {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)} if source else None
    cwd = source or Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        sys.exit(f"benchmarks.sac_step: error: the step of {source or 'this tree'} failed: {done.stderr[-500:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--critics", default="2,10", help="ensemble sizes, comma-separated")
    parser.add_argument("--threads", default="1,2", help="learner threads, comma-separated")
    parser.add_argument("--out", default="benchmarks/results", help="directory of the result files")
    parser.add_argument("--baseline_ref", default="", help="a git revision to measure beside this tree, row by row")
    parser.add_argument("--repeats", type=int, default=3, help="with --baseline_ref: measurements of each side a row")
    args = parser.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(checkout_of(args.baseline_ref)) if args.baseline_ref else None
        for name, (obs_dim, action_dim) in SHAPES.items():
            for critics in map(int, args.critics.split(",")):
                for threads in map(int, args.threads.split(",")):
                    row = {"shapes": name, "critics": critics, "threads": threads}
                    if source is None:
                        row["ms_per_step"] = round(step_milliseconds(obs_dim, action_dim, critics, threads), 2)
                    else:
                        before, after = [], []
                        for _ in range(args.repeats):
                            before.append(measured_in_process(obs_dim, action_dim, critics, threads, source))
                            after.append(measured_in_process(obs_dim, action_dim, critics, threads))
                        row["baseline_ms_per_step"] = round(statistics.median(before), 2)
                        row["ms_per_step"] = round(statistics.median(after), 2)
                        row["ratio"] = round(row["baseline_ms_per_step"] / row["ms_per_step"], 3)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    result = {"machine": platform.processor() or platform.machine(), "date": str(date.today()), "rows": rows}
    if args.baseline_ref:
        result["baseline_ref"] = args.baseline_ref
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sac_step.json").write_text(json.dumps(result, indent=1))
    before = f"{args.baseline_ref} ms a step | " if args.baseline_ref else ""
    lines = [
        f"| shapes (obs, action dims) | critics | threads | {before}ms a step | env steps/s at replay ratio 1 |"
        + (" speed-up |" if args.baseline_ref else ""),
        "|---|---|---|---|---|" + ("---|---|" if args.baseline_ref else ""),
    ]
    for row in rows:
        dims = SHAPES[row["shapes"]]
        baseline = f"{row['baseline_ms_per_step']:.2f} | " if args.baseline_ref else ""
        lines.append(
            f"| {row['shapes']} {dims} | {row['critics']} | {row['threads']} | {baseline}{row['ms_per_step']:.2f} | "
            f"{1000 / row['ms_per_step']:.0f} |" + (f" {row['ratio']:.2f}x |" if args.baseline_ref else "")
        )
    (out / "sac_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
