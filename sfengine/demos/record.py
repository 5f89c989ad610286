"""``python -m sfengine.demos``: record the successful episodes of an env's scripted demonstrator into one HDF5 file.

    python -m sfengine.demos --env=libero_object --demos_per_task=5
    python -m sfengine.demos --env=libero_object --demos_per_task=50 --libero_obs_mode=rgb --libero_image_size=128

The demonstrator is the one the env registered (``register_env(..., demonstrator=)``): it reads the simulator's
privileged state and sends the actions a policy would send. Each task tries its init states in order (0, 1, 2,
...), once each, until ``--demos_per_task`` episodes succeeded; ``--demo_attempts_per_task`` allows more tries
(with ``--demo_action_noise`` a repeated init state plays differently). Only successful episodes are written.

    runner: tasks ──> a pool of --num_workers processes, one env each ──> one shard file per task ──> merged file
                                                                    └──> success per task (report JSON, table)

The processes are plain ``multiprocessing`` workers, not the engine's rollout workers: a demonstrator reads the
env's internals, so it must run in the env's process, where the engine's workers only step actions that come
from the inference workers. Tasks are dealt to the processes as they free up.

Exit codes: 0 the file was written, 1 the demonstrator failed on every episode or the run was interrupted (nothing
written), 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sfengine.config import Config, ConfigError, command_options, parse_config
from sfengine.demos.dataset import Demo, DemoWriter, read_demos
from sfengine.demos.options import DemosOptions, demos_parser
from sfengine.engine.event_loop import die_with_parent, print_stacks_on_sigusr1
from sfengine.engine.lifecycle import StopSignals
from sfengine.engine.sizing import Machine, resolve_auto_options
from sfengine.env.multitask import TaskInfo
from sfengine.env.registry import env_context, env_demonstrator, env_sizer, resolve_env_factory
from sfengine.env.spaces import obs_as_dict
from sfengine.train import probe_env

STOP_POLL_SEC = 0.1  # how often the recording looks for a SIGINT or SIGTERM while the pool works
SINGLE_TASK_SEEDS = 1_000_000  # a single-task env's episode k of process p is seeded p * this + k


@dataclass(frozen=True)
class TaskJob:
    """What one pool process records: ``wanted`` successes of ``task`` within ``attempts`` episodes."""

    task: int
    attempts: int
    wanted: int
    process_seed: int  # seeds a single-task env's episodes and the action noise


@dataclass
class TaskReport:
    task: int
    name: str
    successes: int = 0
    attempts: int = 0
    steps: int = 0  # env steps of the successful episodes
    failed_init_states: list[int] = field(default_factory=list)
    unsolvable: str = ""  # why the demonstrator does not handle this task ("" if it does)

    @property
    def success_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


def plan_jobs(options: DemosOptions, tasks: TaskInfo | None, num_processes: int) -> list[TaskJob]:
    """One job per task of a multi-task env; a single-task env's demos split over the processes."""
    if tasks is None:
        attempts = options.demo_attempts_per_task or 4 * options.demos_per_task
        shares = np.array_split(np.arange(options.demos_per_task), num_processes)
        return [
            TaskJob(0, -(-attempts * len(share) // options.demos_per_task), len(share), p)
            for p, share in enumerate(shares)
            if len(share)
        ]
    chosen = [int(t) for t in options.demo_tasks.split(",")] if options.demo_tasks else range(len(tasks.task_names))
    for task in chosen:
        if not 0 <= task < len(tasks.task_names):
            raise ConfigError(
                f"--demo_tasks: task {task} does not exist; the env has tasks 0-{len(tasks.task_names) - 1}"
            )
    return [
        TaskJob(task, options.demo_attempts_per_task or tasks.init_states_per_task[task], options.demos_per_task, task)
        for task in chosen
    ]


_env = None  # the pool process's env and demonstrator, built once by _start_process


def _start_process(cfg: Config) -> None:
    global _env, _demonstrator
    die_with_parent()  # a recording stopped by a signal or killed must not leave its pool behind
    _env = resolve_env_factory(cfg.env.env)(env_context(cfg, -1, 0, cfg.env.seed))
    _demonstrator = env_demonstrator(cfg.env.env)()


def _record_job(job: TaskJob, multitask: bool, noise: float, shard: Path, env_name: str, obs_mode: str) -> TaskReport:
    """Play the job's episodes with the demonstrator and write its successes to ``shard``."""
    env = _env.unwrapped
    rng = np.random.default_rng([job.process_seed, 7])
    report = TaskReport(job.task, env.task_names[job.task] if multitask else env_name)
    with DemoWriter(shard, env=env_name, obs_mode=obs_mode) as writer:
        for attempt in range(job.attempts):
            if report.successes >= job.wanted:
                break
            if multitask:
                init_state = attempt % env.num_init_states(job.task)
                obs, info = _env.reset(options={"task": job.task, "init_state": init_state})
            else:
                init_state = -1
                obs, info = _env.reset(seed=job.process_seed * SINGLE_TASK_SEEDS + attempt)
            try:
                _demonstrator.reset(env)
            except ValueError as exc:
                report.unsolvable = str(exc)
                break
            demo = _play_episode(obs, noise, rng, job.task, init_state, info.get("instruction", ""))
            report.attempts += 1
            if demo is None:
                report.failed_init_states.append(init_state)
                continue
            writer.add(demo)
            report.successes += 1
            report.steps += len(demo)
    return report


def _play_episode(obs, noise: float, rng: np.random.Generator, task: int, init_state: int, instruction: str):
    """One episode of the demonstrator; the Demo if it ended in success, else None."""
    env = _env.unwrapped
    observed, actions, rewards, states = [], [], [], []
    sim_state = getattr(env, "sim_state", None)
    while True:
        observed.append(obs_as_dict(obs))
        if sim_state is not None:
            states.append(sim_state())
        action = np.asarray(_demonstrator.act(env), dtype=np.float32)
        if noise:
            action = np.clip(action + rng.normal(0.0, noise, action.shape), -1.0, 1.0).astype(np.float32)
        obs, reward, terminated, truncated, info = _env.step(action)
        actions.append(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    if not info.get("success", terminated):
        return None
    dones = np.zeros(len(actions), dtype=np.uint8)
    dones[-1] = 1
    return Demo(
        obs={key: np.stack([o[key] for o in observed]) for key in observed[0]},
        actions=np.stack(actions),
        rewards=np.asarray(rewards, dtype=np.float32),
        dones=dones,
        states=np.stack(states) if states else None,
        task=task,
        init_state=init_state,
        instruction=instruction or info.get("instruction", ""),
    )


def _run_job(args) -> TaskReport:
    job, multitask, noise, shard, env_name, obs_mode = args
    return _record_job(job, multitask, noise, Path(shard), env_name, obs_mode)


def obs_mode_of(cfg: Config) -> str:
    libero = cfg.env_options.get("libero")
    return libero.libero_obs_mode if libero is not None else "state"


def default_output(cfg: Config) -> Path:
    return Path(cfg.run.train_dir) / "demos" / f"{cfg.env.env}_{obs_mode_of(cfg)}.hdf5"


def record(cfg: Config, options: DemosOptions, stop: StopSignals | None = None) -> tuple[Path | None, list[TaskReport]]:
    """Record the demos; the file written (None if no episode succeeded) and the per-task reports. A signal that
    ``stop`` caught ends the recording within STOP_POLL_SEC, or before the merge's next shard, with nothing written.
    """
    stop = stop or StopSignals()  # not entered: never stops
    if env_demonstrator(cfg.env.env) is None:
        raise ConfigError(
            f"--env={cfg.env.env} has no scripted demonstrator; register one with "
            "register_env(name, factory, demonstrator=...), or record demos with your own code and DemoWriter"
        )
    _, _, tasks = probe_env(cfg, resolve_env_factory(cfg.env.env))
    resolve_auto_options(cfg, env_sizer(cfg.env.env), tasks, Machine.here(), evaluation=True)
    processes = max(1, int(cfg.sampler.num_workers))
    jobs = plan_jobs(options, tasks, processes)
    output = Path(options.demos_output) if options.demos_output else default_output(cfg)
    obs_mode = obs_mode_of(cfg)
    scratch = Path(tempfile.mkdtemp(prefix=".demos_", dir=output.parent if output.parent.is_dir() else None))
    reports: list[TaskReport] = []
    try:
        args = [
            (job, tasks is not None, options.demo_action_noise, str(scratch / f"job_{i}.hdf5"), cfg.env.env, obs_mode)
            for i, job in enumerate(jobs)
        ]
        context = multiprocessing.get_context("spawn")
        with context.Pool(min(processes, len(jobs)), initializer=_start_process, initargs=(cfg,)) as pool:
            results = pool.imap_unordered(_run_job, args)
            while len(reports) < len(args):
                try:
                    report = results.next(timeout=STOP_POLL_SEC)
                except multiprocessing.TimeoutError:
                    stop.raise_if_requested()
                    continue
                reports.append(report)
                print(_report_line(report), flush=True)
        reports = merged_by_task(reports)
        shards = [Path(a[3]) for a in args]
        if not any(r.successes for r in reports):
            return None, reports
        output.parent.mkdir(parents=True, exist_ok=True)
        meta = {"demonstrator": type(env_demonstrator(cfg.env.env)()).__name__, "options": asdict(options)}
        with DemoWriter(output, env=cfg.env.env, obs_mode=obs_mode, meta=meta) as writer:
            for shard in shards:
                stop.raise_if_requested()  # a stop during the merge leaves no file: the writer drops its temporary
                for demo in read_demos(shard).demos:
                    writer.add(demo)
        return output, reports
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def merged_by_task(reports: list[TaskReport]) -> list[TaskReport]:
    """One report a task, in task order: a single-task env's demos are recorded by several processes, one report
    each."""
    merged: dict[int, TaskReport] = {}
    for report in sorted(reports, key=lambda r: r.task):
        if (into := merged.get(report.task)) is None:
            merged[report.task] = dataclasses.replace(report, failed_init_states=list(report.failed_init_states))
            continue
        into.successes += report.successes
        into.attempts += report.attempts
        into.steps += report.steps
        into.failed_init_states += report.failed_init_states
    return list(merged.values())


def _report_line(report: TaskReport) -> str:
    if report.unsolvable:
        return f"task {report.task} {report.name}: skipped ({report.unsolvable})"
    return (
        f"task {report.task} {report.name}: {report.successes} demos in {report.attempts} episodes "
        f"({report.success_rate:.0%} success)"
    )


def write_report(path: Path, reports: list[TaskReport], options: DemosOptions, seconds: float) -> Path:
    """``<file>.json`` beside the demos: the demonstrator's success per task."""
    solved = [r for r in reports if not r.unsolvable]
    summary = {
        "demos_per_task": options.demos_per_task,
        "demo_action_noise": options.demo_action_noise,
        "seconds": round(seconds, 1),
        "success_rate": sum(r.successes for r in solved) / max(1, sum(r.attempts for r in solved)),
        "tasks": [{**asdict(r), "success_rate": r.success_rate} for r in reports],
    }
    report_path = path.with_suffix(".json")
    report_path.write_text(json.dumps(summary, indent=1))
    return report_path


def main(argv: list[str] | None = None) -> int:
    print_stacks_on_sigusr1()
    argv = sys.argv[1:] if argv is None else argv
    parser = demos_parser()
    try:
        if any(a in ("-h", "--help") for a in argv):
            parser.parse_args(argv)
        options, rest = command_options(DemosOptions, argv)
        cfg = parse_config(rest, parser)
    except ConfigError as exc:
        print(f"sfengine.demos: error: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    # A SIGTERM (a job scheduler, `timeout`) stops the recording as Ctrl-C does: the pool ends and the scratch
    # folder of partial shards is removed on the way out.
    try:
        with StopSignals() as stop:
            output, reports = record(cfg, options, stop)
    except ConfigError as exc:
        print(f"sfengine.demos: error: {exc}", file=sys.stderr)
        return 2
    except StopSignals.Interrupted as exc:
        print(f"sfengine.demos: interrupted by {exc}; nothing written", file=sys.stderr)
        return 1
    if output is None:
        print("sfengine.demos: no episode succeeded; nothing written", file=sys.stderr)
        return 1
    report_path = write_report(output, reports, options, time.time() - started)
    demos = sum(r.successes for r in reports)
    print(f"wrote {demos} demos to {output} (success per task: {report_path})")
    return 0
