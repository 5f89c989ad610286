"""Shared-memory tensors, allocated once at start-up. Messages carry indices into these, never data.

Trajectory buffers, one per env rollout, indexed [buffer_id, t] with t in 0..rollout (rollout + 1 entries: the
last one holds the observation, value and policy output used to bootstrap, and becomes entry 0 of the env's
next buffer):

    obs[key]            [num_buffers, T+1, *shape]   written by the rollout worker, read by inference and batcher
    actions, log_probs,
    values, versions    [num_buffers, T+1, ...]      written by the inference worker
    rewards, terminated,
    truncated,
    truncation_values,
    episode_positions,
    outcomes,
    chunk_steps         [num_buffers, T+1]           written by the rollout worker

FlowSAR (``--algo=flow_sar``) adds what the inference worker's self-annotation writes at [buffer, t] with the
reference policy: ``recon_errors`` [.., T+1], ``flow_times`` [.., T+1], ``flow_noise`` and ``v_old`` [.., T+1, D]
(D = the action chunk's size; 0 in other runs, so they cost nothing there).

An algorithm that learns from transitions (``Algorithm(final_obs=True)``: SAC) adds ``final_obs[key]`` [.., T+1,
*shape]: at the step where an episode was truncated (a time limit, a chunk cut short, a failed env step) the
episode's last observation, which entry t + 1 cannot hold (it is the next episode's first); written by the rollout
worker, an empty dict in other runs.

With action chunks (``--action_chunk=K``) an entry is one chunk: its observation is the chunk's first, its action
the K env actions, its reward their discounted sum, and ``chunk_steps`` the env steps it took (K, or fewer where the
episode ended inside it; 1 without chunks).

Split state, one row per (worker, split), tells the inference worker where a split's current step lives:

    split_buffer_ids    [num_workers * num_splits, envs_per_split]  buffer ids the split is filling
    split_step          [num_workers * num_splits]                  the step t of the pending request
    final_obs[key]      [num_workers * num_splits, envs_per_split, *shape]  last obs of truncated episodes
    final_values        [num_workers * num_splits, envs_per_split]  V(final_obs), written by inference

Buffer ids are owned by rollout workers (worker w owns a contiguous block); the batcher hands them back to
their owner after copying them into a training batch, so a buffer is never written while it is read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from sfengine.algorithms import algorithm_for
from sfengine.config import Config
from sfengine.env.spaces import ActionSpec, ObsSpec

# Written by the inference worker at [buffer, t]; everything else in a trajectory is written by the rollout worker.
POLICY_FIELDS = ("actions", "log_probs", "values", "versions")
# Written by the inference worker with FlowSAR: the self-annotation of each step (sfengine.algorithms.flow_sar.sar).
ANNOTATION_FIELDS = ("recon_errors", "flow_times", "flow_noise", "v_old")
# What entry T of a rollout hands to entry 0 of the next: the observation, its policy output, and its episode.
CARRIED_FIELDS = (*POLICY_FIELDS, *ANNOTATION_FIELDS, "episode_positions")
OBS_FIELDS = ("obs", "final_obs")  # the dicts of observation tensors, by key
NO_ENV = -1  # SplitState.stepping_env when no env of the split is inside step or reset


def shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.zeros(shape, dtype=dtype).share_memory_()


@dataclass
class TrajectoryBuffers:
    """Per-env trajectories. The same class holds a training batch ([num_trajectories, T+1, ...])."""

    obs: dict[str, Tensor]
    actions: Tensor
    log_probs: Tensor
    values: Tensor
    versions: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    truncation_values: Tensor
    # Group advantages (rloo, grpo): the task-sequence position of the episode each step belongs to (group =
    # position // G, member = position % G; -1 without groups), and at an episode's last step its outcome (NaN:
    # the episode was dropped, as when its env failed; the off-policy replay reads only that NaN).
    episode_positions: Tensor
    outcomes: Tensor
    chunk_steps: Tensor  # env steps each entry took: 1, or up to K with --action_chunk=K
    recon_errors: Tensor  # FlowSAR: e_i, the reference's reconstruction error of the chunk
    flow_times: Tensor  # FlowSAR: the training point's flow time t
    flow_noise: Tensor  # FlowSAR: its noise eps [.., D]
    v_old: Tensor  # FlowSAR: the reference's velocity there [.., D]
    final_obs: dict[str, Tensor] = field(default_factory=dict)  # a truncated episode's last observation

    @classmethod
    def allocate(
        cls,
        num: int,
        rollout: int,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        shared: bool,
        annotated: bool = False,
        final_obs: bool = False,
    ) -> TrajectoryBuffers:
        """``annotated``: room for FlowSAR's self-annotation (its per-entry vectors are empty otherwise);
        ``final_obs``: room for truncated episodes' last observations."""
        alloc = shared_zeros if shared else (lambda shape, dtype: torch.zeros(shape, dtype=dtype))
        steps = (num, rollout + 1)
        annotation = (action_spec.dim if annotated else 0,)
        return cls(
            obs={key: alloc(steps + shape, obs_spec.dtypes[key]) for key, shape in obs_spec.shapes.items()},
            actions=alloc(steps + action_spec.shape, action_spec.dtype),
            log_probs=alloc(steps, torch.float32),
            values=alloc(steps, torch.float32),
            versions=alloc(steps, torch.int64),
            rewards=alloc(steps, torch.float32),
            terminated=alloc(steps, torch.bool),
            truncated=alloc(steps, torch.bool),
            truncation_values=alloc(steps, torch.float32),
            episode_positions=alloc(steps, torch.int64),
            outcomes=alloc(steps, torch.float32),
            chunk_steps=alloc(steps, torch.int64),
            recon_errors=alloc(steps, torch.float32),
            flow_times=alloc(steps, torch.float32),
            flow_noise=alloc(steps + annotation, torch.float32),
            v_old=alloc(steps + annotation, torch.float32),
            final_obs={key: alloc(steps + shape, obs_spec.dtypes[key]) for key, shape in obs_spec.shapes.items()}
            if final_obs
            else {},
        )

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by a flat name (``obs.<key>`` and ``final_obs.<key>`` for observations)."""
        out = {f"obs.{key}": t for key, t in self.obs.items()}
        out.update({f"final_obs.{key}": t for key, t in self.final_obs.items()})
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in OBS_FIELDS})
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> TrajectoryBuffers:
        """The inverse of ``tensors()``."""
        dicts: dict[str, dict[str, Tensor]] = {name: {} for name in OBS_FIELDS}
        plain = {}
        for name, t in tensors.items():
            prefix, _, key = name.partition(".")
            if key and prefix in dicts:
                dicts[prefix][key] = t
            else:
                plain[name] = t
        return cls(**dicts, **plain)

    # What the learner asks of any training batch (a group batch answers the same): the env steps it stands for,
    # whether it holds anything to train on, and its own statistics.
    def sampled_env_steps(self) -> int:
        return int(self.chunk_steps[:, :-1].sum())  # one per entry, or per action of a chunk

    @property
    def trainable(self) -> bool:
        return True

    def batch_stats(self) -> dict[str, float]:
        return {}

    def acting_versions(self) -> Tensor:
        """The policy version that chose each trained step's action (the bootstrap entries are not trained)."""
        return self.versions[:, :-1]

    def to(self, device: torch.device) -> TrajectoryBuffers:
        """A copy on ``device`` (non-blocking from pinned memory)."""
        return TrajectoryBuffers.from_tensors({n: t.to(device, non_blocking=True) for n, t in self.tensors().items()})

    def pin_memory_(self) -> TrajectoryBuffers:
        pinned = TrajectoryBuffers.from_tensors({name: t.pin_memory() for name, t in self.tensors().items()})
        for f in fields(self):
            setattr(self, f.name, getattr(pinned, f.name))
        return self

    def numpy_views(self) -> dict[str, object]:
        """numpy arrays sharing memory with the tensors: a per-env write in numpy skips torch's dispatcher."""
        return {name: t.numpy() for name, t in self.tensors().items()}

    def copy_rows_(self, source: TrajectoryBuffers, ids: Tensor, out_offset: int = 0) -> None:
        """self[out_offset : out_offset + len(ids)] = source[ids], field by field, without temporaries."""
        out_tensors = self.tensors()
        for name, src in source.tensors().items():
            torch.index_select(src, 0, ids, out=out_tensors[name][out_offset : out_offset + len(ids)])


