"""Where the memory of a LIBERO rollout worker goes: proportional memory (PSS) per process, per env and per simulator.

    python -m benchmarks.libero_memory --env=libero_object
    python -m benchmarks.libero_memory --phases=engine --engine=2x2x10 --engine_env=MALLOC_ARENA_MAX=2

Every figure is read from ``/proc/<pid>/smaps_rollup`` in MB: Rss, Pss, Pss_Anon, Pss_File, Pss_Shmem and the
Shared/Private split. RSS counts a shared page fully in every process that maps it (torch's libraries, the
trajectory buffers); PSS divides it among them, so the PSS of all processes sums to what the machine holds. Phases
(``--phases``, all by default; each runs in fresh processes, one at a time):

    imports  a bare Python process: at start, after ``import torch``, after LIBERO and robosuite (no simulator), and
             after the engine's own modules (what a spawned rollout worker imports before its envs).
    bare     a bare process (no engine) builds N envs of the engine's factory with ``--libero_sim_cache=K`` and
             resets each through K distinct tasks, so every env holds K simulators (``--points=NxK,...``; each
             point can be run with torch or the engine's modules imported first, ``--bare_imports``). The slope of
             PSS against N*K is the memory of one simulator, against N that of one env without a simulator.
             ``--evict_point=NxK`` also cycles every env through all tasks twice (a K below the suite's task count
             evicts and rebuilds), then reports PSS after ``gc.collect()`` and after glibc's ``malloc_trim(0)``.
             ``--trim_each_build`` calls ``malloc_trim(0)`` after every build instead.
    limit    the limit row of ``benchmarks.throughput`` (``--limit=WxExK``: spawned processes stepping their envs in a
             loop, no engine) with the probe below in each process: the simulators its envs hold and which tasks
             each env built. That row is the "bare process" of the throughput tables.
    engine   ``python -m sfengine.train --benchmark=true`` (sampling only) with ``--engine=WxExK`` (workers x envs per
             worker x sim cache; several allowed). Every process of the tree (sfe-rollout-*, sfe-inference-*,
             sfe-learner, the main process) is sampled every ``--sample_every`` seconds. A probe (a sitecustomize
             module put on PYTHONPATH for this run only; the engine's files are not touched) reports from inside each
             rollout worker how many simulators its envs hold and have built, the worker's PSS just before its
             first simulator, and, on SIGUSR2, its PSS before and after ``gc.collect()`` and ``malloc_trim(0)``. The
             run is stopped (SIGINT, the engine's graceful stop) once every worker holds its envs x K simulators and
             ``--settle`` seconds passed, or at ``--engine_timeout``. ``--engine_env=VAR=VALUE`` sets an environment
             variable for every process of the invocation, bare points included (``MALLOC_ARENA_MAX=2``);
             ``--trim_each_build`` has the probe call ``malloc_trim(0)`` after each build in the rollout workers.

The figures go to ``--out`` (``benchmarks/results/libero_memory.json``; ``--merge`` adds to it, ``--tag`` names the
blocks of one invocation), with the machine and the commit. Building a simulator costs 2-4 s on the 2-core machine:
the defaults take about 12 minutes. A rollout worker's figures to compare with a bare point are the probe's
``usr2_before`` (untrimmed) and ``usr2_after_trim``; the engine's ``final`` sample is taken after the SIGUSR2 trim.
Short episodes (``--max_episode_steps``, default 20) make the engine's envs cycle through the tasks, and so build
their simulators, quickly; memory does not depend on the episode length.

To measure another checkout, run this module from it with PYTHONPATH naming it first (child processes inherit it).
The committed results come from the defaults, then ``--merge`` invocations: ``--points=1x10 --compare_point=
--evict_point=`` with ``--trim_each_build``, ``--engine_env=MALLOC_ARENA_MAX=2`` and
``--engine_env=MALLOC_MMAP_THRESHOLD_=131072``; ``--phases=engine`` with ``--engine_env=MALLOC_ARENA_MAX=2``, with
``--trim_each_build`` and (``--tag=training``) with ``--engine_arg=--benchmark=false --settle=40``;
``--tag=libero_spatial`` and ``--tag=libero_10`` bare points; ``--tag=rgb64`` with ``--bare_arg=--libero_obs_mode=rgb
--bare_arg=--libero_image_size=64 --points=1x1,1x2,1x4``; the ``strip_textures*`` tags from a scratch copy (see the
results' ``measured_on``); ``--tag=head`` on a later commit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIELDS = (
    "Rss",
    "Pss",
    "Pss_Anon",
    "Pss_File",
    "Pss_Shmem",
    "Shared_Clean",
    "Shared_Dirty",
    "Private_Clean",
    "Private_Dirty",
    "Anonymous",
)
SAMPLED_FIELDS = ("Rss", "Pss", "Pss_Anon")  # of the periodic samples of an engine run (the final one has all)
RESULT_PREFIX = "LIBERO_MEMORY_RESULT "
PROBE_DIR_VAR = "LIBERO_MEMORY_PROBE_DIR"


def smaps(pid: int | str = "self") -> dict[str, float]:
    """The fields of /proc/<pid>/smaps_rollup in MB (empty if the process is gone)."""
    values = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB" and parts[0].rstrip(":") in FIELDS:
                    values[parts[0].rstrip(":")] = round(int(parts[1]) / 1024, 1)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    return values


def malloc_trim() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


# ----------------------------------------------------------------------------------------------- the probe
# Put on PYTHONPATH as sitecustomize.py for an engine run: every process of the tree imports it at start. It patches
# LiberoSuiteEnv when sfengine_envs.libero_suite is imported (an import hook), and writes <probe dir>/<pid>.json.
PROBE_SOURCE = r"""
import os, sys
_DIR = os.environ.get("LIBERO_MEMORY_PROBE_DIR")
if _DIR:
    import ctypes, gc, importlib.abc, json, signal, time, weakref

    _FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Shared_Clean", "Shared_Dirty", "Private_Clean",
               "Private_Dirty", "Anonymous")
    _envs = weakref.WeakSet()
    _state = {"pid": os.getpid(), "sims_built": 0, "envs_created": 0, "events": []}

    def _smaps():
        out = {}
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                p = line.split()
                if len(p) == 3 and p[2] == "kB" and p[0].rstrip(":") in _FIELDS:
                    out[p[0].rstrip(":")] = round(int(p[1]) / 1024, 1)
        return out

    def _write(event, **extra):
        with open("/proc/self/comm") as f:
            _state["title"] = f.read().strip()
        held = sum(len(env.sims) for env in list(_envs))
        _state.update(envs_alive=len(_envs), sims_held=held)
        event = {"t": time.time(), "event": event, "sims_held": held, "sims_built": _state["sims_built"]}
        _state["events"].append({**event, "mem": _smaps(), **extra})
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(_state, f)
        os.replace(path + ".tmp", path)

    def _patch(module):
        cls = module.LiberoSuiteEnv
        init, switch = cls.__init__, cls._switch_to

        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            _envs.add(self)
            self._probe_index = _state["envs_created"]
            _state["envs_created"] += 1

        def _switch_to(self, task):
            builds = self.sims_built
            if builds == 0 and _state["sims_built"] == 0:
                _write("before_first_sim")
            switch(self, task)
            if self.sims_built != builds:
                _state["sims_built"] += 1
                if os.environ.get("LIBERO_MEMORY_PROBE_TRIM"):
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                _write("built", task=task, env=self._probe_index)

        cls.__init__, cls._switch_to = __init__, _switch_to

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sfengine_envs.libero_suite":
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def patched(module):
                exec_module(module)
                _patch(module)

            spec.loader.exec_module = patched
            return spec

    sys.meta_path.insert(0, _Hook())

    def _on_usr2(signum, frame):
        _write("usr2_before")
        gc.collect()
        _write("usr2_after_gc")
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        _write("usr2_after_trim")

    signal.signal(signal.SIGUSR2, _on_usr2)
