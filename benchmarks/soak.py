"""Proof over time: long training runs under ``--chaos_kill_every_sec``, their memory, /dev/shm and throughput.

    python -m benchmarks.soak                    # the three runs below, about 50 minutes
    python -m benchmarks.soak --minutes=3 --baseline_minutes=2 --skip_libero      # a quick look

Three runs of ``python -m sfengine.train``, one after the other, each bounded by ``--train_for_seconds``:

    chaos     --env (CartPole-v1, 2 workers x 4 envs, 2 splits) for --minutes, a random rollout or inference
              worker SIGKILLed every --chaos_kill_every_sec and respawned by the runner
    baseline  the same for --baseline_minutes without chaos: the return it reaches is the one to match
    libero    --env=libero_object (its own layout, chosen at start) for --libero_minutes, chaos every
              --libero_chaos_kill_every_sec (a respawned worker builds its simulators again); --skip_libero

While a run goes, every --sample_every_sec (--libero_sample_every_sec) the script samples the RSS, USS and open
file descriptors of every process of the run's tree (the runner, each ``sfe-*`` component by its process title,
multiprocessing's resource tracker), counts the entries of /dev/shm (all, and those the run's processes map or
hold open), and takes the CPU the machine spent outside the run's tree since the last sample (another job on the
machine shows there). Every engine line is timestamped on
arrival: the status lines (every --report_every_sec) give env steps, FPS and return over time; the ``chaos:``,
``died`` and ``respawned`` lines give the kills and respawns. Reported per run:

    respawns         per component, from summary.json and from the log
    FPS around kills env steps per second over half the kill period before and after each kill (30 s for a kill
                     a minute), from the status lines' step counts (a before-window cut short by the start, to
                     no less than a third); the dip is the steps the after-window lacks against the before one
    env steps lost   at most respawn_dropped_trajectories x rollout (the dropped rollouts' steps, summary.json),
                     and the sum of the dips (what the time a worker took to come back cost)
    time lost        summary.json's respawn_seconds_lost (from each death noticed to its successor's first report)
    memory slope     per component, a least-squares line of RSS against time over the samples after
                     --memory_warmup_minutes, in MB/hour with its standard error; within noise when the slope is
                     under twice its standard error, or the growth it predicts over the fitted span is under 1 MB.
                     A killed component's samples come from successive processes (its pids are listed). The
                     same lines over the run's second half (``rss_late``, ``uss_late``): RSS also counts the shared
                     pages (libraries, shared buffers) a process has touched so far, which rises to a plateau.
    /dev/shm         entries over time; flat when every sample after the first status line holds the same count
                     (the machine-wide count also moves with other jobs; the run's own count does not)
    return           chaos against baseline at equal env steps over the steps both reached, the env steps at
                     which each first reached --solved_return, and both final returns

Writes ``soak_<env>.json`` (the figures and every series), ``soak_<env>.png`` (RSS per process, FPS, /dev/shm
and descriptors over time with the kills marked; return against env steps) and ``soak_<env>_<run>_events.log``
(the engine's output without its status lines) to ``--out`` (``benchmarks/results/soak/``). Options this script
does not declare are ``python -m sfengine.train`` options for the chaos and baseline runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from benchmarks.libero_memory import commit, machine
from sfengine.config import ConfigError, parse_config

RESULTS = Path(__file__).resolve().parent / "results" / "soak"
STATUS = re.compile(r"^\[\s*([\d.]+)s\] steps\s+([\d,]+) .*?FPS (\d+)/(\d+)/(\d+) \(10/60/300s\)\s+return (\S+)")
CHAOS = re.compile(r"chaos: SIGKILL to (\w+)_process \(pid (\d+)\)")
DIED = re.compile(r"\] (\w+) died \(exit code (-?\d+)\)")
RESPAWNED = re.compile(r"respawned (\w+) \(pid (\d+) -> (\d+)\)")
NOTABLE = re.compile(r"error|traceback|exception|hung|stopping|warning|nan or inf", re.IGNORECASE)
# Said by LIBERO and robosuite at every worker start: left out of the notable lines and the events log.
NOISE = re.compile(r"macro file|setup_macros|OpenGL_accelerate|Applying task order")
NEVER_ENDS = 10**12  # --train_for_env_steps: the runs are bounded by time
MIN_GROWTH_MB = 1.0


@dataclass
class RunSpec:
    """One engine run of the soak."""

    label: str
    train_args: list[str]  # sfengine.train options, without train_dir, experiment and the bounds
    minutes: float
    chaos_kill_every_sec: float
    sample_every_sec: float
    memory_warmup_minutes: float


@dataclass
class RunRecord:
    """What was seen of one run; every time is seconds since the engine was started."""

    status: list[dict] = field(default_factory=list)  # t, wall, steps, fps_10s, fps_60s, return
    kills: list[dict] = field(default_factory=list)  # t, component, pid
    deaths: list[dict] = field(default_factory=list)  # t, component, exit_code
    respawns: list[dict] = field(default_factory=list)  # t, component, old_pid, new_pid
    notable: list[str] = field(default_factory=list)  # other warning and error lines, with their time
    samples: list[dict] = field(default_factory=list)  # TreeSampler.sample's

    def read_line(self, t: float, line: str) -> None:
        if match := STATUS.match(line):
            wall, steps, fps10, fps60, _, ret = match.groups()
            self.status.append(
                {
                    "t": round(t, 2),
                    "wall": float(wall),
                    "steps": int(steps.replace(",", "")),
                    "fps_10s": int(fps10),
                    "fps_60s": int(fps60),
                    "return": None if ret == "None" else float(ret),
                }
            )
        elif match := CHAOS.search(line):
            self.kills.append({"t": round(t, 2), "component": match[1], "pid": int(match[2])})
        elif match := DIED.search(line):
            self.deaths.append({"t": round(t, 2), "component": match[1], "exit_code": int(match[2])})
        elif match := RESPAWNED.search(line):
            new = {"t": round(t, 2), "component": match[1], "old_pid": int(match[2]), "new_pid": int(match[3])}
            self.respawns.append(new)
        elif NOTABLE.search(line) and not NOISE.search(line) and len(self.notable) < 200:
            self.notable.append(f"{t:8.1f}s {line.rstrip()}")


def process_label(process: psutil.Process, root: psutil.Process) -> str:
    """The runner, an ``sfe-*`` component by its title, the resource tracker, or name-pid for anything else (a
    respawned worker before it sets its title)."""
    if process.pid == root.pid:
        return "runner"
    name = process.name()
    if name.startswith("sfe-"):
        return name
    if any("resource_tracker" in part for part in process.cmdline()):
        return "resource_tracker"
    return f"{name}-{process.pid}"


class TreeSampler:
    """Samples one run's process tree. Keeps the CPU counters of its last sample, to tell what ran outside the tree
    since then."""

    def __init__(self, root: psutil.Process):
        self.root = root
        self.last_cpu: tuple[float, float, float] | None = None  # time, machine busy seconds, tree CPU seconds

    def sample(self, t: float) -> dict:
        """RSS, USS (private memory) and open descriptors of every process of the tree; the /dev/shm entries, all
        and those the tree maps or holds open; the CPU used outside the tree since the last sample (100 = one
        core: another job on the machine shows here)."""
        processes, tree_cpu, shm_paths = {}, 0.0, set()
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            try:
                with process.oneshot():
                    memory, times = process.memory_full_info(), process.cpu_times()
                    processes[process_label(process, self.root)] = {
                        "pid": process.pid,
                        "rss_mb": round(memory.rss / 2**20, 1),
                        "uss_mb": round(memory.uss / 2**20, 1),
                        "fds": process.num_fds(),
                    }
                    tree_cpu += times.user + times.system
                    if process.pid == self.root.pid:  # the workers it killed and reaped count here
                        tree_cpu += times.children_user + times.children_system
                    files = [m.path for m in process.memory_maps()] + [f.path for f in process.open_files()]
                    shm_paths |= {path for path in files if path.startswith("/dev/shm/")}
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        machine = psutil.cpu_times()
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        other = None
        if self.last_cpu is not None and t > self.last_cpu[0]:
            then, busy_then, tree_then = self.last_cpu
            other = max(0, round(100 * ((busy - busy_then) - (tree_cpu - tree_then)) / (t - then)))
        self.last_cpu = (t, busy, tree_cpu)
        return {
            "t": round(t, 1),
            "shm_entries": len(os.listdir("/dev/shm")),
            "shm_entries_of_run": sum(os.path.exists(path) for path in shm_paths),  # a deleted one is no entry
            "other_cpu_percent": other,
            "processes": processes,
        }


def run_engine(spec: RunSpec, train_dir: Path, startup_sec: float) -> tuple[RunRecord, dict, dict]:
    """Run ``spec`` to its end, sampling it; returns the record, summary.json and how the run ended."""
    seconds = spec.minutes * 60
    command = [
        sys.executable,
        "-m",
        "sfengine.train",
        *spec.train_args,
        f"--train_dir={train_dir}",
        f"--experiment={spec.label}",
        "--restart_behavior=overwrite",
        f"--train_for_env_steps={NEVER_ENDS}",
        f"--train_for_seconds={seconds:g}",
        f"--chaos_kill_every_sec={spec.chaos_kill_every_sec:g}",
    ]
    print(f"[soak] {spec.label}: {' '.join(command[1:])}", flush=True)
    record = RunRecord()
    shm_before = len(os.listdir("/dev/shm"))
    log_path = train_dir / f"{spec.label}.log"
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    sampler = TreeSampler(psutil.Process(process.pid))

    def read_output() -> None:
        with log_path.open("w") as log:
            for line in process.stdout:
                t = time.monotonic() - started
                log.write(f"{t:9.2f} {line}")
                record.read_line(t, line)
                if NOISE.search(line):
                    continue
                if CHAOS.search(line) or DIED.search(line) or RESPAWNED.search(line) or NOTABLE.search(line):
                    print(f"[soak] {spec.label} {t:7.1f}s {line.rstrip()}", flush=True)

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    deadline, next_sample, ending = seconds + startup_sec, 0.0, "exited"
    while process.poll() is None:
        t = time.monotonic() - started
        if t >= next_sample:
            record.samples.append(sampler.sample(t))
            next_sample += spec.sample_every_sec
            last = record.status[-1] if record.status else {"steps": 0, "fps_10s": 0, "return": None}
            total = sum(p["rss_mb"] for p in record.samples[-1]["processes"].values())
            print(
                f"[soak] {spec.label} {t:7.1f}s steps {last['steps']:,} FPS {last['fps_10s']} "
                f"return {last['return']} tree RSS {total:,.0f} MB /dev/shm {record.samples[-1]['shm_entries']}",
                flush=True,
            )
        if t > deadline:
            ending = f"still running {deadline:.0f} s after its start: SIGINT, then SIGKILL after 60 s"
            print(f"[soak] {spec.label}: {ending}", flush=True)
            stop_tree(sampler.root, process)
            break
        time.sleep(0.5)
    process.wait()
    reader.join(timeout=60)
    summary_path = train_dir / spec.label / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    end = {
        "ending": ending,
        "returncode": process.returncode,
        "wall_seconds": round(time.monotonic() - started, 1),
        "shm_entries_before": shm_before,
        "shm_entries_after": len(os.listdir("/dev/shm")),
        "log": str(log_path),
    }
    return record, summary, end


def stop_tree(root: psutil.Process, process: subprocess.Popen) -> None:
    """The engine's clean stop (SIGINT), and SIGKILL to what is left of its tree a minute later."""
    children = root.children(recursive=True)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for victim in [root, *children]:
            try:
                victim.kill()
            except psutil.NoSuchProcess:
                pass


