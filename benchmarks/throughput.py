"""How close sfengine comes to the raw speed of its envs, side by side in one invocation.

    python -m benchmarks.throughput --env=CartPole-v1 --seconds=10 --warmup=5 --num_workers=2 --num_envs_per_worker=8
    python -m benchmarks.throughput --env=libero_spatial --libero_obs_mode=state --seconds=60 --warmup=30 \\
        --with_training --tag=state_2x4

Options this script does not declare are ``python -m sfengine.train`` options, given to every row. The rows run
one after the other, each measured over the same ``--seconds`` after ``--warmup`` seconds of stepping envs (the
start-up before the first env step, envs built and reset, is not counted in either):

    limit     num_workers spawned processes, each stepping its num_envs_per_worker envs one after the other in a
              loop: no policy, no shared memory, no engine. The envs come from the engine's own factory, with the
              engine's seeds, and a multi-task env is reset through the task cycle of the engine's TaskSchedule
              (each env from its own start, so each plays every task), so a step, a reset and the simulators
              kept cost what they cost in the engine. Actions are drawn with
              action_space.sample() before the loop (a ring per env): rollout workers do not draw actions, so
              the loop times the env alone.
    limit_stock_step  (with --with_stock_step, LIBERO) the limit with robosuite's stock step
              (--libero_fast_step=false); the limit row runs the env's default, the fast step.
    sampling  python -m sfengine.train --benchmark=true: the whole engine with the PPO update skipped.
    training  (with --with_training) the same run with the PPO update.
    <row>_workers_act  (with --with_workers_acting) the sampling (and training) rows with
              --num_inference_workers=0: each rollout worker runs the policy itself, no inference process
              (from the working tree only, not from a --baseline_ref).
    <row>@<ref>  (with --baseline_ref=<git revision>) the sampling (and training) rows run from a checkout of
              that revision, each just before its own row: the before/after figures of an engine change, taken
              side by side on the same machine state.
    With --repeats=N every row above runs N times, the rows in turn (limits, then engine rows, N rounds), and
    reports its median run (every run in fps_runs): the ratios then come from medians that saw the same drift.
    sample_factory  (with --sf_python=<its venv's python>) Sample Factory 2.1.1, same layout and PPO sizes
              (benchmarks/sample_factory_baseline.py; CartPole-v1 only).
    diy       (with --with_diy) gymnasium's AsyncVectorEnv and a synchronous PPO loop of the same sizes
              (benchmarks.diy_baseline): what a user writes without an engine.

Engine FPS comes from the status lines (every 1 s). The engine's start-up lasts until the first line with env
steps (at most ``--startup`` seconds); the window runs from the first line ``--warmup`` seconds after it to the
line ``--seconds`` later. Steps count when a training batch reaches the learner, so the resolution is one
training batch: for slow envs, use a long --seconds or a small --batch_size. The key figure is sampling / limit.
An engine row ends (SIGINT, the engine's clean stop) at the first status line after its window, so a generous
--startup costs nothing once the engine is up.

Memory is peak RSS, sampled every 0.5 s: of the largest env process (a limit worker, an engine ``sfe-rollout-*``
process; per env = that / num_envs_per_worker) and summed over all processes of the row (the limit's workers, the
engine's whole process tree). RSS counts shared pages (the trajectory buffers) in every process that touched
them; PSS (proportional set size, sampled every 10 s) divides shared pages among the processes that map them,
so it adds up to what the row takes from the machine. CPU% is the mean over the measured window, 100 = one core. The engine rows also report the
status line's time split at the window's end. Writes ``throughput_<env>_<tag>.{json,md,png}`` to ``--out``
(``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

from benchmarks.compare_sample_factory import run_sample_factory
from benchmarks.process_tree import run_and_measure
from sfengine.config import Config, ConfigError, auto_options, parse_config
from sfengine.engine.sizing import resolve_auto_options
from sfengine.env.multitask import selected_init_states, task_info
from sfengine.env.registry import env_context, env_sizer, resolve_env_factory
from sfengine.tasks.scheduler import TaskSchedule, shard_pairs
from sfengine.tasks.seeding import rollout_env_seed
from sfengine.train import probe_env

RESULTS = Path(__file__).resolve().parent / "results"
REPORT_EVERY_SEC = 1.0
SAMPLE_EVERY_SEC = 0.5
PSS_EVERY_SEC = 10.0  # proportional memory walks every page table: sampled less often, so it costs no throughput
ACTION_RING = 1024  # pre-drawn random actions per env, cycled
STATUS_LINE = re.compile(r"^\[\s*([\d.]+)s\] steps\s+([\d,]+)")
ENGINE_ENV_PROCESS = "sfe-rollout-"  # the title sfengine.engine.event_loop gives rollout worker processes


def pss_bytes(pid: int) -> int:
    """Proportional set size: each shared page divided among the processes that map it (Linux)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