"""


# ----------------------------------------------------------------------------------------------- child processes


def engine_imports() -> None:
    """What a spawned rollout worker imports before its envs: the main module (sfengine.train) and the runner."""
    import sfengine.engine.runner  # noqa: F401
    import sfengine.train  # noqa: F401


def child_imports(env: str) -> dict:
    stages = {"python": smaps()}
    import torch  # noqa: F401

    stages["torch"] = smaps()
    from sfengine_envs import libero_fast_step  # noqa: F401  (mujoco, robosuite)
    from sfengine_envs.libero_suite import import_libero, load_suite

    import_libero()
    load_suite(env)
    stages["torch+libero"] = smaps()
    engine_imports()
    stages["torch+libero+engine"] = smaps()
    return {"stages": stages, "modules": len(sys.modules)}


def child_imports_libero_only(env: str) -> dict:
    stages = {"python": smaps()}
    from sfengine_envs import libero_fast_step  # noqa: F401
    from sfengine_envs.libero_suite import import_libero, load_suite

    import_libero()
    load_suite(env)
    stages["libero"] = smaps()
    return {"stages": stages, "torch_imported": "torch" in sys.modules}


def make_envs(env: str, n: int, sim_cache: int, extra_args: list[str]) -> list:
    """N envs from the engine's own factory, configured from a flat command line as a rollout worker receives it."""
    from sfengine.config import parse_config
    from sfengine.env import registry as env_registry

    cfg = parse_config([f"--env={env}", f"--libero_sim_cache={sim_cache}", *extra_args])
    factory = env_registry.resolve_env_factory(env)
    if hasattr(env_registry, "env_context"):  # env options declared next to the env (ctx.options)
        contexts = [env_registry.env_context(cfg, 0, i, i) for i in range(n)]
    else:  # the options in the engine's EnvConfig (before 3f290c9)
        contexts = [env_registry.EnvContext(env, 0, i, i, cfg.env.max_episode_steps, cfg.env) for i in range(n)]
    envs = [factory(ctx) for ctx in contexts]
    if envs[0].unwrapped.sim_cache != sim_cache:
        raise RuntimeError(f"the env keeps {envs[0].unwrapped.sim_cache} simulators, not the {sim_cache} asked for")
    return envs