def steps_at(status: list[dict], t: float) -> float:
    """Env steps at time ``t``, linear between status lines."""
    return float(np.interp(t, [s["t"] for s in status], [s["steps"] for s in status]))


def stepping(status: list[dict]) -> list[dict]:
    """The status lines from the first with env steps to the first with the final count (the lines written while
    the run stops add none)."""
    if not status or status[-1]["steps"] == 0:
        return []
    final = status[-1]["steps"]
    first = next(i for i, s in enumerate(status) if s["steps"] > 0)
    last = next(i for i, s in enumerate(status) if s["steps"] == final)
    return status[first : last + 1]


def throughput_around_kills(record: RunRecord, window: float) -> list[dict]:
    """Env steps per second over ``window`` s before and after each kill inside the run's stepping span (from its
    first status line with steps to its last); the before-window may be cut short by the start, to a third."""
    span = stepping(record.status)
    if len(span) < 2:
        return []
    first, last = span[0]["t"], span[-1]["t"]
    rows = []
    for kill in record.kills:
        t = kill["t"]
        before_window = min(window, t - first)  # a kill soon after the start has a shorter before-window
        if before_window < window / 3 or t + window > last:
            continue
        before = (steps_at(record.status, t) - steps_at(record.status, t - before_window)) / before_window
        after = (steps_at(record.status, t + window) - steps_at(record.status, t)) / window
        rows.append(
            {
                **kill,
                "before_window_sec": round(before_window, 1),
                "fps_before": round(before),
                "fps_after": round(after),
                "after_over_before": round(after / before, 3) if before else None,
                "steps_lost": round((before - after) * window),
            }
        )
    return rows