class ProcessSampler:
    """Samples RSS and CPU time of a set of processes every 0.5 s, and their PSS every 10 s, in a thread, while a
    row runs.

    ``processes()`` returns the processes to sample now (the set may change); ``is_env_process`` picks those whose
    own peak is reported. Cumulative CPU keeps the last value of processes that exited, so it never decreases.
    """

    def __init__(self, processes: Callable[[], list[psutil.Process]], is_env_process: Callable[[psutil.Process], bool]):
        self.processes, self.is_env_process = processes, is_env_process
        self.peak_total_rss = 0
        self.peak_rss_by_pid: dict[int, int] = {}
        self.peak_total_pss = 0
        self.peak_pss_by_pid: dict[int, int] = {}
        self.cpu_by_pid: dict[int, float] = {}
        self.cpu_history: list[tuple[float, float]] = []  # (time.monotonic(), CPU seconds of all processes)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        next_pss = time.monotonic()
        while not self.done.is_set():
            total = total_pss = 0
            with_pss = time.monotonic() >= next_pss
            next_pss += PSS_EVERY_SEC if with_pss else 0.0
            try:
                processes = self.processes()
            except psutil.Error:  # a process of the set exited while it was listed; try again next time
                processes = []
            for process in processes:
                try:
                    rss = process.memory_info().rss
                    times = process.cpu_times()
                    is_env = self.is_env_process(process)
                    pss = pss_bytes(process.pid) if with_pss else 0
                except (psutil.Error, OSError):
                    continue
                total += rss
                total_pss += pss
                self.cpu_by_pid[process.pid] = times.user + times.system
                if is_env:
                    self.peak_rss_by_pid[process.pid] = max(rss, self.peak_rss_by_pid.get(process.pid, 0))
                    self.peak_pss_by_pid[process.pid] = max(pss, self.peak_pss_by_pid.get(process.pid, 0))
            self.peak_total_rss = max(self.peak_total_rss, total)
            self.peak_total_pss = max(self.peak_total_pss, total_pss)
            self.cpu_history.append((time.monotonic(), sum(self.cpu_by_pid.values())))
            self.done.wait(SAMPLE_EVERY_SEC)

    def cpu_percent(self, start: float, end: float) -> float | None:
        """Mean CPU use between two time.monotonic() instants (100 = one core), interpolating between samples."""
        if len(self.cpu_history) < 2 or end <= start:
            return None
        times, cpu_seconds = zip(*self.cpu_history, strict=True)
        cpu_start, cpu_end = np.interp([start, end], times, cpu_seconds)
        return round(100 * (cpu_end - cpu_start) / (end - start))

    def figures(self) -> dict:
        largest = max(self.peak_rss_by_pid.values(), default=0)
        largest_pss = max(self.peak_pss_by_pid.values(), default=0)
        return {
            "peak_rss_mb": round(self.peak_total_rss / 2**20),
            "env_process_peak_rss_mb": round(largest / 2**20),
            "peak_pss_mb": round(self.peak_total_pss / 2**20),
            "env_process_peak_pss_mb": round(largest_pss / 2**20),
        }


