"""Learning quality side by side: sfengine against the PPO implementations researchers trust, same envs, same steps.

    python -m benchmarks.learning                                   # HalfCheetah-v5 and Hopper-v5, 1M steps
    python -m benchmarks.learning --systems=sfengine --seeds=1,2,3  # sfengine's rows again; peers from their files
    python -m benchmarks.learning --systems=sfengine --device=cuda  # the learner on a GPU (rows "sfengine-cuda")
    python -m benchmarks.learning --algo=sac --env_steps=300000      # SAC: results/learning_sac

Systems (each with its own recommended settings for these envs):
- ``sfengine``: the env's own preset where one ships (``--cfg=halfcheetah``, built on ``mujoco``), else
  ``--cfg=mujoco``; the whole engine: rollout workers, inference, learner.
- ``sb3``: Stable-Baselines3 PPO with the RL Zoo's tuned hyperparameters (``benchmarks/peer_sb3.py``).
- ``cleanrl``: CleanRL's ``ppo_continuous_action`` (``benchmarks/peer_cleanrl.py``).

With ``--algo=sac``: sfengine's preset for SAC on a cheap env (``--cfg=sac_mujoco``: 4 envs acting synchronously,
SAC's defaults otherwise), Stable-Baselines3's SAC with the RL Zoo's MuJoCo settings
(``benchmarks/peer_sb3_sac.py``) and CleanRL's ``sac_continuous_action`` (``benchmarks/peer_cleanrl_sac.py``); the
bar on wall time is half the fastest peer's.

Every run leaves ``<out>/<env>/<system>_seed<k>.json`` (``benchmarks/peer_record.py``). A peer's file is reused
when it exists (``--rerun_peers`` to run it again): peers take 15-60 minutes a run on 2 cores. sfengine's rows are
always run. The tables and plots are made from every file present: ``<out>/summary.json``, ``<out>/summary.md``,
and ``<out>/<env>.png`` (mean return of the last 100 episodes against env steps and against wall-clock time).
The summary gives sfengine's gap to each peer's mean return and, with 2 seeds a side or more, Welch's t of it and
the seeds a side that would make a gap of that size and spread significant (t = 2). Each run also records the
CPU seconds its process tree took (``cpu_sec``): where runs shared the machine or ran with different thread
counts, their wall times are not comparable and their CPU times are.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_record import write_json
from sfengine.plot import Series, plot_metrics
from sfengine.reporting.events import read_scalars

PEERS = {"sb3": "benchmarks.peer_sb3", "cleanrl": "benchmarks.peer_cleanrl"}
SAC_PEERS = {"sb3": "benchmarks.peer_sb3_sac", "cleanrl": "benchmarks.peer_cleanrl_sac"}
# The wall-time bar: sfengine's time at most this fraction of the fastest peer's (PPO: a fifth; SAC, whose
# learner does one gradient step per env step in every system, half).
TIME_BARS = {"ppo": 5, "sac": 2}
# CleanRL's published ppo_continuous_action returns at 1M steps (3 seeds, MuJoCo v4): the bar.
CLEANRL_PUBLISHED = {"HalfCheetah-v5": (1442.6, 46.0), "Hopper-v5": (2382.9, 271.7)}
RETURN_TAG = "episodes/episode_return_mean"
# sfengine's preset per env, as the RL Zoo tunes per env; envs not named run --cfg=mujoco.
SFENGINE_PRESETS = {"HalfCheetah-v5": "halfcheetah"}
SFENGINE_SAC_PRESET = "sac_mujoco"
COLORS = {
    "sfengine": "tab:blue",
    "sfengine-cuda": "tab:cyan",
    "sfengine-async16-lr3e-4": "tab:gray",  # SAC's earlier engine defaults: 16 envs asynchronous, critics at 3e-4
    "sfengine-sb3recipe": "tab:purple",  # a diagnostic: sfengine's engine with SB3's SAC settings (README)
    "sfengine-1env": "tab:red",  # a diagnostic: sfengine with one env, so the acting policy lags less (README)
    "sfengine-serial": "tab:brown",  # a diagnostic: sfengine's trainer in the peers' serial loop (sac_serial)
    "sb3": "tab:orange",
    "cleanrl": "tab:green",
}


def children_cpu_sec() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_counting_cpu(command: list[str], **kwargs) -> float:
    """Run ``command`` to its end; the CPU seconds its whole process tree took. Unlike wall time, that figure does
    not depend on what else the machine ran meanwhile, so runs on a shared machine stay comparable by it."""
    before = children_cpu_sec()
    subprocess.run(command, check=True, **kwargs)
    return round(children_cpu_sec() - before, 1)


def run_peer(system: str, env: str, seed: int, env_steps: int, out: Path, threads: int, algo: str) -> None:
    command = [sys.executable, "-m", (SAC_PEERS if algo == "sac" else PEERS)[system], f"--env={env}", f"--seed={seed}"]
    command += [f"--env_steps={env_steps}", f"--threads={threads}", f"--out={out}"]
    print(" ".join(command), flush=True)
    cpu_sec = run_counting_cpu(command)
    record = json.loads(out.read_text())
    write_json(out, {**record, "cpu_sec": cpu_sec, "threads": threads})


def run_sfengine(
    env: str, seed: int, env_steps: int, out: Path, device: str, extra: list[str], algo: str = "ppo"
) -> None:
    """One sfengine training run through the CLI (with the algorithm's preset for the env); its curve is read back
    from its TensorBoard file."""
    system = "sfengine" if device == "cpu" else f"sfengine-{device}"
    with tempfile.TemporaryDirectory(prefix="sfengine_learning_") as train_dir:
        experiment = f"{env}_seed{seed}"
        preset = SFENGINE_SAC_PRESET if algo == "sac" else SFENGINE_PRESETS.get(env, "mujoco")
        command = [sys.executable, "-m", "sfengine.train", f"--env={env}", f"--seed={seed}", f"--cfg={preset}"]
        command += [f"--train_for_env_steps={env_steps}", f"--device={device}", f"--train_dir={train_dir}"]
        command += [f"--experiment={experiment}", "--report_every_sec=5", "--restart_behavior=overwrite", *extra]
        print(" ".join(command), flush=True)
        started = time.time()
        cpu_sec = run_counting_cpu(command, stdout=subprocess.DEVNULL)
        summary = json.loads((Path(train_dir) / experiment / "summary.json").read_text())
        points = read_scalars(Path(train_dir) / experiment)[RETURN_TAG]
        config = json.loads((Path(train_dir) / experiment / "config.json").read_text())
    record = {
        "system": system,
        "env": env,
        "seed": seed,
        "env_steps": summary["env_steps"],
        "wall_sec": summary["wall_seconds"],
        "fps": round(summary["env_steps"] / summary["wall_seconds"]),
        "cpu_sec": cpu_sec,
        "final_return": summary["episode_return_mean"],
        "settings": {name: value for group in config.values() for name, value in group.items()},
        "curve": [[p.step, round(p.wall_time - started, 3), p.value] for p in points],
    }
    write_json(out, record)
    print(f"{system} {env} seed {seed}: return {record['final_return']:.1f} in {record['wall_sec']:.0f} s", flush=True)


def aggregate(out_dir: Path, envs: list[str], algo: str = "ppo") -> dict:
    """Per env and system: final return mean and std over seeds, wall time and FPS means, and the targets."""
    table: dict = {}
    for env in envs:
        rows: dict[str, dict] = {}
        runs: dict[str, list[dict]] = {}
        for path in sorted((out_dir / env).glob("*_seed*.json")):
            run = json.loads(path.read_text())
            runs.setdefault(run["system"], []).append(run)
        for system, system_runs in runs.items():
            returns = [r["final_return"] for r in system_runs]
            rows[system] = {
                "seeds": [r["seed"] for r in system_runs],
                "returns": returns,
                "return_mean": statistics.fmean(returns),
                "return_std": statistics.pstdev(returns),
                "wall_sec_mean": statistics.fmean(r["wall_sec"] for r in system_runs),
                "fps_mean": statistics.fmean(r["fps"] for r in system_runs),
                # CPU seconds: comparable where the runs shared the machine (runs before it was recorded: None).
                "cpu_sec_mean": mean_or_none([r.get("cpu_sec") for r in system_runs]),
                "env_steps": min(r["env_steps"] for r in system_runs),
            }
        table[env] = {"rows": rows, "targets": targets(env, rows, algo)}
    return table


def mean_or_none(values: list[float | None]) -> float | None:
    return statistics.fmean(values) if values and None not in values else None


def targets(env: str, rows: dict[str, dict], algo: str = "ppo") -> dict:
    """The issue's bars for sfengine's CPU row: CleanRL's published return (PPO), the best peer measured here, and
    a wall time at most a fifth (SAC: half) of the fastest peer's."""
    ours, peers = rows.get("sfengine"), {name: row for name, row in rows.items() if name in PEERS}
    if ours is None:
        return {}
    result = {}
    if env in CLEANRL_PUBLISHED and algo == "ppo":
        result["return_at_least_cleanrl_published"] = ours["return_mean"] >= CLEANRL_PUBLISHED[env][0]
    if peers:
        result["return_at_least_best_peer"] = ours["return_mean"] >= max(r["return_mean"] for r in peers.values())
        for name, row in sorted(peers.items()):
            result[f"return_vs_{name}"] = return_gap(ours, row)
        fastest = min(r["wall_sec_mean"] for r in peers.values())
        result["speedup_over_fastest_peer"] = round(fastest / ours["wall_sec_mean"], 2)
        bar = TIME_BARS[algo]
        result[f"wall_time_at_most_1/{bar}_of_fastest_peer"] = ours["wall_sec_mean"] * bar <= fastest
        cpu = [r["cpu_sec_mean"] for r in peers.values()]
        if ours["cpu_sec_mean"] is not None and None not in cpu:
            result["cpu_time_ratio_to_leanest_peer"] = round(ours["cpu_sec_mean"] / min(cpu), 2)
    return result


def return_gap(ours: dict, peer: dict) -> dict:
    """How far sfengine's mean final return is from a peer's, and how well the seeds resolve it: Welch's t of the
    gap, and the seeds a side that would make a gap of this size and spread read t = 2 (about a 95% two-sided
    test). Needs 2 seeds a side; rows saved before their returns were kept give the gap alone."""
    gap = ours["return_mean"] - peer["return_mean"]
    result = {"gap": round(gap, 1)}
    if min(len(ours.get("returns", [])), len(peer.get("returns", []))) < 2:
        return result
    squared_error = sum(statistics.variance(row["returns"]) / len(row["returns"]) for row in (ours, peer))
    if squared_error == 0 or gap == 0:
        return result
    t = gap / math.sqrt(squared_error)
    seeds = max(len(ours["returns"]), len(peer["returns"]))
    return result | {"welch_t": round(t, 2), "seeds_a_side_for_t_2": math.ceil(seeds * (2 / t) ** 2)}


def markdown(table: dict, algo: str = "ppo") -> str:
    lines = [
        "| env | system | seeds | return (last 100 episodes), mean ± std over seeds (population) | wall time s | "
        "CPU time s | FPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for env, entry in table.items():
        for system, row in sorted(entry["rows"].items()):
            cpu = "" if row.get("cpu_sec_mean") is None else f"{row['cpu_sec_mean']:.0f}"
            lines.append(
                f"| {env} | {system} | {len(row['seeds'])} | {row['return_mean']:.1f} ± {row['return_std']:.1f} | "
                f"{row['wall_sec_mean']:.0f} | {cpu} | {row['fps_mean']:,.0f} |"
            )
        if env in CLEANRL_PUBLISHED and algo == "ppo":
            mean, std = CLEANRL_PUBLISHED[env]
            lines.append(f"| {env} | CleanRL published (v4, 3 seeds) | 3 | {mean} ± {std} | | | |")
    lines.append("")
    for env, entry in table.items():
        if entry["targets"]:
            lines.append(
                f"- {env}: " + ", ".join(target_words(name, value) for name, value in entry["targets"].items())
            )
    return "\n".join(lines) + "\n"


def target_words(name: str, value) -> str:
    if not isinstance(value, dict):
        return f"{name} = {value}"
    words = f"{name}: gap {value['gap']:+,.0f}"
    if "welch_t" in value:
        words += f" (Welch's t {value['welch_t']}; t = 2 needs {value['seeds_a_side_for_t_2']:,} seeds a side)"
    return words


def plot(out_dir: Path, env: str, algo: str = "ppo") -> Path | None:
    """Return against env steps and wall time, every run of every system on one figure (sfengine.plot's)."""
    runs = [json.loads(p.read_text()) for p in sorted((out_dir / env).glob("*_seed*.json"))]
    if not any(run["curve"] for run in runs):
        return None
    name = "return (mean of last 100 episodes)"
    lines, labelled = [], set()
    for run in runs:
        if run["curve"]:
            steps, seconds, returns = (list(column) for column in zip(*run["curve"]))
            label = None if run["system"] in labelled else run["system"]
            labelled.add(run["system"])
            lines.append(Series(label, steps, seconds, returns, COLORS.get(run["system"])))
    published = env in CLEANRL_PUBLISHED and algo == "ppo"
    references = {name: [("CleanRL published, 1M", CLEANRL_PUBLISHED[env][0])]} if published else {}
    title = f"{env}: one line per seed; time on a log scale"
    return plot_metrics({name: lines}, out_dir / f"{env}.png", title, log_time=True, references=references)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="HalfCheetah-v5,Hopper-v5")
    parser.add_argument("--systems", default="sfengine,sb3,cleanrl")
    parser.add_argument("--seeds", default=None, help="sfengine's seeds (default 1,2,3)")
    parser.add_argument("--peer_seeds", default="1", help="the peers' seeds")
    parser.add_argument("--env_steps", type=int, default=1_000_000)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="sfengine's learner device")
    parser.add_argument("--rerun_peers", action="store_true", help="run peers even where their results exist")
    parser.add_argument("--peer_threads", type=int, default=1, help="torch threads of a peer (it runs one env)")
    parser.add_argument("--algo", default="ppo", choices=("ppo", "sac"), help="every system's algorithm")
    parser.add_argument("--out", default="", help="default: benchmarks/results/learning (SAC: learning_sac)")
    parser.add_argument("--sfengine_args", default="", help="extra sfengine options, space-separated")
    args = parser.parse_args()
    out_dir = Path(args.out or f"benchmarks/results/learning{'_sac' if args.algo == 'sac' else ''}")
    envs = args.envs.split(",")
    extra = args.sfengine_args.split()
    systems = args.systems.split(",")
    if args.seeds is not None and "sfengine" not in systems:
        parser.error("--seeds sets sfengine's seeds and --systems runs no sfengine: give the peers' as --peer_seeds")
    seeds = [int(s) for s in (args.seeds or "1,2,3").split(",")]
    for env in envs:
        for system in systems:
            if system == "sfengine":
                for seed in seeds:
                    name = "sfengine" if args.device == "cpu" else f"sfengine-{args.device}"
                    path = out_dir / env / f"{name}_seed{seed}.json"
                    run_sfengine(env, seed, args.env_steps, path, args.device, extra, args.algo)
            elif system in PEERS:
                for seed in (int(s) for s in args.peer_seeds.split(",")):
                    path = out_dir / env / f"{system}_seed{seed}.json"
                    if args.rerun_peers or not path.exists():
                        run_peer(system, env, seed, args.env_steps, path, args.peer_threads, args.algo)
            else:
                raise SystemExit(f"--systems: unknown system {system!r}; use sfengine, sb3 or cleanrl")
    table = aggregate(out_dir, envs, args.algo)
    write_json(out_dir / "summary.json", table)
    (out_dir / "summary.md").write_text(markdown(table, args.algo))
    for env in envs:
        plot(out_dir, env, args.algo)
    print(markdown(table, args.algo))


if __name__ == "__main__":
    main()
