"""What one SAC gradient step costs on this machine: ``SACTrainer.step`` (a critic step, the actor and temperature
step, the target update) on minibatches from a filled replay, for the shapes of a few envs, the critic ensemble's
size and the learner's threads, all in one invocation. Steps are taken as the learner takes them, in rounds
(``train``: 128 new env steps into the replay, then 64 gradient steps at a replay ratio of 0.5); a row also counts
the operations (aten calls, nested ones too) a step makes, which on a GPU bound a small network's step.

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


ROUND_STEPS = 64  # gradient steps a round: 0.5 x the 128 env steps of its batch


def step_cost(obs_dim: int, action_dim: int, critics: int, threads: int, rounds: int = 5) -> tuple[float, float]:
    """Milliseconds (the median round's) and operations a gradient step."""
    torch.set_num_threads(threads)
    cfg = parse_config(["--algo=sac", "--env=Pendulum-v1", "--rollout=32", "--learning_starts=0"])
    cfg.set("num_critics", critics)
    cfg.set("replay_ratio", 1 / 2048)  # the first batch fills the replay (2048 steps) and takes one step
    obs_spec = ObsSpec({"obs": (obs_dim,)}, {"obs": torch.float32})
    action_spec = ActionSpec(False, dim=action_dim, low=(-1.0,) * action_dim, high=(1.0,) * action_dim)
    torch.manual_seed(0)
    trainer = SACTrainer(SquashedGaussianActor.build(cfg, obs_spec, action_spec), cfg)
    trainer.train(random_batch(64, obs_spec, action_spec), 0, 0)
    cfg.set("replay_ratio", ROUND_STEPS / (4 * 32))
    batch = random_batch(4, obs_spec, action_spec)
    trainer.train(batch, 0, 0)  # warm-up
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        trainer.train(batch, 0, 0)
        times.append((time.perf_counter() - started) / ROUND_STEPS * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
        trainer.train(batch, 0, 0)
    operations = sum(event.name.startswith("aten::") for event in profiled.events()) / ROUND_STEPS
    return statistics.median(times), operations


def random_batch(rows: int, obs_spec: ObsSpec, action_spec: ActionSpec) -> TrajectoryBuffers:
    batch = TrajectoryBuffers.allocate(rows, 32, obs_spec, action_spec, shared=False, final_obs=True)
    batch.obs["obs"].normal_()
    batch.actions.uniform_(-1, 1)
    batch.rewards.normal_()
    batch.chunk_steps[:] = 1
    return batch


def measured_in_process(
    obs_dim: int, action_dim: int, critics: int, threads: int, source: Path | None = None
) -> tuple[float, float]:
    """``step_cost`` in a fresh process: of this tree, or (``source``) of a worktree of another revision."""
    # This file's step_cost over the revision's sfengine: the revision's own benchmark may measure otherwise.
    code = (
        f"import runpy; step_cost = runpy.run_path({str(Path(__file__).resolve())!r})['step_cost']; "
        f"print(*step_cost({obs_dim}, {action_dim}, {critics}, {threads}))"
    )
    env = {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)} if source else None
    cwd = source or Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        sys.exit(f"benchmarks.sac_step: error: the step of {source or 'this tree'} failed: {done.stderr[-500:]}")
    milliseconds, operations = done.stdout.strip().splitlines()[-1].split()
    return float(milliseconds), float(operations)


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
                        ms, operations = step_cost(obs_dim, action_dim, critics, threads)
                        row |= {"ms_per_step": round(ms, 2), "ops_per_step": round(operations)}
                    else:
                        before, after = [], []
                        for _ in range(args.repeats):
                            before.append(measured_in_process(obs_dim, action_dim, critics, threads, source))
                            after.append(measured_in_process(obs_dim, action_dim, critics, threads))
                        row["baseline_ms_per_step"] = round(statistics.median(ms for ms, _ in before), 2)
                        row["ms_per_step"] = round(statistics.median(ms for ms, _ in after), 2)
                        row["ratio"] = round(row["baseline_ms_per_step"] / row["ms_per_step"], 3)
                        row["baseline_ops_per_step"] = round(before[0][1])
                        row["ops_per_step"] = round(after[0][1])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    result = {"machine": platform.processor() or platform.machine(), "date": str(date.today()), "rows": rows}
    if args.baseline_ref:
        result["baseline_ref"] = args.baseline_ref
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sac_step.json").write_text(json.dumps(result, indent=1))
    ref = args.baseline_ref
    before = f"{ref} ms a step | {ref} operations a step | " if ref else ""
    lines = [
        f"| shapes (obs, action dims) | critics | threads | {before}ms a step | operations a step | env steps/s at "
        "replay ratio 1 |" + (" speed-up |" if ref else ""),
        "|---|---|---|---|---|---|" + ("---|---|---|" if ref else ""),
    ]
    for row in rows:
        dims = SHAPES[row["shapes"]]
        baseline = f"{row['baseline_ms_per_step']:.2f} | {row['baseline_ops_per_step']} | " if ref else ""
        lines.append(
            f"| {row['shapes']} {dims} | {row['critics']} | {row['threads']} | {baseline}{row['ms_per_step']:.2f} | "
            f"{row['ops_per_step']} | {1000 / row['ms_per_step']:.0f} |" + (f" {row['ratio']:.2f}x |" if ref else "")
        )
    (out / "sac_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
