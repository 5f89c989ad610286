"""Every CUDA path of the engine run once, and the CPU and the GPU measured side by side, in one command.

    . benchmarks/gpu_setup.sh && python -m benchmarks.gpu --out=$OUT     # on a GPU machine (no network)
    python -m benchmarks.gpu --out=/tmp/gpu_dry --libero_modes=state     # a dry run on the CPU: CUDA rows skipped

Sections, in this order (``--sections`` picks some); each writes its results to ``<out>/gpu.json`` and
``<out>/gpu.md`` as soon as it ends, so a run cut short still leaves what it measured:

- ``tests``: ``pytest -m gpu tests/gpu`` (CartPole to 400 on CUDA, the CNN with bf16 inference, the flow head and
  FlowSAR, ``sfengine.pretrain --device=cuda``, a GPU checkpoint resumed on the CPU and back), with pytest-xdist
  where it is installed. Without CUDA they skip.
- ``learner``: milliseconds per minibatch step of the real trainers on a synthetic batch, on the CPU (the
  learner's ``--learner_threads``, as the engine runs it) and on CUDA, for a state MLP (LIBERO-state sizes, PPO),
  the 128-px two-camera CNN (LIBERO rgb sizes, PPO) and the flow head (chunks of 4, FlowSAR).
- ``offpolicy``: milliseconds per gradient step of SAC and TD3 (``OffPolicyTrainer.step``: a critic step, the
  actor's, the targets' update) on minibatches of 256 from a filled replay, LIBERO-state sizes, 2 and 10 critics,
  on the CPU (1 and 4 learner threads) and on CUDA: the step that bounds a replay run's env steps per second.
  Twice: one step alone (its statistics read back, as a latency), and a step within a learner's round
  (``train``: 128 new env steps into the replay, then 64 gradient steps at a replay ratio of 0.5, the round's
  statistics read once), as a replay run takes them. On CUDA also with ``--cuda_graphs`` (2 critics: the graphs
  need the target's subset to be the whole ensemble).
- ``inference``: observations per second of ``ActorCritic.act`` per batch size, as an inference worker calls it
  (observations from CPU memory, actions back to it), on one CPU thread and on CUDA, float32 and bfloat16 (CNN).
- ``publish``: the time from the learner's publish of new weights (``SharedWeights.publish``, from the learner's
  device into shared memory) to the inference copy holding them (``pull``, onto its device), by policy size;
  the largest policy within 50 ms. Measured in one process: the seqlock's cross-process signal is one load.
- ``libero``: ``benchmarks.throughput`` on LIBERO-Object, the layout the sizer chooses for this machine (``auto``):
  the envs stepping alone (the raw limit) against the engine sampling, in rgb mode (EGL; the policy on CUDA
  where there is one) and in state mode; task 0 alone by default (``--libero_args``), so that the start-up builds
  one simulator an env, not ten.

Times are medians of repeated timed calls after warm-up calls; CUDA timings synchronise before the clock stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks.sac_step import random_batch
from sfengine.algorithms import algorithm_for
from sfengine.config import parse_config
from sfengine.engine.buffers import SharedWeights, TrajectoryBuffers
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.group_batcher import GroupBatch
from sfengine.models.actor_critic import ActorCritic

SECTIONS = ("tests", "learner", "offpolicy", "inference", "publish", "libero")
ACTION_DIM = 7
STATE = ObsSpec({"obs": (128,)}, {"obs": torch.float32})  # LIBERO-Object state: proprio, objects, task
RGB = ObsSpec(
    {"agentview": (128, 128, 3), "wrist": (128, 128, 3), "proprio": (39,)},
    {"agentview": torch.uint8, "wrist": torch.uint8, "proprio": torch.float32},
)
# name: (observations, options, minibatch size); LIBERO-Object's preset otherwise (256-256 MLP, 4 epochs).
LEARNER_MODELS = {
    "mlp": (STATE, ["--batch_size=1024"], 1024),
    "cnn128": (RGB, ["--batch_size=256"], 256),
    "flow": (STATE, ["--algo=flow_sar", "--policy_head=flow", "--action_chunk=4", "--group_outcome=success"], 1024),
}
BATCH_SIZES = (1, 8, 32, 128, 512)
PUBLISH_WIDTHS = (512, 1024, 2048, 4096, 8192)  # a 4-layer MLP of this width: 0.8M to 200M parameters
PUBLISH_LIMIT_MS = 50.0
ROUND_STEPS = 64  # gradient steps of a learner's round in the offpolicy section


ONLY_DEVICES: set[str] = set()  # --devices: the rows of these devices alone (empty: every device there is)


def devices() -> list[str]:
    found = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return [device for device in found if not ONLY_DEVICES or device in ONLY_DEVICES]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(call: Callable[[], None], device: str, warmup: int = 2, repeats: int = 5, budget_s: float = 1.0) -> float:
    """Median milliseconds of ``call``: ``warmup`` calls, then ``repeats`` timed ones (fewer once ``budget_s`` is
    spent, at least two)."""
    for _ in range(warmup):
        call()
    synchronize(device)
    timings, spent = [], 0.0
    while len(timings) < repeats and (len(timings) < 2 or spent < budget_s):
        started = time.perf_counter()
        call()
        synchronize(device)
        timings.append(time.perf_counter() - started)
        spent += timings[-1]
    return statistics.median(timings) * 1e3


def action_spec(chunk: int = 1) -> ActionSpec:
    dim = ACTION_DIM * chunk
    return ActionSpec(False, dim=dim, low=(-1.0,) * dim, high=(1.0,) * dim, chunk=chunk)


def random_obs(spec: ObsSpec, rows: int) -> dict[str, torch.Tensor]:
    return {
        key: torch.randint(0, 256, (rows, *shape), dtype=torch.uint8)
        if spec.is_image(key)
        else torch.randn(rows, *shape)
        for key, shape in spec.shapes.items()
    }


def ppo_batch(cfg, obs_spec: ObsSpec, actions: ActionSpec) -> TrajectoryBuffers:
    learner = cfg.learner
    horizon = cfg.sampler.rollout
    batch = TrajectoryBuffers.allocate(
        learner.batch_size * learner.num_batches_per_epoch // horizon, horizon, obs_spec, actions, shared=False
    )
    for key, obs in batch.obs.items():
        obs.copy_(random_obs(obs_spec, obs.shape[0] * obs.shape[1])[key].view_as(obs))
    batch.actions.uniform_(-1, 1)
    batch.rewards.normal_()
    batch.log_probs.fill_(-float(actions.dim))
    return batch


def flow_batch(cfg, obs_spec: ObsSpec, actions: ActionSpec, episode_steps: int = 64) -> GroupBatch:
    n = cfg.learner.batch_size * cfg.learner.num_batches_per_epoch
    batch = GroupBatch.allocate(n, 1, obs_spec, actions, annotated=True)
    for key, obs in batch.obs.items():
        obs.copy_(random_obs(obs_spec, n)[key])
    batch.actions.uniform_(-1, 1)
    batch.episodes.copy_(torch.arange(n) // episode_steps)
    batch.outcomes[: n // episode_steps].copy_(torch.rand(n // episode_steps, 1).round())
    batch.recon_errors.uniform_(0, 1)
    batch.flow_times.uniform_(0.2, 0.8)
    batch.flow_noise.normal_()
    batch.v_old.normal_()
    batch.num_steps, batch.num_groups = n, n // episode_steps
    return batch


def learner_rows() -> list[dict]:
    rows = []
    for name, (obs_spec, options, minibatch) in LEARNER_MODELS.items():
        cfg = parse_config(["--cfg=libero_object", "--num_batches_per_epoch=2", *options])
        algorithm = algorithm_for(cfg)
        actions = action_spec(cfg.model.action_chunk)
        cpu_batch = (flow_batch if algorithm.grouped(cfg) else ppo_batch)(cfg, obs_spec, actions)
        steps = cfg.learner.num_epochs * cfg.learner.num_batches_per_epoch
        for device in devices():
            set_cpu_threads(cfg.learner.learner_threads if device == "cpu" else 1)
            torch.manual_seed(0)
            model = ActorCritic.for_config(cfg, obs_spec, actions).to(device)
            trainer = algorithm.trainer(model, cfg)
            batch = cpu_batch.to(torch.device(device))
            version = iter(range(1, 10**6))
            ms = median_ms(
                lambda trainer=trainer, batch=batch, version=version: trainer.train(batch, next(version), 0),
                device,
                warmup=1,
                repeats=3,
                budget_s=20,
            )
            rows.append(
                {
                    "model": name,
                    "device": device,
                    "threads": torch.get_num_threads() if device == "cpu" else None,
                    "minibatch": minibatch,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "ms_per_minibatch_step": round(ms / steps, 3),
                }
            )
            print("learner:", json.dumps(rows[-1]), flush=True)
    return rows


def offpolicy_rows() -> list[dict]:
    rows = []
    actions = action_spec()
    for algo in ("sac", "td3"):
        for critics in (2, 10):
            cfg = parse_config([f"--algo={algo}", "--env=Pendulum-v1", "--rollout=32", f"--num_critics={critics}"])
            cfg.set("learning_starts", 0)
            cfg.set("replay_ratio", 1 / 2048)  # the batch below fills the replay and takes one step
            algorithm = algorithm_for(cfg)
            batch = random_batch(64, STATE, actions)
            # A round as a replay run's learner takes it: the new data in, then --replay_ratio x its env steps of
            # gradient steps (0.5 x 128, the LIBERO residual's ratio), its statistics read once at the end.
            round_batch = random_batch(ROUND_STEPS * 2 // 32, STATE, actions)
            variants = [("cpu", 1, False), ("cpu", 4, False)] if "cpu" in devices() else []
            if "cuda" in devices():
                variants.append(("cuda", 1, False))
                # --cuda_graphs (a tree that has it), where the target's subset is the whole ensemble
                if hasattr(cfg.algorithm_options, "cuda_graphs") and critics == cfg.algorithm_options.critic_subset:
                    variants.append(("cuda", 1, True))
            for device, threads, graphs in variants:
                set_cpu_threads(threads)
                torch.manual_seed(0)
                if graphs or hasattr(cfg.algorithm_options, "cuda_graphs"):
                    cfg.set("cuda_graphs", graphs)
                cfg.set("replay_ratio", 1 / 2048)
                trainer = algorithm.trainer(algorithm.model(cfg, STATE, actions).to(device), cfg)
                # The learner hands the trainer each batch on its device (LearnerWorker: ``batch.to(device)``).
                move = (lambda b, device=device: b.to(device)) if device != "cpu" else (lambda b: b)
                trainer.train(move(batch), 0, 0)
                # (10 warm-up steps: with graphs, each kind's eager steps and its recording come first)
                ms = median_ms(lambda trainer=trainer: trainer.step(), device, warmup=10, repeats=50, budget_s=3)
                cfg.set("replay_ratio", 0.5)
                ms_round = median_ms(
                    lambda trainer=trainer, move=move, b=round_batch: trainer.train(move(b), 0, 0),
                    device,
                    warmup=1,
                    repeats=5,
                    budget_s=3,
                )
                rows.append(
                    {
                        "algo": algo,
                        "critics": critics,
                        "device": device,
                        "threads": threads if device == "cpu" else None,
                        "cuda_graphs": graphs,
                        "ms_per_step": round(ms, 3),
                        "ms_per_step_in_round": round(ms_round / ROUND_STEPS, 3),
                    }
                )
                print("offpolicy:", json.dumps(rows[-1]), flush=True)
    return rows


def inference_rows() -> list[dict]:
    set_cpu_threads(1)  # as the inference workers and the rollout workers acting run
    rows = []
    cfg = parse_config(["--cfg=libero_object"])
    for name, obs_spec in (("mlp", STATE), ("cnn128", RGB)):
        dtypes = ["float32", "bfloat16"] if name == "cnn128" else ["float32"]
        for device in devices():
            for dtype in dtypes:
                torch.manual_seed(0)
                model = ActorCritic.for_config(cfg, obs_spec, action_spec()).to(device)
                model.for_inference(getattr(torch, dtype)).eval()
                for rows_per_call in BATCH_SIZES:
                    if device == "cpu" and name == "cnn128" and rows_per_call > 128:
                        continue  # seconds a call on one thread: the 128-row figure says it
                    obs = random_obs(obs_spec, rows_per_call)

                    def act(model=model, obs=obs, device=device) -> None:
                        with torch.inference_mode():
                            out = model.act({key: t.to(device) for key, t in obs.items()})
                            out.actions.cpu()

                    ms = median_ms(act, device, warmup=3, repeats=20, budget_s=2.0)
                    rows.append(
                        {
                            "model": name,
                            "device": device,
                            "dtype": dtype,
                            "batch": rows_per_call,
                            "ms_per_call": round(ms, 3),
                            "obs_per_sec": round(rows_per_call / ms * 1e3),
                        }
                    )
                    print("inference:", json.dumps(rows[-1]), flush=True)
    return rows


def publish_rows() -> list[dict]:
    rows = []
    obs_spec = ObsSpec({"obs": (128,)}, {"obs": torch.float32})
    for device in devices():
        for width in PUBLISH_WIDTHS:
            if device == "cpu" and width > 4096:
                continue
            cfg = parse_config([f"--hidden_sizes={width},{width},{width},{width}"])
            # Built without initialising (seconds on the CPU for the large ones): a copy's cost is in its bytes.
            with torch.device("meta"):
                learner, acting = (ActorCritic.for_config(cfg, obs_spec, action_spec()) for _ in range(2))
            learner, acting = learner.to_empty(device=device), acting.to_empty(device=device)
            with torch.no_grad():  # every page written: untouched memory would read as one cached zero page
                for tensor in (*learner.state_dict().values(), *acting.state_dict().values()):
                    tensor.uniform_(-0.01, 0.01) if tensor.is_floating_point() else tensor.zero_()
            weights = SharedWeights.allocate(learner)
            version = iter(range(1, 10**6))
            publish = median_ms(partial(lambda w, m, v: w.publish(m, next(v)), weights, learner, version), device)
            pull = median_ms(partial(weights.pull, acting), device)
            rows.append(
                {
                    "device": device,
                    "width": width,
                    "parameters": sum(p.numel() for p in learner.parameters()),
                    "megabytes": round(sum(t.numel() * t.element_size() for t in weights.tensors.values()) / 1e6, 1),
                    "publish_ms": round(publish, 2),
                    "pull_ms": round(pull, 2),
                    "total_ms": round(publish + pull, 2),
                }
            )
            print("publish:", json.dumps(rows[-1]), flush=True)
            del learner, acting, weights
    return rows


def largest_within_limit(rows: list[dict], device: str) -> int | None:
    fits = [row["parameters"] for row in rows if row["device"] == device and row["total_ms"] <= PUBLISH_LIMIT_MS]
    return max(fits, default=None)


def libero_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    out = Path(tempfile.mkdtemp(prefix="sfe_gpu_libero_"))  # its files are folded into gpu.json
    for mode in args.libero_modes.split(","):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        command = [sys.executable, "-m", "benchmarks.throughput", "--env=libero_object", f"--libero_obs_mode={mode}"]
        command += [f"--device={device}", f"--seconds={args.libero_seconds}", f"--warmup={args.libero_warmup}"]
        command += ["--startup=180", f"--out={out}", f"--tag={mode}_{device}", *args.libero_args.split()]
        started = time.time()
        result = subprocess.run(command, capture_output=True, text=True)
        path = out / f"throughput_libero_object_{mode}_{device}.json"
        row = {"mode": mode, "device": device, "wall_seconds": round(time.time() - started)}
        if result.returncode != 0 or not path.exists():
            row["error"] = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
        else:
            measured = json.loads(path.read_text())
            row.update(measured)
        rows.append(row)
        print("libero:", json.dumps(row)[:2000], flush=True)
    return rows


def tests_row(out: Path) -> dict:
    command = [sys.executable, "-m", "pytest", "-v", "-rA", "--durations=0", "-m", "gpu", "tests/gpu"]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", "9"]  # every test at once: a GPU machine's 16 cores hold their processes
    started = time.time()
    log = out / "gpu_tests.log"
    with open(log, "w") as stream:  # written as it goes: a run cut short by its time limit keeps what it printed
        result = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT)
    lines = log.read_text().strip().splitlines()
    tail = lines[-1] if lines else ""
    print("tests:", tail, flush=True)
    return {"exit_code": result.returncode, "result": tail, "wall_seconds": round(time.time() - started)}


def machine() -> dict:
    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "cpu": next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), ""
        ),
    }
    if torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    for package in ("mujoco", "robosuite"):
        try:
            facts[package] = __import__(package).__version__
        except ImportError:
            pass
    return facts


def markdown(results: dict) -> str:
    lines = [f"Machine: {json.dumps(results['machine'])}", ""]
    sections = results["sections"]
    if "tests" in sections:
        lines += [f"GPU tests: {sections['tests']['result']} (exit {sections['tests']['exit_code']})", ""]
    if "learner" in sections:
        lines += ["| learner | device | minibatch | parameters | ms per minibatch step |", "|---|---|---|---|---|"]
        for r in sections["learner"]:
            device = f"{r['device']} ({r['threads']} threads)" if r["threads"] else r["device"]
            lines.append(
                f"| {r['model']} | {device} | {r['minibatch']} | {r['parameters']:,} | {r['ms_per_minibatch_step']} |"
            )
        lines.append("")
    if "offpolicy" in sections:
        lines += [
            "| off-policy step | critics | device | ms a step alone | ms a step in a round | env steps/s at ratio 1 |",
            "|---|---|---|---|---|---|",
        ]
        for r in sections["offpolicy"]:
            device = f"{r['device']} ({r['threads']} threads)" if r["threads"] else r["device"]
            device += ", CUDA graphs" if r.get("cuda_graphs") else ""
            in_round = r.get("ms_per_step_in_round") or r["ms_per_step"]
            lines.append(
                f"| {r['algo']} | {r['critics']} | {device} | {r['ms_per_step']} | {in_round} | {1000 / in_round:.0f} |"
            )
        lines.append("")
    if "inference" in sections:
        lines += ["| inference | device | dtype | batch | ms per call | obs/s |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {r['model']} | {r['device']} | {r['dtype']} | {r['batch']} | {r['ms_per_call']} | {r['obs_per_sec']:,} |"
            for r in sections["inference"]
        ]
        lines.append("")
    if "publish" in sections:
        rows = sections["publish"]
        lines += ["| publish + pull | parameters | MB | publish ms | pull ms | total ms |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {r['device']} | {r['parameters']:,} | {r['megabytes']} | {r['publish_ms']} | {r['pull_ms']} | "
            f"{r['total_ms']} |"
            for r in rows
        ]
        for device in devices():
            largest = largest_within_limit(rows, device)
            lines.append(
                f"\nLargest policy published and picked up within {PUBLISH_LIMIT_MS:g} ms on {device}: "
                f"{largest:,} parameters"
                if largest
                else f"\nNone within {PUBLISH_LIMIT_MS:g} ms on {device}"
            )
        lines.append("")
    if "libero" in sections:
        lines += ["| LIBERO-Object | layout | limit FPS | sampling FPS | sampling / limit |", "|---|---|---|---|---|"]
        for r in sections["libero"]:
            if "error" in r:
                lines.append(f"| {r['mode']} ({r['device']}) | error: {' / '.join(r['error'])} | | | |")
                continue
            limit, sampling = r["rows"]["limit"].get("fps"), r["rows"]["sampling"].get("fps")
            ratio = f"{sampling / limit:.2f}" if limit and sampling else ""
            layout = " ".join(arg for arg in r["train_args"] if "num_" in arg or "sim_cache" in arg)
            lines.append(f"| {r['mode']} ({r['device']}) | {layout} | {limit} | {sampling} | {ratio} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu"))
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    parser.add_argument("--libero_modes", default="rgb,state", help="LIBERO-Object observation modes to measure")
    parser.add_argument("--libero_seconds", type=float, default=15.0, help="measured seconds per LIBERO row")
    parser.add_argument("--libero_warmup", type=float, default=8.0, help="seconds stepped before measuring")
    parser.add_argument(
        "--libero_args",
        default="--tasks=0",
        help="sfengine.train options for the LIBERO rows (default: one task, so that each env builds one simulator "
        "at start, not ten: 2-4 s each)",
    )
    parser.add_argument(
        "--devices", default="", help="cpu or cuda: measure that device's rows alone (say, the GPU's of another tree)"
    )
    args = parser.parse_args()
    ONLY_DEVICES.update(filter(None, args.devices.split(",")))
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "sections": {}}
    print("machine:", json.dumps(results["machine"]), flush=True)
    runners = {
        "tests": lambda: tests_row(args.out),
        "learner": learner_rows,
        "offpolicy": offpolicy_rows,
        "inference": inference_rows,
        "publish": publish_rows,
        "libero": lambda: libero_rows(args),
    }
    for section in (s for s in SECTIONS if s in args.sections.split(",")):
        started = time.time()
        try:
            results["sections"][section] = runners[section]()
        except Exception as exc:  # one section's failure must not cost the others' figures
            results.setdefault("errors", {})[section] = f"{type(exc).__name__}: {exc}"
            print(f"{section}: failed: {exc!r}", flush=True)
        results.setdefault("section_seconds", {})[section] = round(time.time() - started, 1)
        (args.out / "gpu.json").write_text(json.dumps(results, indent=2))
        (args.out / "gpu.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return 1 if results.get("errors") or results["sections"].get("tests", {}).get("exit_code") else 0


if __name__ == "__main__":
    sys.exit(main())