@dataclass
class SplitState:
    buffer_ids: Tensor
    step: Tensor
    final_obs: dict[str, Tensor]
    final_values: Tensor
    stepping_env: Tensor  # int64 [rows]: the env of the split inside step/reset now, -1 none (for HangWatch)
    assignments: Tensor  # int64 [rows, envs_per_split, 2]: each env's (task, init state), -1 single-task
    # int64 [rows, envs_per_split]: each env's episode position in the task sequence, -1 none. With
    # ``assignments``, what a respawn hands out again when the worker dies (sfengine.engine.respawn).
    positions: Tensor
    # int64 [rows, envs_per_split, 3]: each env's latest draw from the task sequence (task, init state, position),
    # written before the draw counts, so a worker killed inside a draw leaves its episode known
    # (sfengine.engine.respawn).
    drawing: Tensor
    # int64 [rows]: the number of the split's latest inference request. Outputs echo it, and a worker ignores
    # outputs of any other request: those answer a request made before a respawn, or one sent twice.
    requests: Tensor

    @classmethod
    def allocate(cls, num_splits_total: int, envs_per_split: int, obs_spec: ObsSpec) -> SplitState:
        rows = (num_splits_total, envs_per_split)
        return cls(
            buffer_ids=shared_zeros(rows, torch.int64),
            step=shared_zeros((num_splits_total,), torch.int64),
            final_obs={key: shared_zeros(rows + shape, obs_spec.dtypes[key]) for key, shape in obs_spec.shapes.items()},
            final_values=shared_zeros(rows, torch.float32),
            stepping_env=shared_zeros((num_splits_total,), torch.int64).fill_(NO_ENV),
            assignments=shared_zeros((*rows, 2), torch.int64).fill_(-1),
            positions=shared_zeros(rows, torch.int64).fill_(-1),
            drawing=shared_zeros((*rows, 3), torch.int64).fill_(-1),
            requests=shared_zeros((num_splits_total,), torch.int64),
        )