def memory_slopes(record: RunRecord, warmup_sec: float, until_sec: float) -> dict:
    """Per process label (and the whole tree): a line of RSS and USS against time over the samples after warm-up,
    and the largest RSS of each process that held the label. The samples of the run's stop (after ``until_sec``)
    are left out."""
    kept = [s for s in record.samples if warmup_sec <= s["t"] <= until_sec]
    peaks: dict[
        str, dict[int, float]
    ] = {}  # label -> pid -> its largest RSS: does a successor outgrow its predecessor?
    for sample in record.samples:
        for name, p in sample["processes"].items():
            peaks.setdefault(name, {})[p["pid"]] = max(peaks.get(name, {}).get(p["pid"], 0.0), p["rss_mb"])
    series: dict[str, list[tuple[float, float, float, int]]] = {}
    for sample in kept:
        for name, p in sample["processes"].items():
            series.setdefault(name, []).append((sample["t"], p["rss_mb"], p["uss_mb"], p["pid"]))
        rss = sum(p["rss_mb"] for p in sample["processes"].values())
        uss = sum(p["uss_mb"] for p in sample["processes"].values())
        series.setdefault("tree", []).append((sample["t"], rss, uss, 0))
    slopes = {}
    for name, points in series.items():
        if len(points) < 4 or not (name in ("runner", "tree") or name.startswith(("sfe-", "resource_tracker"))):
            continue
        times = np.array([p[0] for p in points])
        rss, uss = np.array([p[1] for p in points]), np.array([p[2] for p in points])
        late = times >= max(warmup_sec, until_sec / 2)
        slopes[name] = {
            "samples": len(points),
            "pids": sorted({p[3] for p in points if p[3]}),
            "peak_rss_mb_per_pid": peaks.get(name, {}),
            "rss": line_fit(times, rss),
            "uss": line_fit(times, uss),
            **(
                {"rss_late": line_fit(times[late], rss[late]), "uss_late": line_fit(times[late], uss[late])}
                if late.sum() >= 4
                else {}
            ),
        }
    return slopes


