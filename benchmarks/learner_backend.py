"""The learner's two backends side by side (``--learner_backend=torch|numpy``): time per minibatch step, and whole
training runs of the continuous-control presets, alternating backends seed by seed in one invocation.

    python -m benchmarks.learner_backend                                  # HalfCheetah-v5 and Hopper-v5, 1M steps
    python -m benchmarks.learner_backend --envs=Hopper-v5 --seeds=1 --env_steps=200000

Two parts:
- ``step``: ``PPOTrainer.train`` on a synthetic batch of each env's shapes with its preset's network and
  minibatch size, in this process on one thread, per backend: milliseconds per minibatch step (median of rounds).
- ``runs``: ``python -m sfengine.train --cfg=<preset>`` for each seed, torch then numpy, each run's return (mean
  of the last 100 episodes), wall time and FPS.

Results: ``<out>/summary.json`` and ``<out>/summary.md``, one file per run in ``<out>/<env>/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium as gym
import torch

from benchmarks.learning import SFENGINE_PRESETS, run_sfengine
from benchmarks.peer_record import write_json
from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.env.spaces import action_spec_from_space, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic

BACKENDS = ("torch", "numpy")
# The step part also times torch with the model's forward and backward compiled (torch.compile, inductor), the
# standard way to cut torch's per-op overhead, against the numpy learner.
STEP_BACKENDS = (*BACKENDS, "torch.compile")


def step_milliseconds(env: str, backend: str, rounds: int = 5) -> float:
    """Median time of one minibatch step of the env's preset, from whole ``train`` calls on a synthetic batch."""
    preset = SFENGINE_PRESETS.get(env, "mujoco")
    compiled = backend == "torch.compile"
    cfg = parse_config([f"--cfg={preset}", f"--env={env}", f"--learner_backend={'torch' if compiled else backend}"])
    probe = gym.make(env)
    obs_spec, action_spec = obs_spec_from_space(probe.observation_space), action_spec_from_space(probe.action_space)
    probe.close()
    torch.manual_seed(0)
    trainer = PPOTrainer(ActorCritic(obs_spec, action_spec, cfg.model), cfg)
    if compiled:
        trainer.policy_outputs = torch.compile(trainer.policy_outputs)
    learner = cfg.learner
    horizon = cfg.sampler.rollout
    batch = TrajectoryBuffers.allocate(
        learner.batch_size * learner.num_batches_per_epoch // horizon, horizon, obs_spec, action_spec, shared=False
    )
    for obs in batch.obs.values():
        obs.normal_()
    batch.actions.normal_()
    batch.rewards.normal_()
    batch.log_probs.fill_(-float(action_spec.dim))
    steps = learner.num_epochs * learner.num_batches_per_epoch
    timings = []
    for version in range(rounds + 1):
        started = time.perf_counter()
        trainer.train(batch, version + 1, 1000)
        timings.append((time.perf_counter() - started) / steps * 1e3)
    return statistics.median(timings[1:])  # the first round warms up


def aggregate(out_dir: Path, env: str) -> dict:
    rows = {}
    for backend in BACKENDS:
        runs = [json.loads(p.read_text()) for p in sorted((out_dir / env).glob(f"{backend}_seed*.json"))]
        if not runs:
            continue
        returns = [r["final_return"] for r in runs]
        rows[backend] = {
            "seeds": [r["seed"] for r in runs],
            "returns": [round(value, 1) for value in returns],
            "return_mean": statistics.fmean(returns),
            "return_std": statistics.pstdev(returns),
            "wall_sec": [r["wall_sec"] for r in runs],
            "wall_sec_mean": statistics.fmean(r["wall_sec"] for r in runs),
            "fps_mean": statistics.fmean(r["fps"] for r in runs),
        }
    return rows


def markdown(summary: dict) -> str:
    lines = [
        "| env | backend | ms per minibatch step | runs | return, mean ± std (seeds) | wall s, mean (runs) | FPS |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for env, entry in summary.items():
        for backend in STEP_BACKENDS:
            step = entry["step_ms"].get(backend)
            row = entry["runs"].get(backend)
            step_text = f"{step:.3f}" if step is not None else ""
            if row is None:
                lines.append(f"| {env} | {backend} | {step_text} | 0 | | | |")
                continue
            returns = ", ".join(f"{value:.0f}" for value in row["returns"])
            walls = ", ".join(f"{value:.0f}" for value in row["wall_sec"])
            lines.append(
                f"| {env} | {backend} | {step_text} | {len(row['seeds'])} | {row['return_mean']:.0f} ± "
                f"{row['return_std']:.0f} ({returns}) | {row['wall_sec_mean']:.0f} ({walls}) | {row['fps_mean']:,.0f} |"
            )
        steps = entry["step_ms"]
        for name in ("torch", "torch.compile"):
            if steps.get(name) and steps.get("numpy"):
                lines.append(f"| {env} | {name} / numpy ms per step | {steps[name] / steps['numpy']:.2f} | | | | |")
        if {"torch", "numpy"} <= entry["runs"].keys():
            ratio = entry["runs"]["torch"]["wall_sec_mean"] / entry["runs"]["numpy"]["wall_sec_mean"]
            lines.append(f"| {env} | torch / numpy wall time | | | | {ratio:.2f} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="HalfCheetah-v5,Hopper-v5")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--env_steps", type=int, default=1_000_000)
    parser.add_argument("--skip_runs", action="store_true", help="the step timings alone")
    parser.add_argument("--out", default="benchmarks/results/learner_backend")
    parser.add_argument("--sfengine_args", default="", help="extra sfengine options for the runs, space-separated")
    args = parser.parse_args()
    out_dir, envs = Path(args.out), args.envs.split(",")
    set_cpu_threads(1)  # as the learner process runs (--learner_threads=1)
    summary = {env: {"step_ms": {b: step_milliseconds(env, b) for b in STEP_BACKENDS}, "runs": {}} for env in envs}
    for env in envs:
        print(f"{env}: ms per minibatch step {summary[env]['step_ms']}", flush=True)
    if not args.skip_runs:
        for seed in (int(s) for s in args.seeds.split(",")):
            for env in envs:
                for backend in BACKENDS:
                    extra = [f"--learner_backend={backend}", *args.sfengine_args.split()]
                    run_sfengine(env, seed, args.env_steps, out_dir / env / f"{backend}_seed{seed}.json", "cpu", extra)
    for env in envs:
        summary[env]["runs"] = aggregate(out_dir, env)
    write_json(out_dir / "summary.json", summary)
    (out_dir / "summary.md").write_text(markdown(summary))
    print(markdown(summary))


if __name__ == "__main__":
    main()