@dataclass
class SharedBuffers:
    """Everything the sampler shares between processes."""

    trajectories: TrajectoryBuffers
    splits: SplitState
    buffers_per_worker: int
    # float64 [4]: the wall time the learner's start-up or current update or save began (0: idle), its longest
    # update or save so far in seconds, 1 while the first is its start-up, and the wall time of the current
    # update's latest gradient step (0: none yet) (for HangWatch)
    learner_clock: Tensor
    # int64 [num_buffers, 2]: how often each buffer was handed to the batcher by its worker, and how often the
    # batcher gave it back. A buffer is out while they differ; a respawned worker starts from this (see
    # RolloutWorker.on_buffers_released).
    lends: Tensor

    @classmethod
    def allocate(
        cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec, evaluation: bool = False
    ) -> SharedBuffers:
        """``evaluation``: nothing is handed to a learner, so each env needs only the buffer it fills."""
        per_worker = cfg.sampler.num_envs_per_worker if evaluation else buffers_per_worker(cfg)
        trajectories = TrajectoryBuffers.allocate(
            per_worker * cfg.sampler.num_workers,
            cfg.sampler.rollout,
            obs_spec,
            action_spec,
            shared=True,
            annotated=algorithm_for(cfg).annotate is not None and not evaluation,
            final_obs=algorithm_for(cfg).final_obs and not evaluation,
        )
        splits = SplitState.allocate(
            cfg.sampler.num_workers * cfg.sampler.worker_num_splits, cfg.envs_per_split, obs_spec
        )
        lends = shared_zeros((per_worker * cfg.sampler.num_workers, 2), torch.int64)
        return cls(trajectories, splits, per_worker, shared_zeros((4,), torch.float64), lends)

    def owner_of(self, buffer_id: int) -> int:
        return buffer_id // self.buffers_per_worker

    def worker_buffer_ids(self, worker: int) -> list[int]:
        return list(range(worker * self.buffers_per_worker, (worker + 1) * self.buffers_per_worker))