def line_fit(times: np.ndarray, values_mb: np.ndarray) -> dict:
    """Least-squares slope in MB/hour, its standard error, and whether it is within noise (see the docstring)."""
    slope, intercept = np.polyfit(times, values_mb, 1)
    residuals = values_mb - (slope * times + intercept)
    spread = np.sum((times - times.mean()) ** 2)
    stderr = float(np.sqrt(np.sum(residuals**2) / (len(times) - 2) / spread)) if spread else float("inf")
    growth = slope * (times[-1] - times[0])
    return {
        "first_mb": round(float(values_mb[0]), 1),
        "last_mb": round(float(values_mb[-1]), 1),
        "min_mb": round(float(values_mb.min()), 1),
        "max_mb": round(float(values_mb.max()), 1),
        "slope_mb_per_hour": round(float(slope) * 3600, 2),
        "stderr_mb_per_hour": round(stderr * 3600, 2),
        "growth_over_fit_mb": round(float(growth), 2),
        "within_noise": bool(abs(slope) <= 2 * stderr or abs(growth) < MIN_GROWTH_MB),
    }


def analyse(spec: RunSpec, record: RunRecord, summary: dict, end: dict, rollout: int) -> dict:
    """Everything the docstring lists for one run, next to its raw series."""
    span = stepping(record.status)
    started_stepping = span[0]["t"] if span else None
    running = [s for s in record.samples if started_stepping is not None and s["t"] >= started_stepping]
    other = [s["other_cpu_percent"] for s in record.samples if s["other_cpu_percent"] is not None]
    gaps = np.diff([s["t"] for s in record.status]) if len(record.status) > 1 else np.array([0.0])
    kills = throughput_around_kills(record, spec.chaos_kill_every_sec / 2) if spec.chaos_kill_every_sec else []
    steady = [s for s in span if s["t"] >= started_stepping + 60]
    logged_respawns: dict[str, int] = {}
    for respawn in record.respawns:
        logged_respawns[respawn["component"]] = logged_respawns.get(respawn["component"], 0) + 1
    dropped = summary.get("respawn_dropped_trajectories", 0)
    dips = [k["steps_lost"] for k in kills]
    steady_fps = (steady[-1]["steps"] - steady[0]["steps"]) / (steady[-1]["t"] - steady[0]["t"]) if steady else None
    return {
        "spec": spec.__dict__,
        "end": end,
        "summary": summary,
        "first_steps_at_sec": started_stepping,
        "steady_fps": round(steady_fps) if steady_fps else None,
        "longest_gap_between_status_lines_sec": round(float(gaps.max()), 1),
        "respawns_logged": logged_respawns,
        "kills_logged": len(record.kills),
        "deaths_not_from_chaos": [d for d in record.deaths if d["t"] - 5.0 > last_kill_before(record, d["t"])],
        "kills": kills,
        "fps_before_mean": round(float(np.mean([k["fps_before"] for k in kills]))) if kills else None,
        "fps_after_mean": round(float(np.mean([k["fps_after"] for k in kills]))) if kills else None,
        # One window's noise is as large as a kill's cost on a cheap env: the median says more than the sum.
        "after_over_before_median": round(float(np.median([k["after_over_before"] for k in kills])), 3)
        if kills
        else None,
        "steps_lost_per_kill_median": round(float(np.median(dips))) if dips else None,
        "env_steps_lost_dropped_rollouts_at_most": dropped * rollout,
        "env_steps_lost_throughput_dips": int(sum(dips)),
        "seconds_lost_throughput_dips": round(sum(dips) / steady_fps, 1) if steady_fps else None,
        "rollout": rollout,
        "memory_warmup_sec": spec.memory_warmup_minutes * 60,
        "memory_slopes": memory_slopes(record, spec.memory_warmup_minutes * 60, span[-1]["t"] if span else 0.0),
        "shm_entries": {key: value_range(running, key) for key in ("shm_entries", "shm_entries_of_run")},
        "other_cpu_percent": {"mean": round(float(np.mean(other))), "max": max(other)} if other else None,
        "record": record.__dict__,
    }