def step_envs_in_loop(cfg: Config, worker: int, warmup: float, seconds: float, barrier, results) -> None:
    """One limit process: build and reset its envs as a rollout worker does, then step them round-robin."""
    factory = resolve_env_factory(cfg.env.env)
    per_worker = cfg.sampler.num_envs_per_worker
    seeds = [rollout_env_seed(cfg.env.seed, worker, per_worker, i) for i in range(per_worker)]
    envs = [factory(env_context(cfg, worker, i, seed)) for i, seed in enumerate(seeds)]
    info = task_info(envs[0])
    # Each env walks the task cycle from its own start, so that every env plays every task in turn and keeps a
    # simulator for each, as the engine's envs come to do. (One schedule shared by envs that reset in lockstep, as
    # random-action episodes do, would give each env a fixed subset of the tasks.)
    # --tasks: the chosen tasks only, as the engine's task sequence deals them (with all of them, the envs of a run
    # sized for one task would rebuild a simulator at every switch, and the limit would be too low).
    pairs = [] if info is None else shard_pairs(selected_init_states(info, cfg.env.tasks, "--tasks"), 0, 1)
    schedules = [TaskSchedule(pairs) for _ in envs] if pairs else []
    for i, schedule in enumerate(schedules):
        schedule.position = worker * per_worker + i

    def reset(i: int, seed: int | None = None) -> None:
        assignment = schedules[i].next() if schedules else None
        options = None if assignment is None else {"task": assignment.task, "init_state": assignment.init_state}
        envs[i].reset(seed=seed, options=options)

    for i, seed in enumerate(seeds):
        reset(i, seed)
        envs[i].action_space.seed(seed)
    actions = [[env.action_space.sample() for _ in range(ACTION_RING)] for env in envs]
    barrier.wait()  # every process starts its clock together, once all envs are built
    measure_from = time.monotonic() + warmup
    measure_to = measure_from + seconds
    steps, round_index = 0, 0
    while (now := time.monotonic()) < measure_to:
        for i, env in enumerate(envs):
            _, _, terminated, truncated, _ = env.step(actions[i][round_index % ACTION_RING])
            if terminated or truncated:
                reset(i)
        round_index += 1
        if now >= measure_from:
            steps += per_worker
    results.put((worker, steps, measure_from))
    for env in envs:
        env.close()


def run_limit(cfg: Config, warmup: float, seconds: float) -> dict:
    mp = multiprocessing.get_context("spawn")
    num_workers = cfg.sampler.num_workers
    barrier, results = mp.Barrier(num_workers), mp.Queue()
    processes = [
        mp.Process(target=step_envs_in_loop, args=(cfg, w, warmup, seconds, barrier, results), daemon=True)
        for w in range(num_workers)
    ]
    for process in processes:
        process.start()
    handles = [psutil.Process(p.pid) for p in processes]
    reports: dict[int, tuple[int, float]] = {}
    deadline = time.monotonic() + warmup + seconds + 900  # env start-up (LIBERO) can take minutes
    try:
        with ProcessSampler(lambda: handles, lambda _: True) as sampler:
            while len(reports) < num_workers:
                try:
                    worker, steps, measure_from = results.get(timeout=1.0)
                    reports[worker] = (steps, measure_from)
                except queue.Empty:
                    failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                    if failed or time.monotonic() > deadline:
                        return {"error": f"limit workers failed (exit codes {failed})" if failed else "timed out"}
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
    start = min(measure_from for _, measure_from in reports.values())
    return {
        "fps": round(sum(steps for steps, _ in reports.values()) / seconds, 1),
        "cpu_percent": sampler.cpu_percent(start, start + seconds),
        **sampler.figures(),
    }


def status_window(stdout: str, warmup: float, seconds: float) -> tuple[float, float, int, float, int]:
    """(start-up, t0, steps0, t1, steps1) from the status lines: the start-up lasts until the first line with env
    steps; the window runs from the first line ``warmup`` seconds after it to the line ``seconds`` later."""
    lines = [(float(m[1]), int(m[2].replace(",", ""))) for m in map(STATUS_LINE.match, stdout.splitlines()) if m]
    startup = next((t for t, steps in lines if steps > lines[0][1]), math.inf)
    after = [(t, steps) for t, steps in lines if t >= startup + warmup] or [(math.inf, 0)]
    t0, steps0 = after[0]
    t1, steps1 = [(t, steps) for t, steps in after if t <= t0 + seconds + REPORT_EVERY_SEC / 2][-1]
    return startup, t0, steps0, t1, steps1


def window_complete(stdout: str, warmup: float, seconds: float) -> bool:
    """Whether a status line came after the window's last one: later lines cannot change the measurement."""
    times = [float(m[1]) for m in map(STATUS_LINE.match, stdout.splitlines()) if m]
    if not times:
        return False
    _, t0, *_ = status_window(stdout, warmup, seconds)
    return math.isfinite(t0) and times[-1] > t0 + seconds + REPORT_EVERY_SEC / 2