def buffers_per_worker(cfg: Config) -> int:
    """Enough buffers that a worker never waits for the learner in steady state.

    Each env fills one buffer at a time. A training batch needs ``trajectories_per_training_batch`` of them; the
    batcher frees them as soon as it has copied them, and one batch is collected while the previous one trains.
    So each worker holds its envs' current buffers plus its share of two training batches.

    With group advantages a buffer also waits for every group it holds steps of to complete and be batched. An env
    then holds the buffers of its episodes from their start until their groups end (about two episodes; more when
    a group has more members than the run has envs, as some env plays several of them), plus its share of the
    complete groups waiting for a batch (under a batch and one group of steps; twice that for slack).
    """
    s = cfg.sampler
    total_envs = s.num_workers * s.num_envs_per_worker
    rounds_per_batch = -(-cfg.trajectories_per_training_batch // total_envs)  # ceil
    if not algorithm_for(cfg).grouped(cfg):
        return s.num_envs_per_worker * (1 + 2 * rounds_per_batch)
    episode_steps = cfg.env.max_episode_steps or s.rollout
    buffers_per_episode = -(-episode_steps // s.rollout) + 1
    members_per_env = -(-cfg.env.task_group_size // total_envs)
    waiting_steps = 2 * (cfg.samples_per_training_batch + cfg.env.task_group_size * episode_steps)
    waiting = -(-waiting_steps // (total_envs * s.rollout))
    return s.num_envs_per_worker * ((members_per_env + 1) * buffers_per_episode + waiting + 1)


def frozen_prefixes(model: torch.nn.Module) -> tuple[str, ...]:
    """Names (prefixes) of the state a model never changes in training: ``frozen_prefixes`` where it declares one."""
    return tuple(getattr(model, "frozen_prefixes", ()))


@dataclass
class SharedWeights:
    """Policy weights in shared memory with a version counter. The learner publishes, inference workers pull.

    A sequence lock guards the copy, so no semaphore exists that a killed process could leak or leave held:

        publish: sequence += 1 (odd: writing) -> copy weights -> version = v -> sequence += 1 (even: done)
        pull:    s = sequence (wait while odd) -> copy weights -> retry unless sequence is still s

    One writer (the learner); a pull that overlapped a publish sees the sequence move and copies again, so an
    inference worker never acts with half-written weights. The order of plain stores and loads between
    processes that this relies on is x86's (TSO); on weaker memory models every torch op the copy makes also
    passes through the interpreter's lock, a full barrier. ``version`` alone is read without any of this by the
    inference worker's per-batch check (a stale read only delays the pull).

    With FlowSAR the EMA reference policy travels beside the policy, under the same lock: a pull never pairs a
    policy with a reference of another version. What a model declares frozen (``frozen_prefixes``: a residual
    policy's base, however large) is copied once, at allocation, and pulled once by each model.
    """

    tensors: dict[str, Tensor]
    version: Tensor  # int64 [1]: the published policy version
    sequence: Tensor  # int64 [1]: odd while the learner writes
    reference_tensors: dict[str, Tensor] | None = None  # FlowSAR's reference policy, the same architecture
    # Tensors that never change after allocation (a residual policy's frozen base): written once, pulled once.
    frozen: frozenset[str] = frozenset()

    @classmethod
    def allocate(cls, model: torch.nn.Module, reference: bool = False) -> SharedWeights:
        def shared_copy() -> dict[str, Tensor]:
            return {name: t.detach().cpu().clone().share_memory_() for name, t in model.state_dict().items()}

        counters = shared_zeros((1,), torch.int64), shared_zeros((1,), torch.int64)
        frozen = frozenset(name for name in model.state_dict() if name.startswith(frozen_prefixes(model)))
        return cls(shared_copy(), *counters, shared_copy() if reference else None, frozen)

    def publish(self, model: torch.nn.Module, version: int, reference: torch.nn.Module | None = None) -> None:
        with torch.no_grad():
            self.sequence += 1
            for name, t in model.state_dict().items():
                if name not in self.frozen:
                    self.tensors[name].copy_(t)
            if reference is not None:
                for name, t in reference.state_dict().items():
                    self.reference_tensors[name].copy_(t)
            self.version[0] = version
            self.sequence += 1

    def pull(self, model: torch.nn.Module, reference: torch.nn.Module | None = None) -> int:
        """The published weights into ``model`` (and ``reference``); the frozen ones only at a model's first pull."""
        state = model.state_dict()
        reference_state = reference.state_dict() if reference is not None else {}
        skip = self.frozen if getattr(model, "_frozen_pulled", False) else frozenset()
        with torch.no_grad():
            while True:
                before = int(self.sequence[0])
                if before % 2:
                    time.sleep(0.0001)  # the learner is writing; a copy takes well under a millisecond
                    continue
                for name, t in self.tensors.items():
                    if name not in skip:
                        state[name].copy_(t)
                for name, t in self.reference_tensors.items() if reference is not None else ():
                    reference_state[name].copy_(t)
                version = int(self.version[0])
                if int(self.sequence[0]) == before:
                    model._frozen_pulled = True
                    return version
