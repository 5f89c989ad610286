"""What the rank's shared task sequence costs, and one rank against two, side by side in one invocation.

    python -m benchmarks.task_sequence --seconds=30 --repeats=3

Shared sequence against a local draw: the engine samples (``--benchmark``: no PPO update) on the 8-step episodes
of ``multitask_toy``, a reset every 8 env steps per env, far more often than any simulator resets:

    shared   multitask_toy as it is: every reset draws from the rank's shared sequence (a lock and a position
             in shared memory)
    local    the same env, hidden from the engine as a multi-task env: it draws its own (task, init state) in
             reset from a local random generator, which is what a user without the sequence would write

The two rows alternate ``--repeats`` times and the medians are compared (the difference should be in the noise,
under 2%). Then one rank with 2 rollout workers against 2 ranks (torchrun, gloo) with 1 rollout worker each, on
CartPole-v1 with training on, so the cost of the learners' exchange and gradient all-reduce shows. FPS comes
from the engine's status lines over ``--seconds`` after ``--warmup`` (``benchmarks.throughput.run_engine``).
Writes ``benchmarks/results/task_sequence.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmarks.throughput import RESULTS, run_engine
from sfengine.env.registry import EnvContext, register_env
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS, MultiTaskToyEnv

SAMPLER = ["--num_workers=2", "--num_envs_per_worker=8", "--worker_num_splits=2", "--batch_size=1024"]
SAMPLER += ["--num_batches_per_epoch=1", "--num_epochs=1"]


class LocallyDrawnToy(gym.Env):
    """multitask_toy that picks its own assignment: not a multi-task env to the engine."""

    def __init__(self, seed: int):
        self.env = MultiTaskToyEnv()
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        self.rng = np.random.default_rng(seed)

    def reset(self, *, seed=None, options=None):
        options = {"task": self.rng.integers(NUM_TASKS), "init_state": self.rng.integers(NUM_INIT_STATES)}
        return self.env.reset(options=options)

    def step(self, action):
        return self.env.step(action)


def make_locally_drawn_toy(ctx: EnvContext) -> gym.Env:
    return LocallyDrawnToy(ctx.seed)


register_env("locally_drawn_toy", make_locally_drawn_toy)  # at module level: spawned workers import this file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured wall time per row")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of sampling before the measurement")
    parser.add_argument("--startup", type=float, default=40.0, help="seconds the engine may take to start")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the shared and local rows")
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)  # this file as the train entry
    args, rest = parser.parse_known_args()
    if args.train:
        from sfengine.train import main as train

        sys.exit(train(rest))
    entry = (sys.executable, "-m", "benchmarks.task_sequence", "--train")
    rows: dict[str, list[dict]] = {"shared": [], "local": [], "1 rank x 2 workers": [], "2 ranks x 1 worker": []}
    with tempfile.TemporaryDirectory(prefix="sfe_task_sequence_") as tmp:
        for _ in range(args.repeats):
            for name, env in (("shared", "multitask_toy"), ("local", "locally_drawn_toy")):
                rows[name].append(run_engine([f"--env={env}", *SAMPLER], True, args, Path(tmp), entry, name))
                print(f"{name}: {json.dumps(rows[name][-1])}", flush=True)
        cartpole = ["--env=CartPole-v1", "--num_envs_per_worker=8", "--worker_num_splits=2", "--batch_size=1024"]
        one_rank = run_engine([*cartpole, "--num_workers=2"], False, args, Path(tmp), experiment="one_rank")
        torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m")
        two_ranks = run_engine(
            [*cartpole, "--num_workers=1"],
            False,
            args,
            Path(tmp),
            (*torchrun, "sfengine.train"),
            "two_ranks",
            stop_after_window=False,
        )
        rows["1 rank x 2 workers"].append(one_rank)
        rows["2 ranks x 1 worker"].append(two_ranks)
    measured = {name: [r["fps"] for r in runs if "fps" in r] for name, runs in rows.items()}
    medians = {name: statistics.median(fps) for name, fps in measured.items() if fps}
    lines = ["| row | FPS (median) | runs | ratio |", "|---|---|---|---|"]
    baselines = {"shared": "local", "local": "local", "1 rank x 2 workers": "1 rank x 2 workers"}
    baselines["2 ranks x 1 worker"] = "1 rank x 2 workers"
    for name, fps in medians.items():
        runs = ", ".join(f"{r.get('fps', r.get('error'))}" for r in rows[name])
        ratio = f"{fps / medians[baselines[name]]:.3f}" if baselines[name] in medians else "-"
        lines.append(f"| {name} | {fps:,.0f} | {runs} | {ratio} |")
    table = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"date": time.strftime("%Y-%m-%d"), "seconds": args.seconds, "rows": rows, "medians": medians}
    (RESULTS / "task_sequence.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "task_sequence.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