def run_engine(
    train_args: list[str],
    benchmark: bool,
    args: argparse.Namespace,
    train_dir: Path,
    launcher: tuple[str, ...] = (sys.executable, "-m", "sfengine.train"),
    experiment: str | None = None,
    source: Path | None = None,
    stop_after_window: bool = True,
) -> dict:
    """One engine row: ``launcher`` (the train entry point, or torchrun in front of it) with ``train_args``.
    ``args`` holds the timing: seconds, warmup and startup. ``source``: run the engine of another checkout.

    ``stop_after_window``: a SIGINT ends the run as soon as the window is measured, instead of at the end of the
    whole start-up allowance (minutes on LIBERO). Pass False for a launcher that does not exit 0 on SIGINT
    (torchrun)."""
    experiment = experiment or ("sampling" if benchmark else "training")
    # The extra report intervals leave room for a status line a full --seconds after the first one.
    run_seconds = args.startup + args.warmup + args.seconds + 2 * REPORT_EVERY_SEC
    overrides = {
        "benchmark": benchmark,
        "train_for_seconds": run_seconds,
        "train_for_env_steps": 10**12,
        "train_dir": train_dir,
        "experiment": experiment,
        "restart_behavior": "overwrite",
        "report_every_sec": REPORT_EVERY_SEC,
    }
    command = [*launcher, *train_args, *(f"--{k}={v}" for k, v in overrides.items())]
    me = psutil.Process()

    def engine_tree() -> list[psutil.Process]:
        # The engine's process tree (the launcher's), not multiprocessing's resource tracker of this process.
        roots = [p for p in me.children() if "resource_tracker" not in " ".join(p.cmdline())]
        return [*roots, *(child for root in roots for child in root.children(recursive=True))]

    try:
        with ProcessSampler(engine_tree, lambda p: p.name().startswith(ENGINE_ENV_PROCESS)) as sampler:
            env = None if source is None else {**os.environ, "PYTHONPATH": str(source / PACKAGE_LINKS)}
            done = (lambda stdout: window_complete(stdout, args.warmup, args.seconds)) if stop_after_window else None
            run = run_and_measure(command, timeout=run_seconds + 600, env=env, cwd=source, interrupt_when=done)
            ended = time.monotonic()
    except subprocess.TimeoutExpired:
        for process in engine_tree():
            process.kill()
        return {"error": "timed out"}
    if run.returncode != 0:
        tail = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or [f"exit {run.returncode}"]
        return {"error": tail[0][:200]}
    startup, t0, steps0, t1, steps1 = status_window(run.stdout, args.warmup, args.seconds)
    if not t1 - t0 >= args.seconds - REPORT_EVERY_SEC / 2:
        return {"error": f"no full window after a start-up of {startup:g} s; raise --startup"}
    # Status times count from the runner's start; summary.json's wall_seconds is taken just before the exit.
    runner_started = ended - json.loads((train_dir / experiment / "summary.json").read_text())["wall_seconds"]
    return {
        "fps": round((steps1 - steps0) / (t1 - t0), 1),
        "cpu_percent": sampler.cpu_percent(runner_started + t0, runner_started + t1),
        **sampler.figures(),
        "peak_rss_mb": round(run.peak_rss_mb),
        "startup_seconds": startup,
        "measured_seconds": round(t1 - t0, 1),
        "time_split": time_split_at(run.stdout, t1),
    }


def time_split_at(stdout: str, at: float) -> str:
    """Where the engine's time went, from the status line printed at ``at`` seconds (the window's end)."""
    for line in stdout.splitlines():
        match = STATUS_LINE.match(line)
        if match and float(match[1]) == at and "time: " in line:
            return line.split("time: ", 1)[1].strip()
    return ""