def child_bare(env: str, n: int, k: int, imports: str, cycles: int, trim: bool, extra_args: list[str]) -> dict:
    import gc

    import numpy as np

    stages = {"start": smaps()}
    if imports in ("torch", "engine"):
        import torch  # noqa: F401
    if imports == "engine":
        engine_imports()
    stages["imports"] = smaps()
    envs = make_envs(env, n, k, extra_args)
    stages["envs_built"] = smaps()
    rng = np.random.default_rng(0)
    num_tasks = envs[0].unwrapped.num_tasks

    def episode(e, task: int, steps: int = 5) -> None:
        built = e.unwrapped.sims_built
        e.reset(options={"task": task, "init_state": 0})
        if trim and e.unwrapped.sims_built != built:
            malloc_trim()  # what a rollout worker would do after building a simulator
        for _ in range(steps):
            e.step(rng.uniform(-1, 1, 7).astype(np.float32))

    started = time.perf_counter()
    for i, e in enumerate(envs):
        for j in range(k):
            episode(e, (i + j) % num_tasks)
    out = {"build_seconds": round(time.perf_counter() - started, 1)}
    stages["filled"] = smaps()
    if cycles:
        for _ in range(cycles):
            for task in range(num_tasks):
                for e in envs:
                    episode(e, task, steps=2)
        stages["cycled"] = smaps()
        gc.collect()
        stages["cycled_gc"] = smaps()
        malloc_trim()
        stages["cycled_gc_trim"] = smaps()
    else:
        gc.collect()
        stages["filled_gc"] = smaps()
        malloc_trim()
        stages["filled_gc_trim"] = smaps()
    out.update(
        stages=stages,
        sims_held=sum(len(e.unwrapped.sims) for e in envs),
        sims_built=sum(e.unwrapped.sims_built for e in envs),
        torch_imported="torch" in sys.modules,
        malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        trim_each_build=trim,
    )
    for e in envs:
        e.close()
    return out


def run_child(args: list[str], env: dict | None = None, timeout: float = 1800) -> dict:
    command = [sys.executable, "-m", "benchmarks.libero_memory", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise RuntimeError(f"{' '.join(command)} failed (exit {run.returncode}): {run.stderr[-2000:]}")


# ----------------------------------------------------------------------------------------------- the engine


def process_role(process) -> str:
    name = process.name()
    if name.startswith("sfe-"):
        return name
    cmdline = " ".join(process.cmdline())
    if "sfengine.train" in cmdline:
        return "main"
    if "resource_tracker" in cmdline:
        return "resource_tracker"
    return name


def read_probes(directory: Path) -> dict[int, dict]:
    probes = {}
    for path in directory.glob("*.json"):
        try:
            probes[int(path.stem)] = json.loads(path.read_text())
        except (ValueError, json.JSONDecodeError):
            pass  # being written: the next sample reads it
    return probes


def probed_environment(extra_env: dict[str, str], trim_each_build: bool) -> tuple[Path, Path, dict[str, str]]:
    """A work directory, its probe directory, and the environment that loads the probe in every process."""
    work = Path(tempfile.mkdtemp(prefix="libero_memory_"))
    probe_dir = work / "probe"
    probe_dir.mkdir()
    (work / "site").mkdir()
    (work / "site" / "sitecustomize.py").write_text(PROBE_SOURCE)
    environment = {**os.environ, **extra_env, PROBE_DIR_VAR: str(probe_dir)}
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / "site"), os.environ.get("PYTHONPATH")) if p)
    if trim_each_build:
        environment["LIBERO_MEMORY_PROBE_TRIM"] = "1"
    return work, probe_dir, environment


