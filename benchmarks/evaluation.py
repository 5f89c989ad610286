"""Evaluation speed: ``sfengine.evaluate`` against the loop a user would otherwise write, on a LIBERO suite.

    python -m benchmarks.evaluation                                  # libero_spatial, all 500 (task, init) pairs
    python -m benchmarks.evaluation --tasks=0,1 --init_states=3      # a quick subset
    python -m benchmarks.evaluation --chaos_kill_every_sec=30         # and again with a worker killed every 30 s

Both rows play the same deterministic policy (one checkpoint, actions from the distribution's mode) on the same
(task, init state) pairs, with the same env class and reset protocol, so their per-task results are comparable:

- ``sfengine``: ``python -m sfengine.evaluate`` with the suite's defaults (its rollout workers and envs sized
  from the machine, one inference worker), timed from the command to its exit.
- ``single loop``: one env in one process, task by task, each episode stepped to its end before the next, one
  forward per step: how published LIBERO evaluation scripts run.
- with ``--chaos_kill_every_sec=N``, ``sfengine under chaos``: ``sfengine.evaluate`` again, a random rollout or
  inference worker SIGKILLed every N seconds: what the respawns cost in wall time, and whether every pair's outcome
  and length are still those of the clean run.

The policy is an untrained network (the benchmark is about time; any policy will do), so nearly every episode
runs to the suite's step limit, the slowest case. Writes ``<out>/evaluation_<suite>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sfengine.config import parse_config, save_config
from sfengine.engine.checkpoint import load_checkpoint, save_checkpoint
from sfengine.env.registry import env_context, resolve_env_factory
from sfengine.env.spaces import obs_as_dict
from sfengine.evaluation.episode_queue import evaluated_init_states
from sfengine.models.actor_critic import ActorCritic
from sfengine.train import build_model, probe_env


def make_checkpoint(suite: str, train_dir: Path) -> Path:
    cfg = parse_config([f"--env={suite}", f"--train_dir={train_dir}", "--experiment=policy"])
    obs_spec, action_spec, _ = probe_env(cfg, resolve_env_factory(suite))
    model = build_model(cfg, obs_spec, action_spec, None)
    cfg.experiment_dir.mkdir(parents=True)
    save_config(cfg, cfg.experiment_dir / "config.json")
    state = {"model": model.state_dict(), "optimizer": {}, "env_steps": 0, "policy_version": 0}
    return save_checkpoint(cfg.experiment_dir, state, keep=1)


def run_sfengine(checkpoint: Path, narrowing: list[str]) -> dict:
    command = [sys.executable, "-m", "sfengine.evaluate", f"--checkpoint={checkpoint}", *narrowing]
    print(" ".join(command), flush=True)
    started = time.time()
    run = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - started
    if run.returncode:
        sys.exit(f"sfengine.evaluate exited with {run.returncode}:\n{run.stderr[-3000:]}")
    (eval_dir,) = (checkpoint.parent.parent / "eval").iterdir()
    results = json.loads((eval_dir / "results.json").read_text())
    outcomes = {(e["task_index"], e["init_state"]): (e["success"], e["length"]) for e in results["episodes"]}
    return {
        "wall_sec": round(wall, 1),
        "evaluate_wall_sec": results["wall_sec"],
        "outcomes": outcomes,
        "episodes": len(results["episodes"]),
        "kills": run.stderr.count("chaos: SIGKILL to"),
    }


def run_single_loop(suite: str, checkpoint: Path, tasks: list[int], init_states: int) -> dict:
    """One env, one process, one episode after another: the reference loop."""
    torch.set_num_threads(1)
    started = time.time()
    cfg = parse_config([f"--env={suite}"])
    factory = resolve_env_factory(suite)
    obs_spec, action_spec, task_info = probe_env(cfg, factory)
    model = ActorCritic.for_config(cfg, obs_spec, action_spec)
    model.load_state_dict(load_checkpoint(checkpoint)["model"])
    model.eval()
    env = factory(env_context(cfg, 0, 0, 0))
    outcomes = {}
    counts = evaluated_init_states(task_info, tasks, init_states)
    for task, count in enumerate(counts):
        for init_state in range(count):
            obs, _ = env.reset(options={"task": task, "init_state": init_state})
            length, done, info = 0, False, {}
            while not done:
                with torch.inference_mode():
                    batch = {k: torch.as_tensor(v)[None] for k, v in obs_as_dict(obs).items()}
                    action = model.act(batch, deterministic=True).actions[0].numpy()
                obs, _, terminated, truncated, info = env.step(np.clip(action, -1.0, 1.0))
                length += 1
                done = terminated or truncated
            outcomes[(task, init_state)] = (bool(info.get("success", False)), length)
    env.close()
    return {"wall_sec": round(time.time() - started, 1), "outcomes": outcomes}


def per_task_success(outcomes: dict) -> dict[int, float]:
    tasks = sorted({task for task, _ in outcomes})
    return {task: float(np.mean([success for (t, _), (success, _) in outcomes.items() if t == task])) for task in tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--tasks", default="", help="task indices (default: every task)")
    parser.add_argument("--init_states", type=int, default=0, help="first N init states of each task (0: all)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--chaos_kill_every_sec", type=float, default=0, help="also run sfengine.evaluate with this fault injection"
    )
    args = parser.parse_args()
    tasks = [int(t) for t in args.tasks.split(",") if t]
    narrowing = [f"--eval_tasks={args.tasks}"] if tasks else []
    narrowing += [f"--eval_init_states={args.init_states}"] if args.init_states else []
    with tempfile.TemporaryDirectory(prefix="sfengine_eval_bench_") as tmp:
        checkpoint = make_checkpoint(args.suite, Path(tmp))
        single = run_single_loop(args.suite, checkpoint, tasks, args.init_states)
        print(f"single loop: {single['wall_sec']} s", flush=True)
        engine = run_sfengine(checkpoint, narrowing)
        print(f"sfengine.evaluate: {engine['wall_sec']} s", flush=True)
        if args.chaos_kill_every_sec:
            chaos = run_sfengine(checkpoint, [*narrowing, f"--chaos_kill_every_sec={args.chaos_kill_every_sec:g}"])
            print(f"sfengine.evaluate under chaos: {chaos['wall_sec']} s, {chaos['kills']} kills", flush=True)
    same_pairs = set(engine["outcomes"]) == set(single["outcomes"])
    identical = sum(engine["outcomes"][pair] == single["outcomes"][pair] for pair in single["outcomes"])
    record = {
        "suite": args.suite,
        "episodes": len(single["outcomes"]),
        "single_loop_wall_sec": single["wall_sec"],
        "sfengine_wall_sec": engine["wall_sec"],
        "sfengine_evaluate_wall_sec": engine["evaluate_wall_sec"],
        "speedup": round(single["wall_sec"] / engine["wall_sec"], 2),
        "same_pairs": same_pairs,
        "episodes_with_identical_outcome_and_length": identical,
        "per_task_success_single_loop": per_task_success(single["outcomes"]),
        "per_task_success_sfengine": per_task_success(engine["outcomes"]),
    }
    if args.chaos_kill_every_sec:
        record["chaos"] = {
            "kill_every_sec": args.chaos_kill_every_sec,
            "kills": chaos["kills"],
            "wall_sec": chaos["wall_sec"],
            "wall_over_clean": round(chaos["wall_sec"] / engine["wall_sec"], 2),
            "episodes": chaos["episodes"],  # each pair once: a repeat would make this larger
            "same_outcome_and_length_as_clean": sum(
                chaos["outcomes"].get(pair) == outcome for pair, outcome in engine["outcomes"].items()
            ),
        }
    out = Path(args.out) / f"evaluation_{args.suite}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
