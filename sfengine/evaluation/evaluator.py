"""Run an evaluation's episodes through the engine's own rollout and inference workers (no learner).

    EvalRunner (main process): progress line, stop when every worker is done
        ^ WorkerReport(episodes, finished)
    RolloutWorker w (process) --InferenceRequest--> InferenceWorker (process, the distribution's mode)
        ^                       <--policy_outputs---
        +-- SharedEpisodeQueue: the next (task, init state) or seed; None once the set is exhausted

The rollout workers reuse their buffers at once (nothing learns), and an env that finds the episode set
exhausted stops, so each episode of the set runs exactly once whatever the worker layout.

A worker that dies or hangs is respawned as in training (``Respawner``, within ``--max_respawns``): the episodes a
dead rollout worker drew and never reported go back to the queue ahead of the rest (``hand_out_again``), and one it
reported just before it died but played again comes in twice and is counted once (by its queue position). So an
evaluation cut by a worker's crash still plays every episode exactly once; past ``--max_respawns`` it stops with
what it has, and ``--resume`` plays the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from signal_slot.signal_slot import signal

from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.event_loop import Component, EngineEventLoop, EngineProcess, death_reason, unrespawnable
from sfengine.engine.fork_server import component_context
from sfengine.engine.hang_watch import HangWatch
from sfengine.engine.lifecycle import (
    STOP_TIMEOUT_SEC,
    component_loops,
    run_until_stopped,
    start_watch_and_status_timers,
    terminate_processes,
)
from sfengine.engine.messages import EpisodeStats, WorkerReport
from sfengine.engine.respawn import InboxLockHeld, Respawner
from sfengine.engine.supervision import end_hung_worker, print_stack, respawn_paused
from sfengine.env.registry import EnvFactory
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.evaluation.episode_queue import EvalEpisode, SharedEpisodeQueue
from sfengine.evaluation.video import EvalOutput
from sfengine.inference.inference_worker import InferenceWorker, connect_inference
from sfengine.inference.policy_actor import own_policy
from sfengine.models.actor_critic import ActorCritic
from sfengine.reporting.stats import EnvHealth
from sfengine.tasks.seeding import evaluation_component_seed

log = logging.getLogger(__name__)


class EvalRunner(Component):
    """Collects the finished episodes (each once), prints progress, respawns dead or hung workers, and stops the
    components once every worker is done."""

    def __init__(
        self,
        event_loop,
        cfg: Config,
        queue: SharedEpisodeQueue,
        hang_watch: HangWatch | None,
        leads: bool,
    ):
        super().__init__(event_loop, "eval_runner")
        self.cfg, self.queue, self.hang_watch, self.leads = cfg, queue, hang_watch, leads
        self.respawner: Respawner | None = None  # multi-process mode: dead or hung workers replaced
        self.num_episodes = len(queue)
        self.episodes: list[EpisodeStats] = []
        self.reported: set[int] = set()  # the queue positions of the episodes in ``episodes``
        self.repeats = 0  # episodes reported twice (played again after their worker died), counted once
        self.env_health = EnvHealth()  # an env that raises at most steps stops the evaluation, as it stops training
        self.finished_workers: set[int] = set()
        self.processes: list[EngineProcess] = []
        self.error: str | None = None
        self.stopping_since = 0.0
        self.interrupts = 0
        self.started = time.time()
        # Called with the episodes so far at each progress line that has new ones (sfengine.evaluate writes them
        # there, to results.json or a rank's progress file, so that a kill of this process leaves them for --resume).
        self.progress: Callable[[list[EpisodeStats]], None] | None = None
        self.episodes_written = 0

    @signal
    def stop(self): ...

    @signal
    def inference_respawned(self): ...

    def on_start(self) -> None:
        self.started = time.time()
        start_watch_and_status_timers(self)

    def on_worker_report(self, report: WorkerReport) -> None:
        component = f"rollout_worker_{report.worker}"
        if self.hang_watch is not None:
            self.hang_watch.heard_from(component)
        if self.respawner is not None:
            self.respawner.heard_from(component)
        self.env_health.add(report)
        if not self.stopping_since and (reason := self.env_health.dominate()) is not None:
            self._stop_all(reason)
        for episode in report.episodes:
            if episode.position in self.reported:
                self.repeats += 1
                continue
            self.reported.add(episode.position)
            self.episodes.append(episode)
        if report.finished:
            self.finished_workers.add(report.worker)
            if self.hang_watch is not None:
                self.hang_watch.last_heard.pop(component, None)  # idle from now on

    def on_component_failed(self, reason: str) -> None:
        """A rollout worker whose env broke its spaces: the evaluation cannot go on."""
        if not self.stopping_since:
            self._stop_all(reason)

    def on_inference_report(self, report) -> None:
        if self.respawner is not None:
            self.respawner.heard_from(f"inference_worker_{report.worker}")
        if self.hang_watch is not None and len(self.finished_workers) < self.cfg.sampler.num_workers:
            self.hang_watch.heard_from(f"inference_worker_{report.worker}")

    def _watch(self) -> None:
        if self.hang_watch is not None:
            self.hang_watch.looked()
        if self.stopping_since:
            if all(not p.is_alive() for p in self.processes):
                self.event_loop.stop()
            elif time.time() - self.stopping_since > STOP_TIMEOUT_SEC:
                stragglers = ", ".join(p.name.removesuffix("_process") for p in self.processes if p.is_alive())
                log.error("components did not stop within %.0f s: %s; terminating them", STOP_TIMEOUT_SEC, stragglers)
                terminate_processes(self.processes)
                self.event_loop.stop()
            return
        if self.respawner is not None and not self.interrupts:
            self.respawner.chaos_victim(self.processes)
        if len(self.finished_workers) == self.cfg.sampler.num_workers:
            self._stop_all()
        elif starting := self._starting_when_every_episode_is_played():
            names = ", ".join(p.name.removesuffix("_process") for p in starting)
            log.warning("%s still in its start-up when every episode had been played; ending it", names)
            terminate_processes(starting)
            self._stop_all()
        elif self.interrupts:
            self._stop_all("interrupted by a signal")
        elif dead := [p for p in self.processes if not p.is_alive() and not self._pausing(p)]:
            self._dead(dead)
        elif self.hang_watch is not None and (hung := self.hang_watch.hung()):
            self._hung(hung, self.hang_watch.describe(hung), "--hang_timeout_sec")
        elif self.hang_watch is not None and (starting := self.hang_watch.startup_hung(self.processes)):
            self._hung(*starting, "--startup_timeout_sec")

    def _pausing(self, process: EngineProcess) -> bool:
        return self.hang_watch is not None and respawn_paused(process, self.hang_watch.up_since)

    def _refusal(self, component: str) -> str | None:
        """Why ``component`` is not respawned, or None if it is."""
        if self.respawner is None:
            return "respawning needs worker processes"
        return self.respawner.refusal(component)

    def _dead(self, dead: list[EngineProcess]) -> None:
        """Respawn dead workers; one past --max_respawns stops the evaluation with what it has."""
        for process in dead:
            component = process.name.removesuffix("_process")
            refusal = self._refusal(component) or unrespawnable(process)
            if refusal is not None:
                log.error("%s died (exit code %s); %s; ending the evaluation", component, process.exitcode, refusal)
                self._stop_all(death_reason(process))
                return
            log.error("%s died (exit code %s); respawning it", component, process.exitcode)
            if not self._respawn(process):
                return

    def _hung(self, component: str, description: str, option: str) -> None:
        """Print the hung worker's stack, then respawn it; past --max_respawns, end it at once (it would read no
        stop) and stop the evaluation with what it has."""
        process = next(p for p in self.processes if p.name == f"{component}_process")
        print_stack(process)
        refusal = self._refusal(component)
        if refusal is None:
            log.error("%s (hung?); its stack is above; respawning it (%s)", description, option)
            self._respawn(process)
            return
        log.error("%s (hung?); its stack is above; %s; ending the evaluation (%s)", description, refusal, option)
        end_hung_worker(process, self.processes, self.hang_watch)
        self._stop_all(f"hung: {description} ({option})")

    def _respawn(self, process: EngineProcess) -> bool:
        """Replace a dead or hung worker; a rollout worker's unreported episodes are handed out again first, once
        it can draw no more. False if it could not be respawned (the evaluation stops)."""
        component = process.name.removesuffix("_process")
        self.hang_watch.forget(component)
        if component.startswith("rollout_worker_"):
            worker = int(component.rsplit("_", 1)[1])
            process.kill()
            process.join(10.0)
            self.finished_workers.discard(worker)
            again = self.queue.hand_out_again(worker, self.reported)
            if again:
                shown = ", ".join(f"({e.task}, {e.init_state})" for e in again[:8])
                more = f" and {len(again) - 8} more" if len(again) > 8 else ""
                log.info("%s: %d episodes handed out again: %s%s", component, len(again), shown, more)
        try:
            self.respawner.respawn(process, self.processes)
        except InboxLockHeld as error:
            log.error("%s cannot be respawned: %s; ending the evaluation", component, error)
            self._stop_all(f"respawn failed: {component}")
            return False
        if component.startswith("inference_worker_"):
            self.inference_respawned.emit(int(component.rsplit("_", 1)[1]))
        return True

    def _starting_when_every_episode_is_played(self) -> list[EngineProcess]:
        """Workers still in their start-up (they hold no episode) once every episode was played by the others, which
        have all finished: the evaluation is complete without them."""
        if self.hang_watch is None or len(self.episodes) < self.num_episodes:
            return []
        workers = [p for p in self.processes if p.name.startswith("rollout_worker_")]
        starting = [p for p in workers if p.name.removesuffix("_process") not in self.hang_watch.up_since]
        finished = {f"rollout_worker_{w}_process" for w in self.finished_workers}
        return starting if all(p in starting or p.name in finished for p in workers) else []

    def _stop_all(self, error: str | None = None) -> None:
        self.error = error
        self.stopping_since = time.time()
        self._status()
        self.stop.emit()  # in serial mode the loop stops at the next tick, once the components have closed

    def _status(self) -> None:
        if self.progress is not None and len(self.episodes) > self.episodes_written and not self.stopping_since:
            self.episodes_written = len(self.episodes)
            self.progress(self.episodes)
        if not self.leads:
            return
        done, total = len(self.episodes), self.num_episodes
        elapsed = time.time() - self.started
        eta = elapsed / done * (total - done) if done else float("nan")
        successes = [e.success for e in self.episodes if e.success == e.success]
        line = f"[{elapsed:7.1f}s] episodes {done}/{total} ({100 * done / max(total, 1):.0f}%)"
        line += f"  ETA {eta:.0f}s" if done < total and done else ""
        line += f"  success {sum(successes) / len(successes):.3f}" if successes else ""
        if self.episodes:
            line += f"  return {sum(e.episode_return for e in self.episodes) / done:.2f}"
        print(line, flush=True)


def connect_evaluation(runner: EvalRunner, workers: list, inference_workers: list) -> None:
    """The evaluation's data flow: the training graph without the batcher and the learner."""
    connect_inference(workers, inference_workers)
    for worker in workers:
        worker.report.connect(runner.on_worker_report)
        worker.failed.connect(runner.on_component_failed)
        runner.inference_respawned.connect(worker.on_inference_respawned)
    for inference in inference_workers:
        inference.report.connect(runner.on_inference_report)
    for component in (*workers, *inference_workers):
        component.event_loop.start.connect(component.on_start)
        runner.stop.connect(component.on_stop)