def run_limit(env: str, layout: str, args: argparse.Namespace, extra_env: dict[str, str]) -> dict:
    """The limit row of benchmarks.throughput (spawned processes stepping their envs in a loop, no engine), with the
    probe in each: how many simulators its envs hold at the end, which tasks it built, its PSS at its last build."""
    import shutil

    workers, envs_per_worker, sim_cache = (int(x) for x in layout.split("x"))
    work, probe_dir, environment = probed_environment(extra_env, args.trim_each_build)
    try:
        row = run_child(
            [
                f"--env={env}",
                "--child=limit",
                f"--n={envs_per_worker}",
                f"--k={sim_cache}",
                f"--limit_workers={workers}",
                f"--limit_seconds={args.limit_seconds}",
                f"--max_episode_steps={args.max_episode_steps}",
            ],
            environment,
        )
        probes = read_probes(probe_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    processes = {}
    for pid, probe in probes.items():
        if not probe.get("sims_built"):
            continue  # a process that built no simulator (the launcher)
        last = probe["events"][-1]
        processes[str(pid)] = {
            "sims_held": probe.get("sims_held"),
            "sims_built": probe.get("sims_built"),
            "envs_created": probe.get("envs_created"),
            "pss_at_last_build_mb": last["mem"].get("Pss"),
            "rss_at_last_build_mb": last["mem"].get("Rss"),
            "tasks_built_by_env": {
                str(env): [e["task"] for e in probe["events"] if e["event"] == "built" and e.get("env") == env]
                for env in sorted({e.get("env") for e in probe["events"] if e["event"] == "built"})
            },
        }
    return {
        "layout": {"num_workers": workers, "num_envs_per_worker": envs_per_worker, "libero_sim_cache": sim_cache},
        "max_episode_steps": args.max_episode_steps,
        "row": row,
        "processes": processes,
    }


def child_limit(env: str, workers: int, envs_per_worker: int, sim_cache: int, seconds: float, steps: int) -> dict:
    from benchmarks.throughput import run_limit as throughput_limit
    from sfengine.config import parse_config

    cfg = parse_config(
        [
            f"--env={env}",
            f"--num_workers={workers}",
            f"--num_envs_per_worker={envs_per_worker}",
            f"--libero_sim_cache={sim_cache}",
            f"--max_episode_steps={steps}",
        ]
    )
    return throughput_limit(cfg, seconds / 2, seconds / 2)


def run_engine(env: str, layout: str, args: argparse.Namespace, extra_env: dict[str, str]) -> dict:
    import psutil

    workers, envs_per_worker, sim_cache = (int(x) for x in layout.split("x"))
    target = envs_per_worker * sim_cache
    work, probe_dir, environment = probed_environment(extra_env, args.trim_each_build)
    command = [
        sys.executable,
        "-m",
        "sfengine.train",
        f"--env={env}",
        "--benchmark=true",
        f"--num_workers={workers}",
        f"--num_envs_per_worker={envs_per_worker}",
        f"--libero_sim_cache={sim_cache}",
        f"--max_episode_steps={args.max_episode_steps}",
        f"--train_for_seconds={args.engine_timeout + 60}",
        f"--train_dir={work / 'train_dir'}",
        "--experiment=libero_memory",
        "--restart_behavior=overwrite",
        "--report_every_sec=5",
        *args.engine_args,
    ]
    started = time.time()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(process.pid)
    samples, full_since, stop_reason = [], None, "timeout"
    log_lines: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: log_lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        while time.time() - started < args.engine_timeout:
            time.sleep(args.sample_every)
            if process.poll() is not None:
                stop_reason = f"exited {process.returncode}"
                break
            probes = read_probes(probe_dir)
            sample = {"t": round(time.time() - started, 1), "processes": {}}
            for p in [root, *root.children(recursive=True)]:
                try:
                    role = process_role(p)
                    mem = {k: v for k, v in smaps(p.pid).items() if k in SAMPLED_FIELDS}
                    sample["processes"][f"{role}:{p.pid}"] = {"role": role, "pid": p.pid, "mem": mem}
                    if p.pid in probes:
                        sample["processes"][f"{role}:{p.pid}"]["sims_held"] = probes[p.pid].get("sims_held")
                        sample["processes"][f"{role}:{p.pid}"]["sims_built"] = probes[p.pid].get("sims_built")
                except psutil.NoSuchProcess:
                    pass
            samples.append(sample)
            rollout = [v for v in sample["processes"].values() if v["role"].startswith("sfe-rollout")]
            if len(rollout) == workers and all((v.get("sims_held") or 0) >= target for v in rollout):
                full_since = full_since or time.time()
                if time.time() - full_since >= args.settle:
                    stop_reason = "every worker holds its simulators"
                    break
        rollout_pids = [p.pid for p in root.children(recursive=True) if p.name().startswith("sfe-rollout")]
        if stop_reason == "every worker holds its simulators":
            for pid in rollout_pids:
                os.kill(pid, signal.SIGUSR2)
            time.sleep(5)
    finally:
        final = {}
        for p in [root, *root.children(recursive=True)]:
            try:
                final[f"{process_role(p)}:{p.pid}"] = {"role": process_role(p), "pid": p.pid, "mem": smaps(p.pid)}
            except psutil.NoSuchProcess:
                pass
        probes = read_probes(probe_dir)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(90)
            except subprocess.TimeoutExpired:
                for p in [root, *root.children(recursive=True)]:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                process.wait(10)
        reader.join(5)
    for pid, probe in probes.items():
        key = next((k for k, v in final.items() if v["pid"] == pid), None)
        if key:
            final[key]["probe"] = probe
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return {
        "layout": {"num_workers": workers, "num_envs_per_worker": envs_per_worker, "libero_sim_cache": sim_cache},
        "environment": extra_env,
        "trim_each_build": args.trim_each_build,
        "command": " ".join(command[1:]),
        "stop_reason": stop_reason,
        "seconds": round(time.time() - started, 1),
        "final": final,
        "samples": samples,
        "log_tail": [line.rstrip() for line in log_lines[-15:]],
    }


# ----------------------------------------------------------------------------------------------- analysis


def fit(points: list[tuple[float, float, float]]) -> dict:
    """PSS = base + per_env * N + per_sim * N*K by least squares over (N, K, PSS) points."""
    import numpy as np

    a = np.array([[1.0, n, n * k] for n, k, _ in points])
    y = np.array([p for _, _, p in points])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ coef
    return {
        "base_mb": round(float(coef[0]), 1),
        "per_env_mb": round(float(coef[1]), 1),
        "per_sim_mb": round(float(coef[2]), 1),
        "max_residual_mb": round(float(abs(residual).max()), 1),
    }


def line(points: list[tuple[float, float]]) -> dict:
    """PSS = base + per_sim * simulators by least squares over (simulators, PSS) points."""
    import numpy as np

    x, y = np.array(points, dtype=float).T
    slope, intercept = np.polyfit(x, y, 1)
    return {"base_mb": round(float(intercept), 1), "per_sim_mb": round(float(slope), 1)}


def summarise_engine(run: dict) -> dict:
    """Per role: the final PSS/RSS, and for rollout workers the probe's figures."""
    out = {}
    for key, proc in run["final"].items():
        entry = {"pss_mb": proc["mem"].get("Pss"), "rss_mb": proc["mem"].get("Rss"), "mem": proc["mem"]}
        probe = proc.get("probe")
        if probe:
            events = probe["events"]
            first = next((e for e in events if e["event"] == "before_first_sim"), None)
            usr2 = {e["event"]: e["mem"] for e in events if e["event"].startswith("usr2_")}
            entry.update(
                sims_held=probe.get("sims_held"),
                sims_built=probe.get("sims_built"),
                envs_created=probe.get("envs_created"),
                before_first_sim=first["mem"] if first else None,
                usr2=usr2 or None,
            )
        out[key] = entry
    peaks: dict[str, float] = {}
    for sample in run["samples"]:
        for key, proc in sample["processes"].items():
            peaks[key] = max(peaks.get(key, 0.0), proc["mem"].get("Pss", 0.0))
    for key, peak in peaks.items():
        if key in out:
            out[key]["peak_sampled_pss_mb"] = peak
    out["total"] = {
        "pss_mb": round(sum(e["pss_mb"] or 0 for e in out.values()), 1),
        "rss_mb": round(sum(e["rss_mb"] or 0 for e in out.values()), 1),
    }
    return out


# ----------------------------------------------------------------------------------------------- summary


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 1) if values else None


