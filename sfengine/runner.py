"""The runner: builds every component, wires the signals in one place, watches the run and stops it.

Processes (multi-process mode):

    main process:     Runner (stats, status line, TensorBoard, stop conditions, summary.json)
    rollout_worker_k: RolloutWorker k            (num_workers processes)
    inference_i:      InferenceWorker i          (num_inference_workers processes; 0: each rollout worker acts)
    learner:          LearnerWorker + a thread running the Batcher's loop
    evaluator:        TrainingEvaluator          (rank 0, with --eval_every_env_steps)

In serial mode every component lives on the runner's loop. A stop ends the training components first; the
evaluator then evaluates the final weights (--eval_at_end, FinalEvaluation) and ends last.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import multiprocessing
import os
import signal as os_signal
import time
from dataclasses import dataclass

from signal_slot.signal_slot import signal
from tensorboardX import SummaryWriter

from sfengine.algorithms import Algorithm, algorithm_for
from sfengine.buffers import SharedBuffers, SharedWeights
from sfengine.checkpoint import list_checkpoints
from sfengine.config import Config
from sfengine.distributed import RankInfo
from sfengine.env_registry import EnvFactory
from sfengine.evaluation.episode_queue import SINGLE_TASK
from sfengine.evaluation.report import EvalReport
from sfengine.evaluation.training_evaluator import EVALUATOR_PROCESS, FinalEvaluation, TrainingEvaluator
from sfengine.event_loop import Component, EngineEventLoop, EngineProcess
from sfengine.hang_watch import HangWatch
from sfengine.inference.inference_worker import InferenceWorker, connect_inference
from sfengine.inference.policy_actor import own_policy
from sfengine.learning.batcher import buffers_released_signal
from sfengine.learning.learner_worker import LearnerWorker
from sfengine.lifecycle import (
    STOP_TIMEOUT_SEC,
    component_loops,
    run_until_stopped,
    start_watch_and_status_timers,
    terminate_processes,
)
from sfengine.messages import EvalResult, EvaluatorReport, InferenceReport, LearnerReport, WorkerReport
from sfengine.models.actor_critic import ActorCritic
from sfengine.multitask import TaskInfo, selected_init_states
from sfengine.progress import end_summary, progress
from sfengine.respawn import InboxLockHeld, Respawner
from sfengine.scheduler import TaskSchedule, shard_pairs
from sfengine.spaces import ActionSpec, ObsSpec
from sfengine.stats import FPS_WINDOWS, RunStats
from sfengine.task_sequence import GROUP_SEEDS_PER_RANK, SharedTaskSequence

log = logging.getLogger(__name__)

AGREED_STOP_TIMEOUT_SEC = 120.0
# A worker still in its start-up when the run stops (building LIBERO simulators can take minutes, and reads no
# signal) holds no trajectories yet: it is ended this long into the stop rather than waited for STOP_TIMEOUT_SEC.
STARTING_STOP_GRACE_SEC = 5.0


@dataclass
class Components:
    workers: list
    inference_workers: list
    batcher: Component  # the algorithm's: trajectories or whole groups of episodes (Algorithm.make_batcher)
    learner: LearnerWorker
    processes: list[EngineProcess]
    evaluator: TrainingEvaluator | None = None  # --eval_every_env_steps, rank 0 only
    grouped: bool = False  # the batcher gathers whole groups of episodes


def connect_components(runner: Runner, c: Components) -> None:
    """The whole data flow of the engine, in one place."""
    connect_inference(c.workers, c.inference_workers)
    for w, worker in enumerate(c.workers):
        worker.trajectories_ready.connect(c.batcher.on_trajectories_ready)
        c.batcher.connect(buffers_released_signal(w), worker.on_buffers_released)
        c.learner.policy_updated.connect(worker.on_policy_updated)
        worker.report.connect(runner.on_worker_report)
    for inference in c.inference_workers:
        inference.report.connect(runner.on_inference_report)
    c.batcher.training_batch_ready.connect(c.learner.on_training_batch)
    c.learner.batch_released.connect(c.batcher.on_batch_released)
    c.batcher.failed.connect(runner.on_component_failed)
    c.learner.report.connect(runner.on_learner_report)
    runner.rank_episodes.connect(c.learner.on_rank_episodes)
    runner.stop_requested.connect(c.learner.on_stop_requested)
    for worker in c.workers:
        runner.inference_respawned.connect(worker.on_inference_respawned)
    if c.grouped:  # a group a respawn cut short is dropped whole
        runner.episodes_dropped.connect(c.batcher.on_episodes_dropped)
    for component in (*c.workers, *c.inference_workers, c.learner):
        component.event_loop.start.connect(component.on_start)
        runner.stop.connect(component.on_stop)
    if c.evaluator is not None:
        c.evaluator.event_loop.start.connect(c.evaluator.on_start)
        runner.evaluate.connect(c.evaluator.on_evaluate)
        runner.evaluate_final.connect(c.evaluator.on_evaluate_final)
        runner.stop_evaluator.connect(c.evaluator.on_stop)  # after training's components (FinalEvaluation)
        c.evaluator.evaluation_done.connect(runner.on_evaluation_done)
        c.evaluator.report.connect(runner.on_evaluator_report)


def print_stack(process: EngineProcess) -> None:
    """Have a hung process print its own stack to stderr (SIGUSR1, see EngineProcess)."""
    with contextlib.suppress(ProcessLookupError):  # it died meanwhile: nothing to print
        os.kill(process.pid, os_signal.SIGUSR1)
        time.sleep(0.5)  # the stack dump is written by the hung process itself


def learner_line(clip_mode: str, learner: dict[str, float]) -> str:
    """The policy update's diagnostics for the status line: ``ppo_clip kl 0.0041 clipped 0.06 dead-grad 0.06
    ess 0.98 ratio 0.71-1.38``."""
    line = (
        f"{clip_mode} kl {learner['approx_kl']:.4f} clipped {learner['clip_fraction']:.2f} "
        f"dead-grad {learner['dead_grad_fraction']:.2f} ess {learner['ess']:.2f} "
        f"ratio {learner['ratio_min']:.2f}-{learner['ratio_max']:.2f}"
    )
    if "sapo_saturated_fraction" in learner:
        line += f" saturated {learner['sapo_saturated_fraction']:.2f}"
    if "groups_dropped_fraction" in learner:
        line += f"  groups dropped {learner['groups_dropped_fraction']:.2f}"
    if learner.get("critic_warmup"):
        line += "  critic warm-up: the policy is frozen"
    return line


class Runner(Component):
    def __init__(
        self,
        event_loop,
        cfg: Config,
        initial_env_steps: int,
        task_names: list[str] | None = None,
        hang_watch: HangWatch | None = None,
        respawner: Respawner | None = None,
    ):
        super().__init__(event_loop, "runner")
        self.cfg = cfg
        self.hang_watch = hang_watch  # multi-process mode: workers that stop reporting
        self.respawner = respawner  # multi-process mode: dead or hung workers replaced
        self.stats = RunStats(cfg.run.stats_window, initial_env_steps, task_names)
        self.processes: list[EngineProcess] = []
        self.stop_reason: str | None = None
        self.stop_started = 0.0
        self.exit_code = 0
        self.interrupts = 0
        self.writer: SummaryWriter | None = None
        self.ranks = RankInfo.from_environment()
        self.leads = self.ranks.rank == 0  # rank 0 prints, and writes TensorBoard and summary.json
        self.stop_asked: tuple[str, float] | None = None  # multi-rank: (reason, when) of a stop not yet agreed
        self.reported: set[str] = set()  # the workers heard from since their (re)start: their start-up is over
        every = cfg.eval.eval_every_env_steps
        self.next_evaluation = (initial_env_steps // every + 1) * every if every else None
        self.evaluations: list[dict] = []  # the training evaluator's results, for summary.json
        self.final_evaluation = FinalEvaluation(cfg.eval.eval_at_end) if every and self.leads else None

    @signal
    def stop(self): ...

    @signal
    def rank_episodes(self): ...

    @signal
    def stop_requested(self): ...

    @signal
    def evaluate(self): ...

    @signal
    def evaluate_final(self): ...

    @signal
    def stop_evaluator(self): ...

    @signal
    def inference_respawned(self): ...

    @signal
    def episodes_dropped(self): ...

    def on_start(self) -> None:
        if self.leads:
            self.writer = SummaryWriter(str(self.cfg.experiment_dir / "tensorboard"), flush_secs=10)
        self.stats.started = time.time()
        start_watch_and_status_timers(self)

    def on_worker_report(self, report: WorkerReport) -> None:
        self.reported.add(f"rollout_worker_{report.worker}")
        if self.hang_watch is not None:
            self.hang_watch.heard_from(f"rollout_worker_{report.worker}")
        if self.respawner is not None:
            self.respawner.heard_from(f"rollout_worker_{report.worker}")
        self.stats.add_worker_report(report)
        if report.inference is not None:
            self.stats.add_inference_report(report.inference)
        if not self.leads and report.episodes:
            self.rank_episodes.emit(report.episodes)  # for rank 0's statistics, through the learners

    def on_inference_report(self, report: InferenceReport) -> None:
        self.reported.add(f"inference_worker_{report.worker}")
        if self.hang_watch is not None:
            self.hang_watch.heard_from(f"inference_worker_{report.worker}")
        if self.respawner is not None:
            self.respawner.heard_from(f"inference_worker_{report.worker}")
        self.stats.add_inference_report(report)

    def on_learner_report(self, report: LearnerReport) -> None:
        run = self.cfg.run
        self.stats.add_learner_report(report)
        if self.next_evaluation is not None and report.env_steps >= self.next_evaluation and self.leads:
            every = self.cfg.eval.eval_every_env_steps
            self.next_evaluation = (report.env_steps // every + 1) * every
            self.evaluate.emit(report.env_steps)
        if report.stop_agreed:
            self.request_stop(self.stop_asked[0] if self.stop_asked else "another rank stopped")
        elif self.stats.env_steps >= run.train_for_env_steps:
            self.request_stop(f"reached {self.stats.env_steps} env steps")
        elif self.leads and (reached := self.stats.target_reached(run.stop_at_return, run.stop_at_success)):
            self._stop_every_rank(reached)  # rank 0 alone sees every rank's episodes

    def on_component_failed(self, reason: str) -> None:
        """A component that cannot go on but whose process still runs (the batcher's thread)."""
        log.error("%s; stopping the run", reason)
        self.request_stop(reason, exit_code=1)

    def on_evaluator_report(self, report: EvaluatorReport) -> None:
        self.stats.add_evaluator_report(report)
        self.final_evaluation.heard(report)

    def on_evaluation_done(self, result: EvalResult) -> None:
        """An evaluation of the weights of ``result.policy_version``: TensorBoard, a line, and summary.json."""
        report = EvalReport(result.episodes, self.stats.task_names)
        overall = report.overall
        record = {
            "env_steps": result.env_steps,
            "policy_version": result.policy_version,
            "episodes": overall.episodes,
            "success": overall.success_rate,
            "return": overall.return_mean,
            "length": overall.length_mean,
            "wall_sec": round(result.wall_sec, 2),
        }
        if report.tasks:
            record["per_task_success"] = {task.name: task.success_rate for task in report.tasks}
        if result.final:
            record["final"] = True
        self.evaluations.append(record)
        self.final_evaluation.on_result(self, result)
        success = f"success {overall.success_rate:.3f}, " if overall.success_rate is not None else ""
        print(
            f"{'final evaluation' if result.final else 'evaluation'} at {result.env_steps:,} env steps "
            f"(policy version {result.policy_version}): {success}"
            f"return {overall.return_mean:.2f} over {overall.episodes} episodes in {result.wall_sec:.1f} s",
            flush=True,
        )
        if self.writer is None:
            return
        if overall.success_rate is not None:
            self.writer.add_scalar("eval/success", overall.success_rate, result.env_steps)
        self.writer.add_scalar("eval/return", overall.return_mean, result.env_steps)
        self.writer.add_scalar("eval/length", overall.length_mean, result.env_steps)
        for task in report.tasks:
            if task.success_rate is not None:
                self.writer.add_scalar(f"eval/tasks/{task.name}/success", task.success_rate, result.env_steps)

    def _stop_every_rank(self, reason: str) -> None:
        """A stop this rank decided alone (the clock, a signal). Ranks must stop after the same training batch,
        so in a multi-rank run it is agreed through the learners first, or taken alone if that takes too long."""
        if self.ranks.world_size == 1:
            self.request_stop(reason)
        elif self.stop_asked is None:
            self.stop_asked = (reason, time.time())
            self.stop_requested.emit()
        elif time.time() - self.stop_asked[1] > AGREED_STOP_TIMEOUT_SEC:
            self.request_stop(f"{reason} (the other ranks did not agree within {AGREED_STOP_TIMEOUT_SEC:.0f} s)")

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if self.stop_reason is not None:
            return
        log.info("stopping: %s", reason)
        self.stop_reason, self.exit_code = reason, exit_code
        self.stop_started = time.time()
        self.stop.emit()
        if self.final_evaluation is not None:
            self.final_evaluation.on_stop(self)

    def _watch(self) -> None:
        """Conditions no component can signal: the clock, OS signals, processes that died; then the shutdown."""
        run = self.cfg.run
        if self.stop_reason is None:
            if self.respawner is not None and not self.interrupts:
                self.respawner.chaos_victim(self.processes)
            # Deaths first: a stop waiting for the other ranks' agreement must still see this rank's learner die
            # (as it does when another rank's death breaks the exchange), or it would wait for good.
            dead = [p for p in self.processes if not p.is_alive()]
            if dead:
                self._dead(dead)
            elif run.train_for_seconds and time.time() - self.stats.started >= run.train_for_seconds:
                self._stop_every_rank(f"trained for {run.train_for_seconds:g} s")
            elif self.interrupts:
                self._stop_every_rank("interrupted by a signal")
            elif self.hang_watch is not None and (hung := self.hang_watch.hung()):
                self._stop_hung(hung)
            elif self.hang_watch is not None and (stuck := self.hang_watch.learner_hung()):
                self._stop_hung_learner(stuck)
            return
        training = [p for p in self.processes if p.name != EVALUATOR_PROCESS]
        training_done = all(not p.is_alive() for p in training) if training else self.stats.final_learner_report
        if training_done:
            if self.final_evaluation is None or self.final_evaluation.over(self):
                self.event_loop.stop()
        elif starting := self._still_starting():
            names = ", ".join(p.name.removesuffix("_process") for p in starting)
            log.warning("%s still starting as the run stops; ending it (it holds no trajectories yet)", names)
            terminate_processes(starting)
        elif self.hang_watch is not None and (hung := self._hung_while_stopping()):
            self._end_hung_while_stopping(*hung)
        elif time.time() - self.stop_started > STOP_TIMEOUT_SEC:
            self._terminate_the_stragglers()
            self.event_loop.stop()

    def _still_starting(self) -> list[EngineProcess]:
        """Rollout and inference workers alive and never heard from, STARTING_STOP_GRACE_SEC into the stop."""
        if time.time() - self.stop_started < STARTING_STOP_GRACE_SEC:
            return []
        workers = ("rollout_worker_", "inference_worker_")
        return [
            p
            for p in self.processes
            if p.name.startswith(workers) and p.is_alive() and p.name.removesuffix("_process") not in self.reported
        ]

    def _terminate_the_stragglers(self) -> None:
        """Components still running STOP_TIMEOUT_SEC into the stop are terminated. Only the learner's failing to
        stop costs anything (its final checkpoint), so only that changes the exit code: workers stuck in an env or
        a device call, once training is over, do not make a finished run a failed one."""
        # The evaluator is not one: it goes on during training's stop (FinalEvaluation), and is ended with them.
        stragglers = [p for p in self.processes if p.is_alive() and p.name != EVALUATOR_PROCESS]
        names = ", ".join(p.name.removesuffix("_process") for p in stragglers)
        learner = any(p.name == "learner_process" for p in stragglers)
        log.error(
            "components did not stop within %.0f s: %s; terminating them%s",
            STOP_TIMEOUT_SEC,
            names,
            "; the learner's final checkpoint may be missing" if learner else "",
        )
        if learner:
            self.exit_code = 1
        terminate_processes(self.processes)

    def _dead(self, dead: list[EngineProcess]) -> None:
        """Respawn dead rollout and inference workers; any other death, or one past --max_respawns, stops the run."""
        for process in dead:
            component = process.name.removesuffix("_process")
            refusal = self._respawn_refusal(component)
            if refusal is None:
                log.error("%s died (exit code %s); respawning it", component, process.exitcode)
                self._respawn(process)
                continue
            log.error(
                "a component process died: %s (exit code %s); %s; stopping the run",
                process.name,
                process.exitcode,
                refusal,
            )
            self.request_stop(f"process died: {process.name} (exit code {process.exitcode})", exit_code=1)
            return

    def _respawn_refusal(self, component: str) -> str | None:
        """Why ``component`` is not respawned, or None if it is."""
        if not component.startswith(("rollout_worker_", "inference_worker_")):
            return "only rollout and inference workers are respawned"
        if self.respawner is None:
            return "respawning needs worker processes"
        return self.respawner.refusal(component)

    def _respawn(self, process: EngineProcess) -> None:
        component = process.name.removesuffix("_process")
        self.hang_watch.forget(component)
        self.reported.discard(component)
        try:
            positions = self.respawner.respawn(process, self.processes)
        except InboxLockHeld as error:
            log.error("%s cannot be respawned: %s; stopping the run", component, error)
            self.request_stop(f"respawn failed: {component}", exit_code=1)
            return
        if positions:
            self.episodes_dropped.emit(tuple(positions))
        if component.startswith("inference_worker_"):
            self.inference_respawned.emit(int(component.rsplit("_", 1)[1]))

    def _stop_hung(self, component: str) -> None:
        """Print the hung component's stack (SIGUSR1, see EngineProcess) and what it was doing, then respawn it;
        past --max_respawns, end it and stop the run: the others save a checkpoint and exit as usual."""
        process = next(p for p in self.processes if p.name == f"{component}_process")
        description = self.hang_watch.describe(component)
        print_stack(process)
        refusal = self._respawn_refusal(component)
        if refusal is None:
            log.error("%s (hung?); its stack is above; respawning it (--hang_timeout_sec)", description)
            self._respawn(process)
            return
        log.error("%s (hung?); its stack is above; %s; stopping the run (--hang_timeout_sec)", description, refusal)
        self._end_hung_worker(process)
        self.request_stop(f"hung: {component}", exit_code=1)

    def _end_hung_worker(self, process: EngineProcess) -> None:
        ended = [process]
        if process.name.startswith("inference_worker"):
            # A process stopped or killed inside a queue operation holds that queue's lock for good (the queues'
            # mutexes are not robust), and an inference worker writes into the rollout workers' inboxes several
            # thousand times a second: a stop sent there could block the runner forever. Rollout workers have
            # nothing to save and nothing to do without actions, so they end with it; the learner saves as usual.
            ended += [p for p in self.processes if p.name.startswith("rollout_worker_") and p.is_alive()]
        for victim in ended:
            victim.kill()
            Component.abandoned_inboxes.append(victim.event_loop.signal_queue)
            self.hang_watch.forget(victim.name.removesuffix("_process"))

    def _stop_hung_learner(self, description: str) -> None:
        """Print the stuck learner's stack, end it, and stop the run with exit code 1; the checkpoint to resume
        from is the last one it wrote before it hung."""
        process = next(p for p in self.processes if p.name == "learner_process")
        print_stack(process)
        saved = list_checkpoints(self.cfg.experiment_dir)
        kept = f"the last checkpoint is {saved[-1].name}" if saved else "no checkpoint was written yet"
        log.error("%s (hung?); its stack is above; stopping the run (--hang_timeout_sec); %s", description, kept)
        process.kill()
        Component.abandoned_inboxes.append(process.event_loop.signal_queue)
        self.request_stop("hung: learner", exit_code=1)
        self.exit_code = 1  # also when it hung in the final save, after the stop had begun

    def _hung_while_stopping(self) -> tuple[str, EngineProcess | None] | None:
        """A worker still running but silent past --hang_timeout_sec, or a learner stuck in its final update or
        save, while the run stops: (what it is stuck in, the worker's process or None for the learner)."""
        running = {p.name.removesuffix("_process"): p for p in self.processes if p.is_alive()}
        # Only a running learner: one already ended keeps its clock's open update, and would be ended every tick.
        if "learner" in running and (stuck := self.hang_watch.learner_hung()):
            return stuck, None
        component = self.hang_watch.hung(among=running)
        return (self.hang_watch.describe(component), running[component]) if component else None

    def _end_hung_while_stopping(self, description: str, process: EngineProcess | None) -> None:
        """A component hung as the run stops is not waited for (STOP_TIMEOUT_SEC) nor respawned: its stack is
        printed and it is ended. A worker's end costs the run nothing, training is over, so the exit code stays;
        a learner's costs the final checkpoint, so the run exits with 1."""
        if process is None:
            self._stop_hung_learner(description)
            return
        print_stack(process)
        log.error("%s (hung?); its stack is above; ending it, as the run is stopping (--hang_timeout_sec)", description)
        self._end_hung_worker(process)

    def _status(self) -> None:
        if not self.leads:
            return
        stats, summary = self.stats, self.stats.summary()
        fps = {w: stats.fps(w) for w in FPS_WINDOWS}
        requests_per_batch = stats.inference_requests_per_batch()
        env_cost = stats.env_cost_ms()
        split = stats.time_split()
        learner = stats.take_learner_means()
        ret = summary["episode_return_mean"]
        done = progress(self.cfg, stats.env_steps, stats.initial_env_steps, summary["wall_seconds"], fps[60] or fps[10])
        line = (
            f"[{summary['wall_seconds']:7.1f}s] steps {stats.env_steps:>10,} ({done})  FPS "
            + "/".join(f"{fps[w]:.0f}" for w in FPS_WINDOWS)
            + f" (10/60/300s)  return {ret if ret is None else round(ret, 2)}"
            + (f"  success {summary['success_rate']:.2f}" if "success_rate" in summary else "")
            + f"  lag {learner.get('policy_lag_mean', float('nan')):.1f}"
            + (f"  env failures {stats.env_failures}" if stats.env_failures else "")
            + (f"  respawns {self.respawner.stats.total}" if self.respawner and self.respawner.stats.total else "")
            + "".join(
                f"  env {name.removeprefix('env_').removesuffix('_ms')} {value:{'.1f' if value >= 1 else '.3g'}} ms"
                for name, value in env_cost.items()
            )
            + "  time: "
            + " ".join(f"{name} {100 * value:.0f}%" for name, value in split.items())
        )
        print(line, flush=True)
        if stats.task_successes:
            print(f"           success per task: {stats.per_task_success_line()}", flush=True)
        if "approx_kl" in learner:
            print(f"           learner: {learner_line(self.cfg.policy_loss.clip_mode, learner)}", flush=True)
        if self.writer is None:
            return
        step = stats.env_steps
        for w in FPS_WINDOWS:
            self.writer.add_scalar(f"perf/fps_{w}s", fps[w], step)
        for name, value in split.items():
            self.writer.add_scalar(f"perf/time_{name}", value, step)
        self.writer.add_scalar("perf/inference_requests_per_batch", requests_per_batch, step)
        for name, value in env_cost.items():
            self.writer.add_scalar(f"perf/{name}", value, step)
        for name in ("episode_return_mean", "episode_len_mean", "success_rate", "env_failures"):
            if summary.get(name) is not None:
                self.writer.add_scalar(f"episodes/{name}", summary[name], step)
        for name, value in learner.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        for name, value in summary.get("per_task_success", {}).items():
            self.writer.add_scalar(f"tasks/{name}/success", value, step)
        if self.respawner is not None:
            respawns = self.respawner.stats
            self.writer.add_scalar("failures/respawns", respawns.total, step)
            self.writer.add_scalar("failures/respawn_dropped_trajectories", respawns.dropped_trajectories, step)
            self.writer.add_scalar("failures/respawn_seconds_lost", respawns.seconds_lost, step)

    def finish(self) -> dict:
        """Write summary.json (rank 0) and close TensorBoard; called once the loop has exited."""
        summary = self.stats.summary()
        summary.update(stop_reason=self.stop_reason, exit_code=self.exit_code, world_size=self.ranks.world_size)
        if self.respawner is not None:
            summary.update(self.respawner.stats.as_dict())
        if self.evaluations:
            summary["eval"] = self.evaluations
        if not self.leads:
            return summary
        path = self.cfg.experiment_dir / "summary.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, path)
        if self.writer is not None:
            self._status()  # the learner's statistics since the last status, or a run shorter than one has none
            self.writer.close()
        return summary


def build_components(
    cfg: Config,
    runner_loop: EngineEventLoop,
    buffers: SharedBuffers,
    weights: SharedWeights,
    env_factory: EnvFactory,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    resume_state: dict | None,
    mp_context,
    task_sequence: SharedTaskSequence | None = None,
    tasks: TaskInfo | None = None,
) -> Components:
    from sfengine.rollout.rollout_worker import RolloutWorker

    processes: list[EngineProcess] = []
    loop_for = component_loops(cfg.sampler.serial_mode, runner_loop, mp_context, processes)
    workers = [
        RolloutWorker(
            loop_for(f"rollout_worker_{w}"),
            w,
            cfg,
            buffers,
            env_factory,
            action_spec,
            task_sequence,
            policy=own_policy(cfg, buffers, weights, obs_spec, action_spec, w),
        )
        for w in range(cfg.sampler.num_workers)
    ]
    inference_workers = [
        InferenceWorker(loop_for(f"inference_worker_{i}"), i, cfg, buffers, weights, obs_spec, action_spec)
        for i in range(cfg.sampler.num_inference_workers)
    ]
    learner_loop = loop_for("learner")
    batcher_loop = runner_loop if cfg.sampler.serial_mode else EngineEventLoop("batcher_evt_loop")
    algorithm = algorithm_for(cfg)
    batcher = algorithm.make_batcher(cfg, batcher_loop, buffers, task_sequence)
    learner = LearnerWorker(
        learner_loop, cfg, buffers, weights, obs_spec, action_spec, batcher, resume_state, task_sequence
    )
    evaluator = None
    if cfg.eval.eval_every_env_steps and RankInfo.from_environment().rank == 0:
        evaluator = TrainingEvaluator(loop_for("evaluator"), cfg, weights, env_factory, obs_spec, action_spec, tasks)
    return Components(workers, inference_workers, batcher, learner, processes, evaluator, algorithm.grouped(cfg))


def run(
    cfg: Config,
    env_factory: EnvFactory,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    model: ActorCritic,
    resume_state: dict | None,
    tasks: TaskInfo | None = None,
) -> int:
    """Train until a stop condition; return the process exit code."""
    mp_context = multiprocessing.get_context("spawn")
    initial_version = int(resume_state["policy_version"]) if resume_state else 0
    initial_env_steps = int(resume_state["env_steps"]) if resume_state else 0

    buffers = SharedBuffers.allocate(cfg, obs_spec, action_spec)
    algorithm = algorithm_for(cfg)
    weights = SharedWeights.allocate(model, reference=algorithm.annotate is not None)
    weights.publish(model, initial_version, initial_reference(algorithm, model, resume_state))

    task_sequence = None
    if tasks is not None or algorithm.grouped(cfg):
        task_sequence = build_task_sequence(cfg, tasks, resume_state)

    runner_loop = EngineEventLoop("runner_evt_loop", serial_mode=cfg.sampler.serial_mode)
    task_names = tasks.task_names if tasks else None
    hang_watch = None if cfg.sampler.serial_mode else HangWatch(cfg, buffers.splits, task_names, buffers.learner_clock)
    runner = Runner(runner_loop, cfg, initial_env_steps, task_names, hang_watch)
    runner_loop.start.connect(runner.on_start)
    components = build_components(
        cfg,
        runner_loop,
        buffers,
        weights,
        env_factory,
        obs_spec,
        action_spec,
        resume_state,
        mp_context,
        task_sequence,
        tasks,
    )
    connect_components(runner, components)
    runner.processes = components.processes
    if not cfg.sampler.serial_mode:
        inboxes = [p.event_loop.signal_queue for p in components.processes]
        inboxes += [runner_loop.signal_queue, components.batcher.event_loop.signal_queue]
        runner.respawner = Respawner(cfg, buffers, task_sequence, inboxes)

    run_until_stopped(runner, runner_loop, components.processes)
    summary = runner.finish()
    if runner.leads:
        print(end_summary(cfg, summary), flush=True)
        print(json.dumps(summary), flush=True)
    return runner.exit_code


def initial_reference(algorithm: Algorithm, model: ActorCritic, resume_state: dict | None) -> ActorCritic | None:
    """The reference policy of an algorithm that annotates (FlowSAR) as the run starts: the policy itself, or on
    resume the one its trainer saved (``state_dict()["reference"]``): the acting side annotates the first batches
    with it, before the learner's first update."""
    if algorithm.annotate is None:
        return None
    reference = copy.deepcopy(model)
    saved = (resume_state or {}).get(algorithm.name)
    if saved is not None:
        reference.load_state_dict(saved["reference"])
    return reference


def build_task_sequence(cfg: Config, tasks: TaskInfo | None, resume_state: dict | None) -> SharedTaskSequence:
    """This rank's one assignment sequence over its shard of (task, init state) pairs, resumed if saved. A
    single-task env gets one too when its episodes form groups: its "init states" are the rank's group seeds."""
    ranks = RankInfo.from_environment()
    if tasks is None:
        first = ranks.rank * GROUP_SEEDS_PER_RANK
        shard = {SINGLE_TASK: list(range(first, first + GROUP_SEEDS_PER_RANK))}
    else:
        shard = shard_pairs(selected_init_states(tasks, cfg.env.tasks, "--tasks"), ranks.rank, ranks.world_size)
    schedule = TaskSchedule(shard, cfg.env.task_group_size)
    sequence = SharedTaskSequence.allocate(
        schedule,
        curriculum=cfg.env.task_sampling == "curriculum",
        window=cfg.env.curriculum_window,
        seed=cfg.env.seed * 7919 + ranks.rank,
        envs=cfg.sampler.num_workers * cfg.sampler.num_envs_per_worker,
    )
    saved = resumed_task_sequence(resume_state, ranks)
    if saved is not None:
        sequence.load_state_dict(saved)
    return sequence


def resumed_task_sequence(resume_state: dict | None, ranks: RankInfo) -> dict | None:
    """This rank's saved task sequence, if the checkpoint has one for the same number of ranks."""
    saved = (resume_state or {}).get("task_sequence", {}).get("ranks", [])
    if len(saved) == ranks.world_size:
        return saved[ranks.rank]
    if saved:
        log.warning(
            "the checkpoint's task sequences belong to %d ranks, this run has %d: the sequences start over",
            len(saved),
            ranks.world_size,
        )
    return None