def median_run(runs: list[dict]) -> dict:
    """The run of median FPS, with every run's FPS (``fps_runs``); an error if any run failed."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda run: run["fps"])
    return {**ordered[(len(ordered) - 1) // 2], "fps_runs": [run["fps"] for run in runs]}


PACKAGE_LINKS = ".packages"


@contextlib.contextmanager
def checkout_of(revision: str):
    """A temporary git worktree of ``revision`` of this repository (removed afterwards)."""
    repository = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="sfe_baseline_") as tmp:
        path = Path(tmp) / "checkout"
        git = ["git", "-C", str(repository)]
        added = subprocess.run(
            [*git, "worktree", "add", "--detach", str(path), revision], capture_output=True, text=True
        )
        if added.returncode != 0:
            sys.exit(f"benchmarks.throughput: error: --baseline_ref={revision}: {added.stderr.strip()}")
        # The installed package names, pointing into the checkout: its engine runs with its own envs and presets,
        # not with those of this working tree (sfengine_envs and sfengine_configs are installed from it).
        links = path / PACKAGE_LINKS
        links.mkdir()
        for package, directory in (
            ("sfengine", "sfengine"),
            ("sfengine_envs", "envs"),
            ("sfengine_configs", "configs"),
        ):
            (links / package).symlink_to(path / directory, target_is_directory=True)
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], capture_output=True)


def run_diy(train_args: list[str], args: argparse.Namespace) -> dict:
    """Row (e): gymnasium's AsyncVectorEnv and a synchronous PPO loop of the same sizes (benchmarks.diy_baseline)."""
    command = [sys.executable, "-m", "benchmarks.diy_baseline", f"--seconds={args.seconds}", f"--warmup={args.warmup}"]
    run = run_and_measure([*command, *train_args], timeout=args.startup + args.warmup + args.seconds + 300)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        return {"error": (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1][:200]}
    return {
        "fps": json.loads(lines[-1])["fps"],
        "peak_rss_mb": round(run.peak_rss_mb),
        "cpu_percent": round(run.cpu_percent),
        "env_process_peak_rss_mb": 0,
    }


def run_sample_factory_row(sf_python: str, cfg: Config, args: argparse.Namespace, train_dir: Path) -> dict:
    """Row (d): Sample Factory 2.1.1 (its own venv) with the same layout and PPO sizes, CartPole only."""
    s = cfg.sampler
    setting = {"mode": "async", "num_workers": s.num_workers, "num_envs_per_worker": s.num_envs_per_worker}
    setting["worker_num_splits"] = s.worker_num_splits
    row = run_sample_factory(sf_python, setting, args.seconds, train_dir)
    return {**row, "env_process_peak_rss_mb": 0} if "fps" in row else row


def markdown_table(rows: dict[str, dict], num_envs_per_worker: int) -> str:
    lines = [
        "| row | FPS | ratio to limit | ratio to Sample Factory | peak RSS MB: all / per env process / per env "
        "| peak PSS MB: all / per env process | CPU% | engine time split |",
        "|---|---|---|---|---|---|---|---|",
    ]
    limit_fps = rows["limit"].get("fps")
    sf_fps = rows.get("sample_factory", {}).get("fps")
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | - | - | - | - | - | - |")
            continue
        ratio = f"{row['fps'] / limit_fps:.2f}" if limit_fps else "-"
        to_sf = f"{row['fps'] / sf_fps:.2f}" if sf_fps else "-"
        per_process = row["env_process_peak_rss_mb"]
        memory = f"{row['peak_rss_mb']} / {per_process or '-'} / {per_process / num_envs_per_worker:.0f}"
        pss = f"{row['peak_pss_mb']} / {row['env_process_peak_pss_mb']}" if row.get("peak_pss_mb") else "-"
        split = row.get("time_split", "")
        fps = f"{row['fps']:,.0f}"
        if len(row.get("fps_runs", ())) > 1:
            fps += " (runs: " + " / ".join(f"{run:,.0f}" for run in row["fps_runs"]) + ")"
        lines.append(f"| {name} | {fps} | {ratio} | {to_sf} | {memory} | {pss} | {row['cpu_percent']} | {split} |")
    return "\n".join(lines)