def rollout_workers(run: dict) -> list[dict]:
    return [e for key, e in run["summary"].items() if key.startswith("sfe-rollout")]


def worker_pss(run: dict, event: str) -> float | None:
    """The mean PSS of a run's rollout workers at a probe event (usr2_before: untrimmed, usr2_after_trim)."""
    return mean([(w.get("usr2") or {}).get(event, {}).get("Pss") for w in rollout_workers(run)])


def other_processes(run: dict) -> dict:
    roles = {}
    for key, e in run["summary"].items():
        if key != "total" and not key.startswith("sfe-rollout"):
            roles[key.split(":")[0]] = {
                "pss_mb": e["pss_mb"],
                "rss_mb": e["rss_mb"],
                "peak_pss_mb": e.get("peak_sampled_pss_mb"),
            }
    roles["sum_pss_mb"] = round(sum(r["pss_mb"] for r in roles.values()), 1)
    return roles


def compare_with_bare(run: dict, points: dict[str, dict]) -> dict:
    """A run's rollout workers against bare processes holding the same envs and simulators (untrimmed/trimmed)."""
    workers = rollout_workers(run)

    def at(event: str, field: str) -> float | None:
        return mean([(w.get("usr2") or {}).get(event, {}).get(field) for w in workers])

    compare = {
        "engine_rollout_worker": {
            "untrimmed_pss_mb": at("usr2_before", "Pss"),
            "trimmed_pss_mb": at("usr2_after_trim", "Pss"),
            "untrimmed_pss_anon_mb": at("usr2_before", "Pss_Anon"),
            "trimmed_pss_anon_mb": at("usr2_after_trim", "Pss_Anon"),
            "pss_file_mb": at("usr2_after_trim", "Pss_File"),
            "sims_held": [w.get("sims_held") for w in workers],
            "sims_built": [w.get("sims_built") for w in workers],
            "envs_created": [w.get("envs_created") for w in workers],
            "pss_before_first_simulator_mb": mean([(w.get("before_first_sim") or {}).get("Pss") for w in workers]),
            "pss_shmem_mb": mean([w["mem"].get("Pss_Shmem") for w in workers]),
            "rss_minus_pss_mb": mean([w["rss_mb"] - w["pss_mb"] for w in workers]),
        }
    }
    for key, point in points.items():
        filled, trimmed = point["stages"]["filled"], point["stages"]["filled_gc_trim"]
        compare[f"bare_{key.split(':')[1]}_imported"] = {
            "untrimmed_pss_mb": filled["Pss"],
            "trimmed_pss_mb": trimmed["Pss"],
            "untrimmed_pss_anon_mb": filled["Pss_Anon"],
            "trimmed_pss_anon_mb": trimmed["Pss_Anon"],
            "pss_file_mb": trimmed["Pss_File"],
            "sims_held": point["sims_held"],
        }
    return compare


