"""Learner worker: receives a batch slot, runs one PPO update, publishes the weights, releases the slot.

    training_batch_ready(slot) --> PPOTrainer.train --> SharedWeights.publish(version + 1)
        --> batch_released(slot), policy_updated(version), report(LearnerReport)

It also owns the checkpoints (every ``save_every_sec`` and at stop; rank 0 only) and, in a multi-process run,
starts the batcher's event loop in a thread of this process. In a multi-rank run, the learners exchange a
``RankBatch`` before every training batch and all-reduce gradients (``sfengine.engine.distributed``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from signal_slot.signal_slot import Timer, signal

from sfengine.algorithms import algorithm_for
from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.checkpoint import CheckpointSaveError, list_checkpoints, save_checkpoint
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.distributed import LearnerGroup, RankBatch, RankInfo, parameter_checksum, rank_device
from sfengine.engine.event_loop import Component, stop_own_loop
from sfengine.engine.messages import EpisodeStats, LearnerReport
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.trainer import load_optimizer_state
from sfengine.models.actor_critic import ActorCritic
from sfengine.tasks.sequence import SharedTaskSequence

log = logging.getLogger(__name__)

NUM_BATCH_SLOTS = 2


class LearnerWorker(Component):
    def __init__(
        self,
        event_loop,
        cfg: Config,
        buffers: SharedBuffers,
        weights: SharedWeights,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        batcher: Component,
        resume_state: dict | None,
        task_sequence: SharedTaskSequence | None = None,
    ):
        super().__init__(event_loop, "learner")
        self.cfg, self.buffers, self.weights = cfg, buffers, weights
        self.obs_spec, self.action_spec = obs_spec, action_spec
        self.batcher = batcher
        self.resume_state = resume_state
        self.task_sequence = task_sequence  # its position is saved, so a resumed run continues the sequence
        self.batcher_thread: threading.Thread | None = None
        self.started = self.stopped = False
        self.stop_requested = False  # this rank's runner asked; the ranks agree at the next exchange
        self.stop_agreed = False
        self.pending_episodes: list[EpisodeStats] = []  # this rank's episodes, for rank 0's statistics

    @signal
    def batch_released(self): ...

    @signal
    def policy_updated(self): ...

    @signal
    def report(self): ...

    def on_start(self) -> None:
        # Marked in shared memory: a start-up that never ends (a rank that never joins the broadcast, a base policy
        # or replay that never loads) is the runner's to notice (HangWatch.learner_hung, --startup_timeout_sec).
        clock = self.buffers.learner_clock
        clock[0], clock[2] = time.time(), 1.0
        self._start()
        clock[0], clock[2] = 0.0, 0.0

    def _start(self) -> None:
        cfg = self.cfg
        set_cpu_threads(cfg.learner.learner_threads)
        self.ranks = RankInfo.from_environment()
        self.device = rank_device(cfg.learner.device, self.ranks)
        self.group = LearnerGroup(self.ranks, self.device)
        self.model = ActorCritic.for_config(cfg, self.obs_spec, self.action_spec).to(self.device)
        # Train the very weights the inference workers act with first: those the runner published (built from
        # --seed, or loaded from the checkpoint on resume). A model of this process's own would be another policy,
        # foreign to the first batches' log-probs and values.
        self.weights.pull(self.model)
        algorithm = algorithm_for(cfg)
        self.trainer = algorithm.trainer(self.model, cfg, self.group)
        self.trainer.heartbeat = self.gradient_step_done
        # The checkpoint's key for the trainer's own state (FlowSAR's reference, --kl_coeff's): the algorithm's name.
        self.trainer_key = algorithm.name
        # A reference policy (FlowSAR's) travels beside the policy; the acting side annotates with it.
        self.reference = self.trainer.reference
        self.env_steps, self.version = 0, 0
        if self.resume_state is not None:
            load_optimizer_state(self.trainer.optimizer, self.resume_state["optimizer"])
            if self.trainer_key in self.resume_state:
                self.trainer.load_state_dict(self.resume_state[self.trainer_key])  # its reference goes on as it was
            self.env_steps = int(self.resume_state["env_steps"])
            self.version = int(self.resume_state["policy_version"])
            self.resume_state = None
        # Every rank builds the same initial model from --seed, but only rank 0's weights are the truth.
        self.group.broadcast_model(self.model)
        self.weights.publish(self.model, self.version, self.reference)
        self.rank_env_steps = [0] * self.ranks.world_size  # this run's, per rank
        self.rank_sequences: list[dict] = [{}] * self.ranks.world_size
        slots = [algorithm.allocate_batch(cfg, self.obs_spec, self.action_spec) for _ in range(NUM_BATCH_SLOTS)]
        if self.device.type == "cuda":
            slots = [slot.pin_memory_() for slot in slots]
        self.batch_slots = slots
        self.batcher.set_batch_slots(slots)
        self.train_sec = 0.0
        self.failed_saves = 0
        self.last_save = time.time()
        if cfg.run.save_every_sec > 0:
            self.save_timer = Timer(self.event_loop, cfg.run.save_every_sec)
            self.save_timer.timeout.connect(self.save)
        if self.batcher.event_loop is not self.event_loop:
            self.batcher_thread = threading.Thread(target=self._run_batcher, name="batcher", daemon=True)
            self.batcher_thread.start()
        self.started = True

    def _run_batcher(self) -> None:
        """The batcher's loop, in a thread of this process. An exception there would end the thread alone and
        leave the run waiting for batches for good: the runner is told, and stops the run (exit code 1; this
        learner saves its checkpoint as at any stop)."""
        try:
            self.batcher.event_loop.exec()
        except Exception as error:
            log.exception("the batcher failed")
            self.batcher.failed.emit(f"batcher failed: {type(error).__name__}: {error}")

    def on_rank_episodes(self, episodes: list[EpisodeStats]) -> None:
        self.pending_episodes.extend(episodes)

    def on_stop_requested(self) -> None:
        self.stop_requested = True

    def on_training_batch(self, slot: int) -> None:
        if self.stopped:
            return
        if self.env_steps >= self.cfg.run.train_for_env_steps or self.stop_agreed:
            # Batches collected while the stop is on its way are not trained on: the limit is exact to a batch.
            self.batch_released.emit(slot)
            return
        started = time.perf_counter()
        batch = self.batch_slots[slot]
        samples = batch.sampled_env_steps()
        # An empty group batch only counts the env steps of dropped groups (--dynamic_sampling): nothing to train.
        # The ranks' updates all-reduce gradients step by step, so then no rank updates this round.
        ranks, in_sync = self._exchange(samples, batch.trainable)
        other_ranks_episodes = [episode for rank in ranks[1:] for episode in rank.episodes]
        if any(rank.stop_requested for rank in ranks):
            self.stop_agreed = True
            self.batch_released.emit(slot)
            self._report({}, other_ranks_episodes, in_sync, stop_agreed=True)
            return
        stats: dict[str, float] = {}
        if all(rank.trainable for rank in ranks) and not self.cfg.debug.benchmark:
            with self.busy():
                on_device = batch.to(self.device) if self.device.type != "cpu" else batch
                stats = self.trainer.train(on_device, self.version, self.env_steps)
            # How many updates behind the learner the acting policies were, whatever the algorithm.
            lag = (self.version - batch.acting_versions()).float()
            stats.update(policy_lag_mean=float(lag.mean()), policy_lag_max=float(lag.max()))
            self.version += 1
            self.weights.publish(self.model, self.version, self.reference)
        stats.update(batch.batch_stats())
        if self.failed_saves:
            stats["checkpoint_save_failures"] = float(self.failed_saves)
        self.env_steps += sum(rank.samples for rank in ranks)
        self.rank_env_steps = [steps + rank.samples for steps, rank in zip(self.rank_env_steps, ranks)]
        self.batch_released.emit(slot)
        self.policy_updated.emit(self.version)
        self.train_sec += time.perf_counter() - started
        self._report(stats, other_ranks_episodes, in_sync)

    def _exchange(self, samples: int, trainable: bool = True) -> tuple[list[RankBatch], bool]:
        """Tell the other ranks this rank's news; return theirs, and whether every rank holds the same weights."""
        checksum = parameter_checksum(self.model) if self.group.distributed else 0.0
        mine = RankBatch(
            samples, self.stop_requested, self._task_sequence(), checksum, self.pending_episodes, trainable
        )
        ranks = self.group.exchange(mine)
        self.pending_episodes = []
        self.rank_sequences = [rank.task_sequence for rank in ranks]
        return ranks, len({rank.parameter_checksum for rank in ranks}) == 1

    def _task_sequence(self) -> dict:
        return self.task_sequence.state_dict() if self.task_sequence is not None else {}

    def _report(
        self,
        stats: dict[str, float],
        other_ranks_episodes: list[EpisodeStats] | None = None,
        in_sync: bool = True,
        final: bool = False,
        stop_agreed: bool = False,
    ) -> None:
        batcher_sec, self.batcher.busy_sec = self.batcher.busy_sec, 0.0
        self.report.emit(
            LearnerReport(
                self.env_steps,
                self.version,
                self.train_sec,
                batcher_sec,
                stats,
                final,
                tuple(self.rank_env_steps),
                other_ranks_episodes or [],
                in_sync,
                stop_agreed,
            )
        )
        self.train_sec = 0.0

    def checkpoint_state(self) -> dict:
        others, rank = self.rank_sequences, self.ranks.rank
        return {
            self.trainer_key: self.trainer.state_dict(),
            "model": {name: t.detach().cpu() for name, t in self.model.state_dict().items()},
            "optimizer": self.trainer.optimizer.state_dict(),
            "env_steps": self.env_steps,
            "policy_version": self.version,
            # Each rank's task sequence: this rank's as it is now, the others' as of the last exchange.
            "task_sequence": {"ranks": [*others[:rank], self._task_sequence(), *others[rank + 1 :]]},
        }

    @contextlib.contextmanager
    def busy(self):
        """Mark an update or a save in shared memory while it runs, so the runner can tell a learner stuck in
        one (HangWatch) from one waiting for a batch."""
        clock = self.buffers.learner_clock
        started = time.time()
        clock[0], clock[3] = started, 0.0
        try:
            yield
        finally:
            clock[1] = max(float(clock[1]), time.time() - started)
            clock[0] = 0.0

    def gradient_step_done(self) -> None:
        """The trainer's heartbeat: an update that takes long but keeps stepping (a learner starved of CPU by the
        machine's other work) is slow, not hung."""
        self.buffers.learner_clock[3] = time.time()

    def save(self) -> bool:
        """Write a checkpoint (rank 0); whether it was written. A failed write (disk full, no permission) is one
        line in the log and a count in the stats: the run goes on, the older checkpoints stay, the next save
        (``--save_every_sec`` later, or at stop) tries again."""
        if self.ranks.rank != 0:
            return True  # every rank holds the same weights; rank 0 writes them
        try:
            with self.busy():
                path = save_checkpoint(self.cfg.experiment_dir, self.checkpoint_state(), self.cfg.run.keep_checkpoints)
        except CheckpointSaveError as exc:
            self.failed_saves += 1
            kept = list_checkpoints(self.cfg.experiment_dir)
            log.error("%s; kept %s; the run goes on and the next save retries", exc, kept[-1].name if kept else "none")
            return False
        log.info("checkpoint saved: %s", path.name)
        return True

    def on_stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if not self.started:
            # A stop that arrived before the start (a time limit shorter than start-up, an early signal): nothing
            # was loaded or trained, so there is nothing to save or report.
            stop_own_loop(self)
            return
        in_sync = True
        if self.group.distributed and (self.stop_agreed or self.env_steps >= self.cfg.run.train_for_env_steps):
            # Every rank stops at the same point, so one last exchange is safe: it checks the final weights and
            # brings the other ranks' task sequences up to date for the checkpoint.
            _, in_sync = self._exchange(0)
        saved = self.save()
        if self.batcher_thread is not None:
            self.batcher.event_loop.stop()
            self.batcher_thread.join(timeout=10)
        self._report({} if saved else {"final_checkpoint_failed": 1.0}, in_sync=in_sync, final=True)
        self.group.close()
        stop_own_loop(self)