def value_range(samples: list[dict], key: str) -> dict | None:
    """min, max and whether they are equal, of ``key`` over the samples that hold it."""
    values = [s[key] for s in samples if s.get(key) is not None]
    return {"min": min(values), "max": max(values), "flat": min(values) == max(values)} if values else None


def last_kill_before(record: RunRecord, t: float) -> float:
    """The time of the last chaos kill at or before ``t`` (minus infinity if none)."""
    return max((k["t"] for k in record.kills if k["t"] <= t + 0.5), default=float("-inf"))


def compare_returns(chaos: RunRecord, baseline: RunRecord, solved_return: float) -> dict:
    """The chaos run's return against the baseline's at equal env steps, over the steps both reached."""
    curves = []
    for record in (chaos, baseline):
        points = [(s["steps"], s["return"]) for s in record.status if s["return"] is not None and s["steps"] > 0]
        curves.append((np.array([p[0] for p in points]), np.array([p[1] for p in points])))
    (chaos_steps, chaos_return), (base_steps, base_return) = curves
    solved = {
        name: next((int(s) for s, r in zip(steps, returns) if r >= solved_return), None)
        for name, (steps, returns) in zip(("chaos", "baseline"), curves)
    }
    if not len(chaos_steps) or not len(base_steps):
        return {"solved_return": solved_return, "first_steps_at_solved_return": solved}
    low, high = max(chaos_steps[0], base_steps[0]), min(chaos_steps[-1], base_steps[-1])
    grid = np.linspace(low, high, 50)
    at_chaos, at_base = np.interp(grid, chaos_steps, chaos_return), np.interp(grid, base_steps, base_return)
    quarters = [int(low + q * (high - low)) for q in (0.25, 0.5, 0.75, 1.0)]
    return {
        "overlap_env_steps": [int(low), int(high)],
        "mean_return_over_overlap": {
            "chaos": round(float(at_chaos.mean()), 2),
            "baseline": round(float(at_base.mean()), 2),
        },
        "mean_abs_difference_over_overlap": round(float(np.abs(at_chaos - at_base).mean()), 2),
        "at_steps": {
            str(s): {
                "chaos": round(float(np.interp(s, chaos_steps, chaos_return)), 2),
                "baseline": round(float(np.interp(s, base_steps, base_return)), 2),
            }
            for s in quarters
        },
        "solved_return": solved_return,
        "first_steps_at_solved_return": solved,
    }