def plot(rows: dict[str, dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {name: row["fps"] for name, row in rows.items() if "fps" in row}
    figure, axes = plt.subplots(figsize=(7, 3.5))
    bars = axes.bar(list(measured), list(measured.values()), color="#4c72b0")
    axes.bar_label(bars, labels=[f"{fps:,.0f}" if fps >= 100 else f"{fps:.3g}" for fps in measured.values()])
    axes.set_ylabel("env steps per second")
    axes.set_title(textwrap.fill(title, 110), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def default_tag(cfg: Config) -> str:
    size = f"{cfg.sampler.num_workers}x{cfg.sampler.num_envs_per_worker}"
    return f"{cfg.get('libero_obs_mode')}_{size}" if cfg.env.env.startswith("libero") else size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Any other option is a python -m sfengine.train option.",
        allow_abbrev=False,  # an abbreviation could swallow an engine option
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="measured wall time per row (a multiple of 2)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds run before the measurement, per row")
    parser.add_argument(
        "--startup", type=float, default=30.0, help="seconds the engine may take to start stepping envs, per row"
    )
    parser.add_argument("--with_training", action="store_true", help="add a row that trains (no --benchmark)")
    parser.add_argument(
        "--with_stock_step", action="store_true", help="LIBERO: add the limit with --libero_fast_step=false"
    )
    parser.add_argument(
        "--with_workers_acting",
        action="store_true",
        help="add the engine rows with --num_inference_workers=0 (each rollout worker acts itself)",
    )
    parser.add_argument("--with_diy", action="store_true", help="add the AsyncVectorEnv + PPO loop baseline row")
    parser.add_argument("--sf_python", default=None, help="add a Sample Factory 2.1.1 row: its venv's python")
    parser.add_argument(
        "--baseline_ref", default=None, help="also run the engine rows from this git revision (before/after)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of every row, the limits included, in turn; each row's median"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the result files")
    parser.add_argument("--tag", default=None, help="result file suffix (default: obs mode and workers x envs)")
    args, train_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="sfe_throughput_") as tmp:
        train_dir = Path(tmp)
        try:
            cfg = parse_config([*train_args, f"--train_dir={train_dir}", "--restart_behavior=overwrite"])
            chosen = auto_options(cfg)
            _, _, tasks = probe_env(cfg, resolve_env_factory(cfg.env.env))
            sizing = resolve_auto_options(cfg, env_sizer(cfg.env.env), tasks)
        except ConfigError as exc:
            sys.exit(f"benchmarks.throughput: error: {exc}")
        if sizing:
            print(sizing, flush=True)
        # Every row runs the layout chosen here, once.
        train_args += [f"--{name}={cfg.get(name)}" for name in chosen]
        limits = {"limit": cfg}
        if args.with_stock_step:
            stock = copy.deepcopy(cfg)
            stock.set("libero_fast_step", False)
            limits = {"limit_stock_step": stock, **limits}
        with contextlib.ExitStack() as stack:
            sources = {"": None}
            if args.baseline_ref is not None:
                sources = {f"@{args.baseline_ref}": stack.enter_context(checkout_of(args.baseline_ref)), **sources}
            layouts = {"": []}
            if args.with_workers_acting:
                layouts["_workers_act"] = ["--num_inference_workers=0"]
            # The workers acting are a layout of this tree only: a baseline revision may not know it.
            engine_rows = [
                (f"{name}{layout}{suffix}", benchmark, source, layout_args)
                for name, benchmark in [("sampling", True), ("training", False)][: 2 if args.with_training else 1]
                for layout, layout_args in layouts.items()
                for suffix, source in sources.items()
                if not (layout and source)
            ]
            runs: dict[str, list[dict]] = {row: [] for row in [*limits, *(row for row, *_ in engine_rows)]}
            # Every row once per repeat, limits included, so that each median sees the same drift of the machine.
            for _ in range(args.repeats):
                for row, limit_cfg in limits.items():
                    runs[row].append(run_limit(limit_cfg, args.warmup, args.seconds))
                    print(f"{row}: {json.dumps(runs[row][-1])}", flush=True)
                for row, benchmark, source, layout_args in engine_rows:
                    row_args = [*train_args, *layout_args]
                    runs[row].append(run_engine(row_args, benchmark, args, train_dir, source=source))
                    print(f"{row}: {json.dumps(runs[row][-1])}", flush=True)
            rows = {row: median_run(measured) for row, measured in runs.items()}
        if args.sf_python:
            rows["sample_factory"] = run_sample_factory_row(args.sf_python, cfg, args, train_dir / "sf")
            print(f"sample_factory: {json.dumps(rows['sample_factory'])}", flush=True)
        if args.with_diy:
            rows["diy"] = run_diy(train_args, args)
            print(f"diy: {json.dumps(rows['diy'])}", flush=True)
    table = markdown_table(rows, cfg.sampler.num_envs_per_worker)
    report = {
        "env": cfg.env.env,
        "train_args": train_args,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"throughput_{cfg.env.env}_{args.tag or default_tag(cfg)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(table + "\n")
    machine = f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GB"
    plot(rows, f"{' '.join(train_args)}\n{machine}, {report['date']}", args.out / f"{name}.png")
    print(table)


if __name__ == "__main__":
    main()
