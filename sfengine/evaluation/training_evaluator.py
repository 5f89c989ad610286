"""The evaluator during training: the current weights, its own envs, its own process, while training goes on.

    Runner --evaluate(env_steps)--> TrainingEvaluator (process "evaluator")
                                      pull the published weights (SharedWeights, as an inference worker does)
                                      play the evaluation's episodes with the distribution's mode, a slice of
                                      steps per loop tick (so a stop is never kept waiting)
    Runner <--evaluation_done(EvalResult)--+   TensorBoard eval/..., summary.json "eval"
    Runner <--report(EvaluatorReport)------+   its CPU share in the status line's time split

It plays ``envs_per_split`` envs side by side, one batched forward per step. A request that arrives during an
evaluation is dropped: evaluations never queue up behind a slow env. At the run's end (``FinalEvaluation``) it
evaluates the final weights once training's other components have ended, then stops. Multi-task envs: every
task, with ``--eval_episodes_per_task`` init states each, cycling across evaluations (the request's ``index``
says where, so a respawned evaluator goes on where its predecessor stopped); single-task envs: seeds 0..N-1.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from signal_slot.signal_slot import Timer, signal

from sfengine.config import Config
from sfengine.engine.buffers import SharedWeights
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.event_loop import Component, stop_own_loop
from sfengine.engine.lifecycle import STOP_TIMEOUT_SEC, terminate_processes
from sfengine.engine.messages import EvalResult, EvaluationRequest, EvaluatorReport
from sfengine.env.multitask import TaskInfo
from sfengine.env.registry import EnvFactory, env_context
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.evaluation.episode_queue import training_evaluation_episodes
from sfengine.models.actor_critic import ActorCritic
from sfengine.rollout.env_group import EnvGroup, ListSource
from sfengine.tasks.seeding import evaluator_env_seed

log = logging.getLogger(__name__)

SLICE_SEC = 0.2  # the longest the evaluator keeps its loop between two looks at its inbox


class TrainingEvaluator(Component):
    def __init__(
        self,
        event_loop,
        cfg: Config,
        weights: SharedWeights,
        env_factory: EnvFactory,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        tasks: TaskInfo | None,
    ):
        super().__init__(event_loop, "evaluator")
        self.cfg, self.weights, self.env_factory = cfg, weights, env_factory
        self.obs_spec, self.action_spec, self.tasks = obs_spec, action_spec, tasks
        self.stopped = False
        self.final = False  # the evaluation under way is the end-of-run one
        self.started = False
        # A request read before its start (a respawned evaluator reads what was sent to its predecessor first):
        # (the request, final), played once it has started.
        self.early_request: tuple[EvaluationRequest, bool] | None = None

    @signal
    def evaluation_done(self): ...

    @signal
    def report(self): ...

    def on_start(self) -> None:
        set_cpu_threads(1)
        cfg = self.cfg
        self.model = ActorCritic.for_config(cfg, self.obs_spec, self.action_spec).eval()
        # Seeds apart from every rollout worker's (single-task episodes reset with their own seed anyway).
        contexts = [env_context(cfg, -1, i, evaluator_env_seed(cfg.env.seed, i)) for i in range(cfg.envs_per_split)]
        self.source = ListSource()
        self.group = EnvGroup(self.env_factory, contexts, self.source, self.action_spec.chunk, name="evaluator")
        if not self.action_spec.discrete:
            self.low = np.asarray(self.action_spec.low, dtype=np.float32)
            self.high = np.asarray(self.action_spec.high, dtype=np.float32)
        self.busy_sec, self.window_start = 0.0, time.perf_counter()
        self.step_timer = Timer(self.event_loop, 0.01)
        self.step_timer.timeout.connect(self._play)
        self.report_timer = Timer(self.event_loop, 1.0)
        self.report_timer.timeout.connect(self._send_report)
        self.started = True
        if self.early_request is not None:
            request, final = self.early_request
            (self.on_evaluate_final if final else self.on_evaluate)(request)

    def _playing(self) -> bool:
        return bool(self.source.pending) or bool(self.group.active.any())

    def on_evaluate(self, request: EvaluationRequest) -> None:
        """Start an evaluation of the weights published now, unless one is running."""
        if not self.started:
            if self.early_request is None:
                self.early_request = (request, False)
            return
        if self._playing() or self.stopped:
            return
        self.final = False
        self._begin(request)

    def on_evaluate_final(self, request: EvaluationRequest) -> None:
        """Evaluate the final weights (the learner has ended): an evaluation under way, of older weights, is
        dropped."""
        if not self.started:
            self.early_request = (request, True)
            return
        if self.stopped:
            return
        self.final = True
        if self._playing() and self.version == int(self.weights.version[0]):
            return  # the evaluation under way is of the final weights already
        self._begin(request)

    def _begin(self, request: EvaluationRequest) -> None:
        started = time.perf_counter()
        self.version = self.weights.pull(self.model)
        self.env_steps = request.env_steps
        self.source.pending = training_evaluation_episodes(
            self.tasks, request.index, self.cfg.eval.eval_episodes_per_task, self.cfg.eval.eval_episodes
        )
        self.group.take_finished()  # an evaluation of older weights, dropped
        self.group.returns[:], self.group.lengths[:] = 0.0, 0
        self.eval_started = time.time()
        for i in range(len(self.group)):
            self.group.reset(i)
        self.busy_sec += time.perf_counter() - started

    def _play(self) -> None:
        """Step the evaluation for up to SLICE_SEC, then give the loop back."""
        if self.stopped or not self.group.active.any():
            return
        started = time.perf_counter()
        while self.group.active.any() and time.perf_counter() - started < SLICE_SEC:
            self._step()
        self.busy_sec += time.perf_counter() - started
        if not self.group.active.any():
            self._finish()

    def _step(self) -> None:
        """One batched forward over the envs that play, and their actions (a chunk: one after the other)."""
        group = self.group
        active = np.flatnonzero(group.active)
        obs = [group.obs[i] for i in active]
        with torch.inference_mode():
            batch = {key: torch.as_tensor(np.stack([o[key] for o in obs])) for key in obs[0]}
            chosen = self.model.act(batch, self.cfg.eval.eval_deterministic).actions.numpy()
        if not self.action_spec.discrete:
            chosen = np.clip(chosen, self.low, self.high)
        if group.chunk > 1:
            chosen = chosen.reshape(len(active), group.chunk, -1)
        actions = np.zeros((len(group), *chosen.shape[1:]), dtype=chosen.dtype)
        actions[active] = chosen
        group.step(actions)

    def _finish(self) -> None:
        finished = self.group.take_finished()
        result = EvalResult(self.env_steps, self.version, finished, time.time() - self.eval_started, self.final)
        self.evaluation_done.emit(result)

    def _send_report(self) -> None:
        now = time.perf_counter()
        self.report.emit(EvaluatorReport(self.busy_sec, now - self.window_start))
        self.busy_sec, self.window_start = 0.0, now

    def on_stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if hasattr(self, "group"):
            self.group.close()
        stop_own_loop(self)


EVALUATOR_PROCESS = "evaluator_process"


class FinalEvaluation:
    """The training evaluator's part in a run's stop, kept by the runner of rank 0 (``runner`` below: its
    ``processes``, ``exit_code``, ``interrupts``, ``stats`` and its signals ``evaluate_final`` and
    ``stop_evaluator``). The evaluator is not stopped with training's components; once they have ended, the
    learner's last weights are the published ones, and with --eval_at_end a run that ended as planned evaluates
    them before it exits.

        stop ──> rollout, inference, learner end ──> evaluate_final ──> EvalResult(final) ──> stop_evaluator
                 (an evaluation under way goes on)   (and is dropped)

    A signal, a failure, the evaluator's death or a minute without a report of it playing ends the wait, without a
    result.
    """

    def __init__(self, wanted: bool):
        self.wanted = wanted
        self.phase = "training"  # then "evaluating", then "stopping"
        self.clock = 0.0  # evaluating: when the evaluator was last heard from; stopping: when it was asked to stop
        self.stopping_ticks = 0

    def on_stop(self, runner) -> None:
        """The run's stop has begun: without a final evaluation the evaluator stops with the rest."""
        if not self.wanted or self.cut_short(runner):
            self._stop_evaluator(runner)

    def drops(self, runner, result: EvalResult) -> bool:
        """A periodic evaluation that ends after the stop began, where a final one will play the last weights:
        keeping it would leave two evaluations in the last interval, one of weights that are not the last."""
        return not result.final and runner.stop_reason is not None and self.wanted and not self.cut_short(runner)

    @staticmethod
    def cut_short(runner) -> bool:
        return bool(runner.exit_code or runner.interrupts)

    def heard(self, report: EvaluatorReport) -> None:
        if self.phase == "evaluating" and report.busy_sec > 0:  # playing, not idle
            self.clock = time.time()

    def on_result(self, runner, result: EvalResult) -> None:
        if result.final:
            self._stop_evaluator(runner)

    def over(self, runner) -> bool:
        """Each watch tick once training's components have ended: whether the evaluator has ended too."""
        evaluator = next((p for p in runner.processes if p.name == EVALUATOR_PROCESS), None)
        # Serial mode has no processes: the evaluator lives on the runner's loop and ends with it.
        gone = evaluator is not None and not evaluator.is_alive()
        if self.phase == "training":
            last = runner.evaluations[-1] if runner.evaluations else None
            if self.cut_short(runner) or gone:
                self._stop_evaluator(runner)
            elif last is not None and last["policy_version"] == runner.stats.policy_version:
                last["final"] = True
                print(
                    f"final evaluation at {last['env_steps']:,} env steps (policy version {last['policy_version']}): "
                    "the last evaluation's, of these weights",
                    flush=True,
                )
                self._stop_evaluator(runner)
            else:
                self.phase, self.clock = "evaluating", time.time()
                print("training has stopped; evaluating the final policy (--eval_at_end)", flush=True)
                runner.evaluate_final.emit(EvaluationRequest(runner.stats.env_steps, runner.evaluations_done))
            return False
        if self.phase == "evaluating":
            idle = time.time() - self.clock > STOP_TIMEOUT_SEC
            if runner.interrupts or gone or idle:
                why = "a signal" if runner.interrupts else "the evaluator ended" if gone else "the evaluator is idle"
                log.error("the final evaluation was cut short: %s", why)
                self._stop_evaluator(runner)
            return False
        self.stopping_ticks += 1
        if evaluator is None:
            return self.stopping_ticks > 1  # a tick for the evaluator's on_stop to run on the shared loop
        if gone:
            return True
        if time.time() - self.clock > STOP_TIMEOUT_SEC:
            log.error("the evaluator did not stop within %.0f s; terminating it", STOP_TIMEOUT_SEC)
            terminate_processes([evaluator])
            return True
        return False

    def _stop_evaluator(self, runner) -> None:
        if self.phase != "stopping":
            self.phase, self.clock = "stopping", time.time()
            runner.stop_evaluator.emit()