def run_evaluation(
    cfg: Config,
    env_factory: EnvFactory,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    model: ActorCritic,
    policy_version: int,
    episodes: list[EvalEpisode],
    output: EvalOutput,
    leads: bool = True,
    progress: Callable[[list[EpisodeStats]], None] | None = None,
) -> tuple[list[EpisodeStats], str | None]:
    """Run ``episodes`` with ``model``'s policy; return the finished episodes and why some are missing: the error
    that cut the evaluation short, or the env's failures that dropped episodes (None when every episode ran).
    ``progress`` is given the episodes so far at each progress line that has new ones."""
    from sfengine.rollout.rollout_worker import RolloutWorker

    # Every episode is played with the one policy as soon as an env is free: never wait for a learner.
    cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, async_rl=True))
    mp_context = component_context()
    buffers = SharedBuffers.allocate(cfg, obs_spec, action_spec, evaluation=True)
    weights = SharedWeights.allocate(model)
    weights.publish(model, policy_version)
    queue = SharedEpisodeQueue(episodes)

    serial = cfg.sampler.serial_mode
    runner_loop = EngineEventLoop("eval_runner_evt_loop", serial_mode=serial)
    hang_watch = None if serial else HangWatch(cfg, buffers.splits)
    runner = EvalRunner(runner_loop, cfg, queue, hang_watch, leads)
    runner.progress = progress
    runner_loop.start.connect(runner.on_start)
    processes: list[EngineProcess] = []
    loop_for = component_loops(
        serial, runner_loop, mp_context, processes, evaluation_component_seed(cfg.env.seed, policy_version)
    )

    deterministic = cfg.eval.eval_deterministic
    workers = [
        RolloutWorker(
            loop_for(f"rollout_worker_{w}"),
            w,
            cfg,
            buffers,
            env_factory,
            action_spec,
            queue,
            output,
            own_policy(cfg, buffers, weights, obs_spec, action_spec, w, deterministic),
        )
        for w in range(cfg.sampler.num_workers)
    ]
    inference_workers = [
        InferenceWorker(
            loop_for(f"inference_worker_{i}"), i, cfg, buffers, weights, obs_spec, action_spec, deterministic
        )
        for i in range(cfg.sampler.num_inference_workers)
    ]
    connect_evaluation(runner, workers, inference_workers)
    runner.processes = processes
    if not serial:
        inboxes = [p.event_loop.signal_queue for p in processes] + [runner_loop.signal_queue]
        runner.respawner = Respawner(cfg, buffers, None, inboxes)
    run_until_stopped(runner, runner_loop, processes)
    if runner.respawner is not None and runner.respawner.stats.total:
        respawns = ", ".join(f"{name} {count}x" for name, count in sorted(runner.respawner.stats.respawns.items()))
        log.warning(
            "workers respawned during the evaluation: %s; %d episodes came in twice and were counted once",
            respawns,
            runner.repeats,
        )
    if runner.error is None and len(runner.episodes) < len(episodes) and (dropped := runner.env_health.dropped()):
        return runner.episodes, f"{len(runner.episodes)} episodes finished of {len(episodes)}: {dropped}"
    return runner.episodes, runner.error