def plot(runs: dict[str, dict], title: str, path: Path) -> None:
    """RSS per process, FPS, /dev/shm and descriptors against time with the kills marked; return against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chaos = runs["chaos"]["record"]
    figure, axes = plt.subplots(4, 1, figsize=(10, 12))
    axes[0].sharex(axes[2])
    axes[1].sharex(axes[2])
    names = sorted({n for s in chaos["samples"] for n in s["processes"] if n == "runner" or n.startswith("sfe-")})
    minutes = [s["t"] / 60 for s in chaos["samples"]]
    for name in names:
        rss = [s["processes"].get(name, {}).get("rss_mb", np.nan) for s in chaos["samples"]]
        axes[0].plot(minutes, rss, marker=".", label=name)
    axes[0].set_ylabel("RSS MB")
    axes[0].legend(fontsize=7, ncol=3)
    for label, run in runs.items():
        status = run["record"]["status"]
        style, at = ("-" if label == "chaos" else "--"), [s["t"] / 60 for s in status]
        axes[1].plot(at, [s["fps_10s"] for s in status], style, lw=0.5, alpha=0.5, label=f"{label}, 10 s")
        axes[1].plot(at, [s["fps_60s"] for s in status], style, lw=1.2, label=f"{label}, 60 s")
    axes[1].set_ylabel("FPS")
    axes[1].legend(fontsize=7, loc="upper left")
    other = axes[1].twinx()
    other.plot(minutes, [s["other_cpu_percent"] for s in chaos["samples"]], "k:", lw=0.8)
    other.set_ylim(0, 200)  # both cores
    other.set_ylabel("CPU % outside the run (dotted)", fontsize=7)
    axes[2].plot(minutes, [s["shm_entries"] for s in chaos["samples"]], marker=".", label="/dev/shm entries, all")
    of_run = [s.get("shm_entries_of_run") for s in chaos["samples"]]
    if any(n is not None for n in of_run):
        axes[2].plot(minutes, of_run, marker="x", ls="", label="/dev/shm entries the run maps or holds open")
    fds = [sum(p["fds"] for p in s["processes"].values()) for s in chaos["samples"]]
    axes[2].plot(minutes, fds, marker=".", label="open descriptors, whole tree")
    axes[2].set_ylabel("count")
    axes[2].set_xlabel("minutes since start")
    axes[2].legend(fontsize=7)
    for axis in axes[:3]:
        for kill in chaos["kills"]:
            color = "tab:red" if kill["component"].startswith("rollout") else "tab:purple"
            axis.axvline(kill["t"] / 60, color=color, lw=0.5, alpha=0.6)
    for label, run in runs.items():
        status = [s for s in run["record"]["status"] if s["return"] is not None]
        axes[3].plot([s["steps"] for s in status], [s["return"] for s in status], lw=0.8, label=label)
    axes[3].set_xlabel("env steps")
    axes[3].set_ylabel("return (last 100 episodes)")
    axes[3].legend(fontsize=7)
    axes[0].set_title(f"{title}\nkills: red = rollout worker, purple = inference worker", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def soak(specs: dict[str, RunSpec], solved_return: float, startup_sec: float, out: Path) -> None:
    """Run the chaos run (and its baseline, if in ``specs``), analyse them, write the JSON and the plot."""
    chaos_spec = specs["chaos"]
    runs = {}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sfe_soak_") as tmp:
        for label, spec in specs.items():
            record, summary, end = run_engine(spec, Path(tmp), startup_sec)
            config = json.loads((Path(tmp) / spec.label / "config.json").read_text())
            env = config["env"]["env"]
            runs[label] = analyse(spec, record, summary, end, config["sampler"]["rollout"])
            runs[label]["layout"] = {k: config["sampler"][k] for k in ("num_workers", "num_envs_per_worker")}
            # The log without its status lines: the kills, deaths and respawns, and anything else said.
            events = [
                line
                for line in Path(end["log"]).read_text().splitlines()
                if not STATUS.match(line[10:]) and not line[10:].startswith("           ") and not NOISE.search(line)
            ]
            (out / f"soak_{safe(env)}_{label}_events.log").write_text("\n".join(events[:3000]) + "\n")
            print(f"[soak] {label}: {json.dumps({k: v for k, v in runs[label].items() if k != 'record'})}", flush=True)
    report = {
        "env": env,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "runs": runs,
    }
    if "baseline" in runs:
        chaos, baseline = RunRecord(**runs["chaos"]["record"]), RunRecord(**runs["baseline"]["record"])
        report["returns_chaos_vs_baseline"] = compare_returns(chaos, baseline, solved_return)
        # The chaos run's own rate over the baseline's steady span (same minutes since start), against the baseline.
        span = (runs["baseline"]["first_steps_at_sec"] + 60, stepping(baseline.status)[-1]["t"])
        report["fps_over_baseline_span"] = {
            "span_sec": [round(t, 1) for t in span],
            "baseline": runs["baseline"]["steady_fps"],
            "chaos": round((steps_at(chaos.status, span[1]) - steps_at(chaos.status, span[0])) / (span[1] - span[0])),
        }
        print(f"[soak] returns: {json.dumps(report['returns_chaos_vs_baseline'])}", flush=True)
    (out / f"soak_{safe(env)}.json").write_text(json.dumps(report, indent=1) + "\n")
    cores, memory = report["machine"]["cores"], report["machine"]["memory_gb"]
    title = (
        f"{env}: {chaos_spec.minutes:g} min, chaos every {chaos_spec.chaos_kill_every_sec:g} s; "
        f"{cores}-core CPU, {memory} GB, no GPU; {report['date']}"
    )
    plot(runs, title, out / f"soak_{safe(env)}.png")


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Any other option is a python -m sfengine.train option of the chaos and baseline runs.",
        allow_abbrev=False,  # an abbreviation could swallow an engine option
    )
    parser.add_argument("--env", default="CartPole-v1", help="env of the chaos and baseline runs")
    parser.add_argument("--num_workers", type=int, default=2, help="rollout workers of the chaos and baseline runs")
    parser.add_argument("--num_envs_per_worker", type=int, default=4, help="envs per rollout worker (same runs)")
    parser.add_argument("--worker_num_splits", type=int, default=2, help="splits per rollout worker (same runs)")
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the chaos run")
    parser.add_argument("--chaos_kill_every_sec", type=float, default=60.0, help="kill period of the chaos run")
    parser.add_argument("--baseline_minutes", type=float, default=5.0, help="length of the run without chaos")
    parser.add_argument("--skip_baseline", action="store_true", help="no baseline run (no return comparison)")
    parser.add_argument("--sample_every_sec", type=float, default=60.0, help="seconds between memory samples")
    parser.add_argument(
        "--memory_warmup_minutes", type=float, default=5.0, help="samples before this are left out of the slopes"
    )
    parser.add_argument("--report_every_sec", type=float, default=2.0, help="the engine's status line period")
    parser.add_argument("--solved_return", type=float, default=475.0, help="the return called solved (CartPole)")
    parser.add_argument("--libero_minutes", type=float, default=10.0, help="length of the LIBERO-Object run")
    parser.add_argument(
        "--libero_chaos_kill_every_sec", type=float, default=120.0, help="kill period of the LIBERO-Object run"
    )
    parser.add_argument(
        "--libero_sample_every_sec", type=float, default=30.0, help="seconds between its memory samples"
    )
    parser.add_argument(
        "--libero_memory_warmup_minutes", type=float, default=3.0, help="its samples left out of the slopes"
    )
    parser.add_argument("--skip_libero", action="store_true", help="no LIBERO-Object run")
    parser.add_argument(
        "--startup_sec", type=float, default=300.0, help="a run still going this long after its end is stopped"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the result files")
    args, engine_args = parser.parse_known_args()
    for name in ("minutes", "baseline_minutes", "sample_every_sec", "report_every_sec", "libero_minutes"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name}={getattr(args, name):g} must be positive")
    for name in ("chaos_kill_every_sec", "libero_chaos_kill_every_sec"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name}={getattr(args, name):g} must be positive: a soak without chaos is the baseline")
    layout = [
        f"--env={args.env}",
        f"--num_workers={args.num_workers}",
        f"--num_envs_per_worker={args.num_envs_per_worker}",
        f"--worker_num_splits={args.worker_num_splits}",
        f"--report_every_sec={args.report_every_sec:g}",
        *engine_args,
    ]
    try:
        parse_config(layout)
    except ConfigError as exc:
        parser.error(str(exc))
    main_runs = {
        "chaos": RunSpec(
            "chaos", layout, args.minutes, args.chaos_kill_every_sec, args.sample_every_sec, args.memory_warmup_minutes
        )
    }
    if not args.skip_baseline:
        main_runs["baseline"] = RunSpec(
            "baseline", layout, args.baseline_minutes, 0.0, args.sample_every_sec, args.memory_warmup_minutes
        )
    soak(main_runs, args.solved_return, args.startup_sec, args.out)
    if not args.skip_libero:
        libero = RunSpec(
            "chaos",
            ["--env=libero_object", f"--report_every_sec={args.report_every_sec:g}"],
            args.libero_minutes,
            args.libero_chaos_kill_every_sec,
            args.libero_sample_every_sec,
            args.libero_memory_warmup_minutes,
        )
        soak({"chaos": libero}, args.solved_return, args.startup_sec, args.out)


if __name__ == "__main__":
    main()