def summarise(results: dict) -> dict:
    """The figures the report quotes, derived from the blocks present (any missing block is skipped)."""
    out: dict = {}
    bare = results.get("bare", {}).get("points", {})
    engine = {k: v for k, v in results.get("engine", {}).items() if k != "env"}
    base = engine.get("2x2x10")
    # The default invocation, and the check on a later commit (--tag=head, and --tag=head_engine_imports for its
    # bare point with the engine's modules imported).
    for tag, bare_blocks in (("", ("bare",)), ("_head", ("bare_head", "bare_head_engine_imports"))):
        run = results.get(f"engine{tag}", {}).get("2x2x10")
        points = {
            key: point
            for name in bare_blocks
            for key, point in results.get(name, {}).get("points", {}).items()
            if key in ("2x10:none", "2x10:torch", "2x10:engine")
        }
        if run and points:
            out[f"rollout_worker_against_bare_2_envs_x_10_simulators{tag}"] = compare_with_bare(run, points)
    limit = results.get("limit", {}).get("2x2x10")
    if limit:
        out["throughput_limit_row_2x2x10"] = {
            "env_process_peak_rss_mb": limit["row"].get("env_process_peak_rss_mb"),
            "processes": {
                pid: {k: p[k] for k in ("sims_held", "pss_at_last_build_mb", "tasks_built_by_env")}
                for pid, p in limit["processes"].items()
            },
        }
    imports = results.get("imports")
    if imports:
        torch_first = imports["torch_first"]["stages"]
        out["imports_pss_mb"] = {
            "python": torch_first["python"]["Pss"],
            "torch": torch_first["torch"]["Pss"],
            "torch_libero": torch_first["torch+libero"]["Pss"],
            "torch_libero_engine": torch_first["torch+libero+engine"]["Pss"],
            "libero_without_torch": imports["libero_only"]["stages"]["libero"]["Pss"],
        }
    slopes = {}
    for name, block in results.items():
        if name.startswith("bare") and isinstance(block, dict):
            line = block.get("line_pss_filled_gc_trim_5_or_more_sims")
            untrimmed = block.get("line_pss_filled_5_or_more_sims")
            if line:
                slopes[name] = {"env": block.get("env"), "trimmed": line, "untrimmed": untrimmed}
    if "2x2x3" in engine and base:
        for event in ("usr2_before", "usr2_after_trim"):
            low, high = worker_pss(engine["2x2x3"], event), worker_pss(base, event)
            if low and high:
                slope = (high - low) / 14
                slopes.setdefault("engine_6_to_20_simulators", {})[event] = {
                    "per_sim_mb": round(slope, 1),
                    "base_mb": round(high - 20 * slope, 1),
                }
    out["per_simulator_lines"] = slopes
    out["other_processes"] = {
        name: other_processes(block[layout])
        for name, layout in (("benchmark", "2x2x10"), ("training", "2x2x10"))
        for block in [results.get("engine" if name == "benchmark" else "engine_training", {})]
        if layout in block
    }
    treatments = {}
    for key, run in engine.items():
        if key != "2x2x10":
            treatments[key] = {"untrimmed_pss_mb": worker_pss(run, "usr2_before")}
    for name, block in results.items():
        if name.startswith("engine_strip"):
            for key, run in block.items():
                if key != "env":
                    treatments[f"{name}:{key}"] = {"untrimmed_pss_mb": worker_pss(run, "usr2_before")}
    if treatments:
        out["engine_rollout_worker_2x2x10_by_treatment"] = treatments
    points = {k: p["stages"]["filled"]["Pss"] for k, p in bare.items() if k.startswith("1x10:none")}
    if points:
        out["bare_1x10_by_treatment_pss_mb"] = {
            k: {"pss_mb": v, "build_seconds": bare[k]["build_seconds"]} for k, v in points.items()
        }
    return out


