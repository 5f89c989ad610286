"""What a flow head costs the inference worker, per env step, against the Gaussian head, with and without action
chunks, and what FlowSAR's self-annotation adds.

    python -m benchmarks.flow_inference                      # the policy alone, then the engine on sparse_reach
    python -m benchmarks.flow_inference --engine_seconds=0   # the policy alone

Two parts, one invocation:

- **policy**: ``ActorCritic.act`` on a batch of ``--rows`` observations (one inference batch), one torch thread, on
  LIBERO-state-like sizes (``--obs_dim`` vector, 7-dim actions), the median of ``--repeats`` timings of ``--calls``
  calls; per env step = per call / (rows x chunk). With the flow head also ``self_annotate`` (two velocity passes
  with the reference policy), and the ratio annotation / act.
- **engine** (``--engine_seconds`` > 0): ``python -m sfengine.train --benchmark=true`` (sampling only) on
  ``sparse_reach`` with 2 workers x 8 envs for each head and chunk; steady FPS and the status line's inference
  share of a core. The flow rows run FlowSAR's configuration, so their inference includes the self-annotation.

Writes ``results/flow_inference.{json,md}``.
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

import torch

from sfengine.algorithms.flow_sar.sar import self_annotate
from sfengine.config import parse_config
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic

RESULTS = Path(__file__).resolve().parent / "results"
HEADS = {"gaussian": [], "flow": ["--algo=flow_sar", "--policy_head=flow", "--group_outcome=success"]}


def time_calls(fn, calls: int, repeats: int) -> float:
    """Median seconds per call."""
    for _ in range(max(1, calls // 10)):
        fn()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - started) / calls)
    return statistics.median(runs)


def policy_row(head: str, chunk: int, args) -> dict:
    cfg = parse_config([*HEADS[head], f"--action_chunk={chunk}"])
    obs_spec = ObsSpec({"obs": (args.obs_dim,)}, {"obs": torch.float32})
    action_spec = ActionSpec(False, dim=7 * chunk, low=(-1.0,) * 7 * chunk, high=(1.0,) * 7 * chunk, chunk=chunk)
    model = ActorCritic.for_config(cfg, obs_spec, action_spec).eval()
    obs = {"obs": torch.randn(args.rows, args.obs_dim)}

    def act():
        with torch.inference_mode():
            return model.act(obs)

    row = {"head": head, "chunk": chunk, "act_us": 1e6 * time_calls(act, args.calls, args.repeats)}
    row["us_per_env_step"] = row["act_us"] / (args.rows * chunk)
    if head == "flow":
        actions = act().actions
        sar = cfg.algorithm_options

        def annotate():
            return self_annotate(model, obs, actions, sar.flow_sar_tau_mid, sar.flow_sar_t_min, sar.flow_sar_t_max)

        row["annotation_us"] = 1e6 * time_calls(annotate, args.calls, args.repeats)
        row["annotation_over_act"] = row["annotation_us"] / row["act_us"]
    return row


def engine_row(head: str, chunk: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as train_dir:
        command = [
            sys.executable,
            "-m",
            "sfengine.train",
            "--env=sparse_reach",
            *HEADS[head],
            f"--action_chunk={chunk}",
            "--benchmark=true",
            f"--train_for_seconds={seconds}",
            "--train_for_env_steps=100000000",
            "--report_every_sec=2",
            f"--train_dir={train_dir}",
            "--experiment=bench",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
        if result.returncode != 0:
            raise RuntimeError(f"{head} chunk {chunk}: {result.stderr[-2000:]}")
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        split = [line for line in result.stdout.splitlines() if "time: " in line][-1].split("time: ")[1]
    return {"head": head, "chunk": chunk, "fps_steady": summary["fps_steady"], "time_split": split.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8, help="observations per inference batch")
    parser.add_argument("--obs_dim", type=int, default=32, help="vector observation size")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine_seconds", type=float, default=30.0, help="per engine row; 0: skip the engine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = [policy_row(head, chunk, args) for head in HEADS for chunk in (1, 4)]
    for row in policy:
        print("policy:", json.dumps(row), flush=True)
    engine = []
    if args.engine_seconds > 0:
        for head in HEADS:
            for chunk in (1, 4):
                engine.append(engine_row(head, chunk, args.engine_seconds))
                print("engine:", json.dumps(engine[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flow_inference.json").write_text(json.dumps({"policy": policy, "engine": engine}, indent=2))
    lines = [
        f"Policy alone: {args.rows} rows, obs {args.obs_dim}, 7-dim actions, one thread, medians.",
        "",
        "| head | chunk | act us per batch | us per env step | self-annotation us | annotation / act |",
        "|---|---|---|---|---|---|",
    ]
    for row in policy:
        annotation = (
            f"{row['annotation_us']:.0f} | {row['annotation_over_act']:.2f}" if "annotation_us" in row else "- | -"
        )
        lines.append(
            f"| {row['head']} | {row['chunk']} | {row['act_us']:.0f} | {row['us_per_env_step']:.1f} | {annotation} |"
        )
    if engine:
        lines += [
            "",
            "Engine, sparse_reach, 2 workers x 8 envs, sampling only:",
            "",
            "| head | chunk | FPS steady | time split |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['head']} | {r['chunk']} | {r['fps_steady']:,.0f} | {r['time_split']} |" for r in engine]
    (args.out / "flow_inference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
