"""The runner: the main process's component. It holds the run's statistics, reads every component's reports,
decides when the run stops (step and time limits, --stop_at targets, signals, agreed across ranks) and stops it.
Building and wiring the components is ``sfengine.engine.wiring``; watching their processes is ``Supervision``
(sfengine.engine.supervision); the status line and summary.json are ``Reporting`` (sfengine.reporting.reporter).

Processes (multi-process mode):

    main process:     Runner (stats, status line, TensorBoard, stop conditions, summary.json)
    rollout_worker_k: RolloutWorker k            (num_workers processes)
    inference_i:      InferenceWorker i          (num_inference_workers processes; 0: each rollout worker acts)
    learner:          LearnerWorker + a thread running the algorithm's batcher's loop
    evaluator:        TrainingEvaluator          (rank 0, with --eval_every_env_steps)

In serial mode every component lives on the runner's loop. A stop ends the training components first; the
evaluator then evaluates the final weights (--eval_at_end, FinalEvaluation) and ends last.
"""

from __future__ import annotations

import logging
import time

from signal_slot.signal_slot import signal

from sfengine.config import Config
from sfengine.engine.distributed import Launcher, RankInfo
from sfengine.engine.event_loop import Component, EngineProcess
from sfengine.engine.hang_watch import HangWatch
from sfengine.engine.lifecycle import (
    start_watch_and_status_timers,
)
from sfengine.engine.messages import (
    EvalResult,
    EvaluationRequest,
    EvaluatorReport,
    InferenceReport,
    LearnerReport,
    WorkerReport,
)
from sfengine.engine.respawn import Respawner
from sfengine.engine.supervision import Supervision
from sfengine.evaluation.report import EvalReport
from sfengine.evaluation.training_evaluator import FinalEvaluation
from sfengine.reporting.reporter import Reporting
from sfengine.reporting.stats import RunStats
from sfengine.reporting.writer import TensorBoardWriter

log = logging.getLogger(__name__)

AGREED_STOP_TIMEOUT_SEC = 120.0


class Runner(Supervision, Reporting, Component):
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
        self.learner_end_said = False  # a learner that ended without its final report was named (Supervision)
        self.interrupts = 0
        self.writer: TensorBoardWriter | None = None
        self.ranks = RankInfo.from_environment()
        self.launcher = Launcher()
        self.leads = self.ranks.rank == 0  # rank 0 prints, and writes TensorBoard and summary.json
        self.stop_asked: tuple[str, float] | None = None  # multi-rank: (reason, when) of a stop not yet agreed
        self.reported: set[str] = set()  # the workers heard from since their (re)start: their start-up is over
        every = cfg.eval.eval_every_env_steps
        self.next_evaluation = (initial_env_steps // every + 1) * every if every else None
        self.evaluations: list[dict] = []  # the training evaluator's results, for summary.json
        # Evaluations completed: a resumed run takes one for every --eval_every_env_steps it had trained.
        self.evaluations_done = initial_env_steps // every if every else 0
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
            self.writer = TensorBoardWriter(str(self.cfg.experiment_dir / "tensorboard"), flush_secs=10)
        self.stats.started = time.time()
        start_watch_and_status_timers(self)

    def on_worker_report(self, report: WorkerReport) -> None:
        self.reported.add(f"rollout_worker_{report.worker}")
        if self.hang_watch is not None:
            self.hang_watch.heard_from(f"rollout_worker_{report.worker}")
        if self.respawner is not None:
            self.respawner.heard_from(f"rollout_worker_{report.worker}")
        self.stats.add_worker_report(report)
        if (reason := self.stats.env_health.dominate()) is not None:
            self.request_stop(reason, exit_code=1)
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
        if report.final and report.stats.get("final_checkpoint_failed"):
            # The weights trained since the last save that worked are lost: the run cannot say it succeeded.
            log.error("the final checkpoint could not be written (the learner's line above says why): exit code 1")
            self.exit_code = max(self.exit_code, 1)
            self.stop_reason = f"{self.stop_reason or 'stopped'}; the final checkpoint could not be written"
        # Not at the report that ends training: the final evaluation (--eval_at_end) plays the last weights, and
        # without it the evaluator stops with the run, so one asked now would only race it (two in the last interval).
        last = report.env_steps >= run.train_for_env_steps
        if self.next_evaluation is not None and report.env_steps >= self.next_evaluation and self.leads and not last:
            every = self.cfg.eval.eval_every_env_steps
            self.next_evaluation = (report.env_steps // every + 1) * every
            self.evaluate.emit(EvaluationRequest(report.env_steps, self.evaluations_done))
        if report.stop_agreed:
            self.request_stop(self.stop_asked[0] if self.stop_asked else "another rank stopped")
        elif self.stats.env_steps >= run.train_for_env_steps:
            self.request_stop(f"reached {self.stats.env_steps} env steps")
        elif self.leads and (reached := self.stats.target_reached(run.stop_at_return, run.stop_at_success)):
            self.stats.freeze_windows()
            self._stop_every_rank(reached)  # rank 0 alone sees every rank's episodes

    def on_component_failed(self, reason: str) -> None:
        """A component that cannot go on but whose process still runs: the batcher's thread, a rollout worker whose
        env broke its observation_space."""
        log.error("%s; stopping the run", reason)
        self.request_stop(reason, exit_code=1)

    def on_evaluator_report(self, report: EvaluatorReport) -> None:
        # Watched as a worker is: one stuck in its env's step (it reports from its loop) is respawned.
        if self.hang_watch is not None:
            self.hang_watch.heard_from("evaluator")
        if self.respawner is not None:
            self.respawner.heard_from("evaluator")
        self.stats.add_evaluator_report(report)
        self.final_evaluation.heard(report)

    def on_evaluation_done(self, result: EvalResult) -> None:
        """An evaluation of the weights of ``result.policy_version``: TensorBoard, a line, and summary.json."""
        if self.final_evaluation is not None and self.final_evaluation.drops(self, result):
            print(
                f"evaluation at {result.env_steps:,} env steps (policy version {result.policy_version}) ended "
                "after the run began to stop: dropped, the final evaluation plays the last weights",
                flush=True,
            )
            return
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
        self.evaluations_done += not result.final
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
