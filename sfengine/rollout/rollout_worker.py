"""Rollout worker: steps ``num_envs_per_worker`` envs in ``worker_num_splits`` double-buffered groups.

    split 0: step envs -> write obs -> request ......... wait .......... actions -> step envs -> ...
    split 1: ........... wait .......... actions -> step envs -> write obs -> request ......... wait

While a split waits for the inference worker, the other split steps, so the CPU stays on the envs.

With ``--num_inference_workers=0`` the worker acts itself: its requests come back to its own loop, and after each
batch of signals one forward pass of its own PolicyActor serves every split that asked (no inference process,
no wake-ups of one: for small CPU policies on slow simulators, when the machine has a core per rollout worker).

Per step t of a split, the worker writes obs[t+1], rewards[t], terminated[t], truncated[t] into the split's
trajectory buffers (shared memory) and sends an ``InferenceRequest`` naming only the split. The inference
worker writes actions, log-probs, values and the policy version at [buffer, t]. After ``rollout`` steps the
buffers go to the batcher and fresh ones are taken from this worker's free list.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque

import numpy as np
from signal_slot.signal_slot import Timer, signal

from sfengine.algorithms import algorithm_for
from sfengine.config import Config
from sfengine.engine.buffers import CARRIED_FIELDS, SharedBuffers
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.distributed import RankInfo
from sfengine.engine.event_loop import Component, stop_own_loop
from sfengine.engine.messages import (
    BuffersReleased,
    EpisodeStats,
    InferenceRequest,
    PolicyOutputs,
    TrajectoriesReady,
    WorkerReport,
)
from sfengine.env.registry import EnvFactory, env_context
from sfengine.env.spaces import DEFAULT_OBS_KEY, ActionSpec
from sfengine.evaluation.episode_queue import SharedEpisodeQueue
from sfengine.evaluation.video import EvalOutput
from sfengine.inference.policy_actor import PolicyActor
from sfengine.rollout.env_group import (
    ENV_CLOSE_TIMEOUT_SEC,
    EnvGroup,
    EpisodeSource,
    QueueSource,
    SeedSource,
    SequenceSource,
)
from sfengine.tasks.seeding import rollout_env_seed
from sfengine.tasks.sequence import SharedTaskSequence

log = logging.getLogger(__name__)

NO_REQUEST = -1


class SplitRunner:
    """One group of envs of a worker (an ``EnvGroup``) and the state of its current rollout."""

    def __init__(self, group: EnvGroup, row: int):
        self.group = group
        self.row = row  # row in SplitState: worker * num_splits + split
        self.buffer_ids = np.zeros(len(group), dtype=np.int64)
        self.t = 0
        self.truncated_envs: list[int] = []  # envs whose final obs awaits V(final_obs)
        self.truncation_scales = np.ones(len(group))  # and the factor that value takes (chunks cut short: gamma^-k)
        self.held: dict[str, np.ndarray] | None = None  # last step of a rollout while the split waits
        self.request = NO_REQUEST  # the number of the request awaiting outputs
        self.may_resume = True  # False while it waits for a new policy (synchronous mode)
        self.rollouts_since_update = 0


class RolloutWorker(Component):
    def __init__(
        self,
        event_loop,
        worker: int,
        cfg: Config,
        buffers: SharedBuffers,
        env_factory: EnvFactory,
        action_spec: ActionSpec,
        task_sequence: SharedTaskSequence | SharedEpisodeQueue | None = None,
        evaluation: EvalOutput | None = None,
        policy: PolicyActor | None = None,
    ):
        super().__init__(event_loop, f"rollout_worker_{worker}")
        self.worker, self.cfg, self.buffers = worker, cfg, buffers
        self.env_factory, self.action_spec = env_factory, action_spec
        # Multi-task envs: where every reset's (task, init state) comes from. Evaluation: the finite episode set,
        # also for single-task envs (the seed of each reset).
        self.task_sequence = task_sequence
        # Evaluation: nothing learns, so buffers are reused at once; envs stop when the set is exhausted.
        self.evaluation = evaluation
        # --num_inference_workers=0: the policy this worker acts with itself, and the requests it has not served.
        self.policy = policy
        self.own_requests: list[InferenceRequest] = []
        self.splits: list[SplitRunner] = []
        self.free_ids: deque[int] = deque()  # filled at start, from SharedBuffers.lends
        self.lent: set[int] = set()  # buffers handed to the batcher and not given back yet
        self.waiting_splits: deque[SplitRunner] = deque()  # at a rollout boundary, waiting for buffers or a policy
        self.sync_rollouts = 0 if cfg.sampler.async_rl else self._rollouts_per_update(cfg)
        # Group advantages: every step records its episode's sequence position, every episode end its outcome.
        self.outcome_is_success = cfg.env.group_outcome == "success"
        self.warned_no_success = False
        self.grouped = algorithm_for(cfg).grouped(cfg)  # episodes batched in groups: outcomes matter
        self.stopped = False
        self.broken = False  # an env broke its observation_space: the run is stopping (``failed``)

    @staticmethod
    def _rollouts_per_update(cfg: Config) -> int:
        s = cfg.sampler
        return cfg.samples_per_training_batch // (s.num_workers * s.num_envs_per_worker * s.rollout)

    @signal
    def inference_request(self): ...

    @signal
    def trajectories_ready(self): ...

    @signal
    def report(self): ...

    @signal
    def failed(self): ...  # (reason: str) an env broke its spaces mid-run: the run cannot go on

    # ---------------------------------------------------------------- start-up

    def on_start(self) -> None:
        set_cpu_threads(1)
        cfg = self.cfg
        if self.policy is not None:
            self.policy.start()
            self.event_loop.after_signals.append(self._act_on_own_requests)
        traj = self.buffers.trajectories
        self.traj = traj.numpy_views()
        self.obs_np = {key: t.numpy() for key, t in traj.obs.items()}
        self.split_ids_np = self.buffers.splits.buffer_ids.numpy()
        self.split_step_np = self.buffers.splits.step.numpy()
        self.final_obs_np = {key: t.numpy() for key, t in self.buffers.splits.final_obs.items()}
        self.keeps_final_obs = bool(traj.final_obs)
        self.final_values_np = self.buffers.splits.final_values.numpy()
        self.stepping_env_np = self.buffers.splits.stepping_env.numpy()  # what the runner names if this hangs
        self.assignments_np = self.buffers.splits.assignments.numpy()
        self.positions_np = self.buffers.splits.positions.numpy()  # with the assignments: what a respawn replays
        self.drawing_np = self.buffers.splits.drawing.numpy()
        self.requests_np = self.buffers.splits.requests.numpy()
        # A respawned worker finds some of its buffers still with the batcher: they come back as usual.
        self.lends_np = self.buffers.lends.numpy()
        own = self.buffers.worker_buffer_ids(self.worker)
        self.lent = {i for i in own if self.lends_np[i, 0] != self.lends_np[i, 1]}
        self.free_ids = deque(i for i in own if i not in self.lent)
        if not self.action_spec.discrete:
            self.action_low = np.asarray(self.action_spec.low, dtype=np.float32)
            self.action_high = np.asarray(self.action_spec.high, dtype=np.float32)
        self.rollout = cfg.sampler.rollout
        self.chunk, self.gamma = self.action_spec.chunk, cfg.learner.gamma

        envs_per_split = cfg.envs_per_split
        global_worker = RankInfo.from_environment().rank * cfg.sampler.num_workers + self.worker
        render_size = self.evaluation.video_size if self.evaluation and self.evaluation.video_dir else 0
        for split in range(cfg.sampler.worker_num_splits):
            row = self.worker * cfg.sampler.worker_num_splits + split
            contexts = []
            for i in range(envs_per_split):
                env_index = split * envs_per_split + i
                # Distinct across all envs of the run, and reproducible from --seed.
                seed = rollout_env_seed(cfg.env.seed, global_worker, cfg.sampler.num_envs_per_worker, env_index)
                contexts.append(env_context(cfg, self.worker, env_index, seed, render_size))
            group = EnvGroup(
                self.env_factory,
                contexts,
                self._episode_source(row),
                self.chunk,
                self.gamma,
                self.evaluation,
                self.stepping_env_np[row : row + 1],
                f"rollout worker {self.worker}",
            )
            self.splits.append(SplitRunner(group, row))

        self.start_sec = self.busy_sec = 0.0  # start_sec: the first resets' time, counted as env time
        self.window_start = time.perf_counter()
        self.report_timer = Timer(self.event_loop, 1.0)
        self.report_timer.timeout.connect(self._send_report)

        for split in self.splits:
            started = time.perf_counter()
            if len(self.free_ids) < len(split.group):
                # A respawned worker whose predecessor had lent most of its buffers (a learner that sets the pace
                # holds them): this split starts where the batcher gives enough back, as after a rollout.
                self._start_waiting(split)
                self.start_sec += time.perf_counter() - started
                continue
            self._take_buffers(split)
            for i in range(len(split.group)):
                obs = split.group.reset(i)
                if obs is not None:
                    self._write_obs(obs, split.buffer_ids[i], 0, split.group, i)
            if self.broken:
                return
            self.traj["episode_positions"][split.buffer_ids, 0] = split.group.positions
            self.start_sec += time.perf_counter() - started
            if split.group.active.any():
                self._request(split)
        # The first report: start-up is over, the runner's hang watch begins. An evaluation with fewer episodes
        # than envs may leave this worker nothing to do at all.
        self._send_report(finished=self.evaluation is not None and not self._any_active())

    def _episode_source(self, row: int) -> EpisodeSource:
        if self.task_sequence is None:
            return SeedSource()
        if self.evaluation is not None:
            return QueueSource(self.task_sequence, self.worker)
        arrays = {"assignments": self.assignments_np, "positions": self.positions_np, "drawing": self.drawing_np}
        return SequenceSource(self.task_sequence, row, arrays, self.cfg.env.seed)

    def _any_active(self) -> bool:
        return any(split.group.active.any() for split in self.splits)

    def _start_waiting(self, split: SplitRunner) -> None:
        """Reset ``split``'s envs and hold their first observations until buffers are free (``_resume_waiting``
        writes them at step 0 and asks for the policy's actions)."""
        held = {f"obs.{key}": np.zeros_like(view[: len(split.group), 0]) for key, view in self.obs_np.items()}
        for i in range(len(split.group)):
            obs = split.group.reset(i)
            for key, value in (obs or {}).items():
                held[f"obs.{key}"][i] = value
        split.held = held | {"episode_positions": np.asarray(split.group.positions).copy()}
        split.may_resume = True
        self.waiting_splits.append(split)

    def _take_buffers(self, split: SplitRunner) -> None:
        for i in range(len(split.group)):
            split.buffer_ids[i] = self.free_ids.popleft()
        split.t = 0
        self.split_ids_np[split.row] = split.buffer_ids

    def _write_obs(self, obs: dict, buffer_id: int, t: int, group: EnvGroup, i: int) -> None:
        try:
            for key, value in obs.items():
                self.obs_np[key][buffer_id, t] = value
        except (ValueError, KeyError):  # (checked only where the write fails: no cost on the hot path)
            self._env_broken(f"{group.describe(i)} returned {obs_misfit(obs, self.obs_np)}")

    def _env_broken(self, reason: str) -> None:
        """An env that broke its observation_space after the start's check: every step of it would fail the same
        way, so the run stops, naming it (a respawn would meet it again)."""
        if not self.broken:
            self.broken = True
            self.failed.emit(reason)

    def _request(self, split: SplitRunner) -> None:
        self.split_step_np[split.row] = split.t
        # Numbered on from the last request of the row, a respawned worker's too: outputs of a request its
        # predecessor made carry a number it never waits for.
        self.requests_np[split.row] += 1
        split.request = int(self.requests_np[split.row])
        self.inference_request.emit(InferenceRequest(split.row, bool(split.truncated_envs), split.request))

    def on_inference_respawned(self, index: int) -> None:
        """The runner respawned an inference worker: the requests it had taken and not answered are lost, so the
        splits that wait on it ask again (an answer to both copies is taken once)."""
        if self.stopped or index != self.worker % self.cfg.sampler.num_inference_workers:
            return
        for split in self.splits:
            if split.request != NO_REQUEST:
                self.inference_request.emit(InferenceRequest(split.row, bool(split.truncated_envs), split.request))

    def on_own_request(self, request: InferenceRequest) -> None:
        """--num_inference_workers=0: a request of this worker's own, back through its inbox (so that signals from
        the others are read between steps); served after the batch of signals, with every other split's."""
        if self.stopped or not self.splits:
            return  # not started: a respawned worker reads what its predecessor sent itself first
        if request.request == self.splits[request.split_row % len(self.splits)].request:
            self.own_requests.append(request)

    def _act_on_own_requests(self) -> None:
        if not self.own_requests or self.stopped:
            return
        started = time.perf_counter()
        requests, self.own_requests = self.own_requests, []
        self.policy.act([r.split_row for r in requests], [r.split_row for r in requests if r.needs_final_values])
        self.busy_sec += time.perf_counter() - started
        for request in requests:
            self.on_policy_outputs(PolicyOutputs(request.split_row % len(self.splits), request.request))

    # ---------------------------------------------------------------- the hot path

    def on_policy_outputs(self, outputs: PolicyOutputs) -> None:
        """The inference worker has written actions for this split's step t: finish the step, take the next."""
        if self.stopped or not self.splits:
            return  # not started: a respawned worker reads what was sent to its predecessor first
        split = self.splits[outputs.split]
        if outputs.request != split.request:
            return  # an answer to a request made before a respawn, or to one asked twice
        split.request = NO_REQUEST
        started = time.perf_counter()
        ids, t = split.buffer_ids, split.t
        if split.truncated_envs:
            # V(final obs) of episodes truncated at step t-1 bootstraps their last reward.
            prev = t - 1
            for i in split.truncated_envs:
                value = self.final_values_np[split.row, i] * split.truncation_scales[i]
                self.traj["truncation_values"][ids[i], prev] = value
            split.truncated_envs = []
        if t == self.rollout:
            if not self._finish_rollout(split):
                self.busy_sec += time.perf_counter() - started
                return
            ids, t = split.buffer_ids, 0
        self._step_envs(split, ids, t)
        self.busy_sec += time.perf_counter() - started

    def _step_envs(self, split: SplitRunner, ids: np.ndarray, t: int) -> None:
        actions = self.traj["actions"][ids, t]
        if not self.action_spec.discrete:
            actions = np.clip(actions, self.action_low, self.action_high)
            if self.chunk > 1:
                actions = actions.reshape(len(ids), self.chunk, -1)  # [env, the chunk's env actions in order]
        group = split.group
        group.step(actions)
        outcomes = self.traj["outcomes"]
        for i, episode in group.ended:
            if episode is None:
                # A failed step: the episode is dropped (its group too), and for learning cut here like a time
                # limit: the last good observation (entry t) bootstraps the value.
                outcomes[ids[i], t] = math.nan
                split.truncation_scales[i] = 1.0
                self._keep_final_obs(split, i, {key: self.obs_np[key][ids[i], t] for key in self.obs_np}, ids[i], t)
            else:  # (without groups only the NaN is read: the replay's mark of a failed step)
                outcomes[ids[i], t] = self._outcome(episode) if self.grouped else 0.0
        for i, final_obs, scale in group.cut:
            split.truncation_scales[i] = scale
            self._keep_final_obs(split, i, final_obs, ids[i], t)
        for i, obs in enumerate(group.obs):
            if obs is not None:  # None: an evaluation's episode set is exhausted, and this env stopped
                self._write_obs(obs, ids[i], t + 1, group, i)
        if self.broken:
            return
        self.traj["rewards"][ids, t] = group.rewards
        self.traj["terminated"][ids, t] = group.terminated
        self.traj["truncated"][ids, t] = group.truncated
        self.traj["chunk_steps"][ids, t] = group.chunk_steps
        self.traj["episode_positions"][ids, t + 1] = group.positions
        split.t = t + 1
        if group.active.any():
            self._request(split)
        elif self.evaluation is not None and not self._any_active():
            self._send_report(finished=True)

    def _keep_final_obs(self, split: SplitRunner, i: int, obs: dict, buffer_id: int, t: int) -> None:
        """A truncated episode's last observation, for the inference worker to value (the bootstrap), and, for an
        algorithm that keeps it (``final_obs``), in the trajectory at the step that ended the episode."""
        for key, value in obs.items():
            self.final_obs_np[key][split.row, i] = value
            if self.keeps_final_obs:
                self.traj[f"final_obs.{key}"][buffer_id, t] = value
        split.truncated_envs.append(i)

    def _outcome(self, episode: EpisodeStats) -> float:
        """An episode's outcome for group advantages: its return, or its success."""
        if not self.outcome_is_success:
            return episode.episode_return
        if math.isnan(episode.success) and not self.warned_no_success and self.grouped:
            self.warned_no_success = True
            log.error(
                "--group_outcome=success, but %s reports no 'success' in the info of an episode's last step: its "
                "groups are dropped; use --group_outcome=return",
                self.cfg.env.env,
            )
        return episode.success

    def _finish_rollout(self, split: SplitRunner) -> bool:
        """Hand the full buffers to the batcher; continue in fresh ones. False if the split must wait."""
        ids, last = split.buffer_ids, self.rollout
        # Keep the last step (obs and policy output): it is step 0 of the next rollout.
        obs_fields = [f"obs.{key}" for key in self.obs_np]
        split.held = {name: self.traj[name][ids, last] for name in (*obs_fields, *CARRIED_FIELDS)}
        if self.evaluation is not None:
            self.free_ids.extend(ids.tolist())  # nothing learns from an evaluation: the buffers are reused at once
            self._continue_in_new_buffers(split)
            return True
        self.lends_np[ids, 0] += 1
        self.lent.update(ids.tolist())
        self.trajectories_ready.emit(TrajectoriesReady(tuple(int(i) for i in ids)))
        split.rollouts_since_update += 1
        if self.sync_rollouts and split.rollouts_since_update >= self.sync_rollouts:
            # On-policy: the next rollout must start with the next policy's actions, so drop these.
            split.held = {name: split.held[name] for name in (*obs_fields, "episode_positions")}
            split.may_resume = False
            self.waiting_splits.append(split)
            return False
        if len(self.free_ids) < len(split.group):
            self.waiting_splits.append(split)
            return False
        self._continue_in_new_buffers(split)
        return True

    def _continue_in_new_buffers(self, split: SplitRunner) -> None:
        self._take_buffers(split)
        for name, value in split.held.items():
            self.traj[name][split.buffer_ids, 0] = value
        split.held = None

    def _resume_waiting(self) -> None:
        started = time.perf_counter()
        while self.waiting_splits and len(self.free_ids) >= len(self.waiting_splits[0].group):
            split = self.waiting_splits[0]
            if not split.may_resume:
                break
            self.waiting_splits.popleft()
            needs_policy = "actions" not in split.held
            self._continue_in_new_buffers(split)
            if needs_policy:
                split.rollouts_since_update = 0
                self._request(split)
            else:
                self._step_envs(split, split.buffer_ids, 0)
        self.busy_sec += time.perf_counter() - started

    def on_buffers_released(self, message: BuffersReleased) -> None:
        # Only the lending the batcher answers: a release sent to this worker's predecessor, for a buffer it found
        # free at its start (or has lent again since), is not taken twice.
        for buffer_id, lend in zip(message.buffer_ids, message.lends):
            if buffer_id in self.lent and lend == self.lends_np[buffer_id, 0]:
                self.lent.discard(buffer_id)
                self.free_ids.append(buffer_id)
        if self.waiting_splits and not self.stopped:
            self._resume_waiting()

    def on_policy_updated(self, version: int) -> None:
        """Synchronous mode: a new policy exists, so splits that finished their share may collect again."""
        for split in self.waiting_splits:
            split.may_resume = True
        if self.waiting_splits and not self.stopped:
            self._resume_waiting()

    # ---------------------------------------------------------------- stats and shutdown

    def _send_report(self, finished: bool = False) -> None:
        now = time.perf_counter()
        groups = [split.group for split in self.splits]
        self.report.emit(
            WorkerReport(
                self.worker,
                [episode for group in groups for episode in group.take_finished()],
                self.start_sec + sum(group.step_sec for group in groups),
                self.busy_sec,
                now - self.window_start,
                sum(group.failures for group in groups),
                sum(group.steps_taken for group in groups),
                sum(group.resets for group in groups),
                sum(group.reset_sec for group in groups),
                finished,
                self.policy.take_report(self.worker) if self.policy is not None else None,
                sum(group.nonfinite for group in groups),
            )
        )
        for group in groups:
            group.failures = group.steps_taken = group.resets = group.nonfinite = 0
            group.step_sec = group.reset_sec = 0.0
        self.start_sec = self.busy_sec = 0.0
        self.window_start = now

    def on_stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.splits:
            self._send_report()
        deadline = time.monotonic() + ENV_CLOSE_TIMEOUT_SEC
        for split in self.splits:
            split.group.close(deadline)
        stop_own_loop(self)


def obs_misfit(obs: dict, obs_np: dict[str, np.ndarray]) -> str:
    """How an observation fails to fit the buffers of the env's observation_space, in words with the fix."""
    extra = sorted(set(obs) - set(obs_np))
    if extra or set(obs_np) - set(obs):
        return f"an observation with keys {sorted(obs)}; its observation_space has {sorted(obs_np)}: make them agree"
    for key, value in obs.items():
        expected = obs_np[key].shape[2:]
        if np.shape(value) != expected:
            named = f" '{key}'" if key != DEFAULT_OBS_KEY else ""
            return (
                f"an observation{named} of shape {np.shape(value)} mid-run; its observation_space (and its first "
                f"observations) say {expected}: make them agree"
            )
    return "an observation that does not fit its observation_space: make them agree"