def machine() -> dict:
    import psutil

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "glibc": platform.libc_ver()[1],
    }


def commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def parse_points(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in p.split("x")) for p in text.split(",") if p]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="libero_object")
    parser.add_argument("--phases", default="imports,bare,limit,engine")
    parser.add_argument("--points", default="1x1,1x5,1x10,2x5,2x10", help="bare (envs x simulators each) points")
    parser.add_argument(
        "--bare_imports", default="none", help="what each bare point imports first: none, torch, engine"
    )
    parser.add_argument("--compare_point", default="2x10", help="the bare point also run with torch and engine imports")
    parser.add_argument("--evict_point", default="2x5", help="a bare point cycled through all tasks twice ('' skips)")
    parser.add_argument("--limit", default="2x2x10", help="limit rows (benchmarks.throughput): workers x envs x K")
    parser.add_argument("--limit_seconds", type=float, default=90.0, help="the limit row's warm-up + window")
    parser.add_argument("--engine", default="2x2x10", help="engine runs: workers x envs per worker x sim cache, ...")
    parser.add_argument("--engine_env", action="append", default=[], help="VAR=VALUE for every engine run")
    parser.add_argument("--engine_arg", dest="engine_args", action="append", default=[], help="extra train option")
    parser.add_argument("--max_episode_steps", type=int, default=20)
    parser.add_argument("--sample_every", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--engine_timeout", type=float, default=420.0)
    parser.add_argument("--bare_arg", dest="bare_args", action="append", default=[], help="extra env option (bare)")
    parser.add_argument("--out", default="benchmarks/results/libero_memory.json")
    parser.add_argument("--merge", action="store_true", help="add to the figures already in --out")
    parser.add_argument("--tag", default="", help="suffix of this invocation's keys in the results")
    parser.add_argument("--commit", default="", help="the commit measured (default: git rev-parse HEAD here)")
    # internal: the child processes
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--limit_workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--trim_each_build", action="store_true", help="malloc_trim(0) after each simulator build (bare points, probe)"
    )
    args = parser.parse_args()

    if args.child:
        if args.child == "imports":
            result = child_imports(args.env)
        elif args.child == "limit":
            result = child_limit(
                args.env, args.limit_workers, args.n, args.k, args.limit_seconds, args.max_episode_steps
            )
        elif args.child == "imports_libero":
            result = child_imports_libero_only(args.env)
        else:
            result = child_bare(
                args.env, args.n, args.k, args.bare_imports, args.cycles, args.trim_each_build, args.bare_args
            )
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return

    out = Path(args.out)
    results = json.loads(out.read_text()) if args.merge and out.exists() else {}
    measured = args.commit or commit()
    results.setdefault("commit", measured)  # of the first invocation; each tag's own below
    results.setdefault("commit_by_tag", {})[args.tag or "(untagged)"] = measured
    results.update(machine=machine(), date=time.strftime("%Y-%m-%d %H:%M"))
    phases = args.phases.split(",")
    tag = f"_{args.tag}" if args.tag else ""
    env_extra = {k: v for k, v in (item.split("=", 1) for item in args.engine_env)}
    child_env = {**os.environ, **env_extra}
    common = [f"--env={args.env}", *(f"--bare_arg={a}" for a in args.bare_args)]

    if "imports" in phases:
        results[f"imports{tag}"] = {
            "env": args.env,
            "torch_first": run_child([*common, "--child=imports"], child_env),
            "libero_only": run_child([*common, "--child=imports_libero"], child_env),
        }
        print(json.dumps(results[f"imports{tag}"]), flush=True)

    if "bare" in phases:
        bare = results.setdefault(f"bare{tag}", {"env": args.env, "points": {}})
        treatment = "".join(f":{k}={v}" for k, v in env_extra.items()) + (
            ":trim_each_build" if args.trim_each_build else ""
        )
        trim = ["--trim_each_build"] if args.trim_each_build else []

        def bare_point(n: int, k: int, imports: str, cycles: int = 0) -> None:
            key = f"{n}x{k}:{imports}" + (":cycled" if cycles else "") + treatment
            point = run_child(
                [
                    *common,
                    "--child=bare",
                    f"--n={n}",
                    f"--k={k}",
                    f"--bare_imports={imports}",
                    f"--cycles={cycles}",
                    *trim,
                ],
                child_env,
            )
            bare["points"][key] = {
                "n": n,
                "k": k,
                "imports": imports,
                "cycles": cycles,
                "treatment": treatment,
                **point,
            }
            print(key, {stage: mem["Pss"] for stage, mem in point["stages"].items()}, flush=True)

        for n, k in parse_points(args.points):
            bare_point(n, k, args.bare_imports)
        if args.compare_point:
            n, k = parse_points(args.compare_point)[0]
            for imports in ("torch", "engine"):
                bare_point(n, k, imports)
        if args.evict_point:
            n, k = parse_points(args.evict_point)[0]
            bare_point(n, k, args.bare_imports, cycles=2)
        plain = [
            p
            for p in bare["points"].values()
            if p["imports"] == "none" and not p["cycles"] and p.get("treatment", "") == treatment
        ]
        if len(plain) >= 3:
            for stage in ("filled", "filled_gc_trim"):
                points = [(p["n"], p["k"], p["stages"][stage]["Pss"]) for p in plain]
                if len({n for n, _, _ in points}) >= 2:  # per env and per simulator apart only if N varies
                    bare[f"fit_pss_{stage}"] = fit(points)
                # The first simulator of a process costs more than the next ones: the slope over >= 5 per process.
                many = [(n * k, pss) for n, k, pss in points if n * k >= 5]
                if len({sims for sims, _ in many}) >= 2:
                    bare[f"line_pss_{stage}_5_or_more_sims"] = line(many)
                print(stage, bare.get(f"fit_pss_{stage}"), bare.get(f"line_pss_{stage}_5_or_more_sims"), flush=True)

    if "limit" in phases:
        limit = results.setdefault(f"limit{tag}", {"env": args.env})
        for layout in args.limit.split(","):
            key = layout + "".join(f":{k}={v}" for k, v in env_extra.items())
            limit[key] = run_limit(args.env, layout, args, env_extra)
            print("limit", key, json.dumps(limit[key]), flush=True)

    if "engine" in phases:
        engine = results.setdefault(f"engine{tag}", {"env": args.env})
        for layout in args.engine.split(","):
            key = layout + "".join(f":{k}={v}" for k, v in env_extra.items())
            key += ":trim_each_build" if args.trim_each_build else ""
            run = run_engine(args.env, layout, args, env_extra)
            run["summary"] = summarise_engine(run)
            engine[key] = run
            print(key, run["stop_reason"], json.dumps(run["summary"], indent=1), flush=True)

    results["summary"] = summarise(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
