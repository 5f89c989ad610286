"""Group batcher: holds trajectories until their groups are complete, and makes training batches of whole groups.

With critic-free advantages (``--advantage=rloo|grpo``) an episode's advantage depends on the outcomes of the
other G - 1 episodes of its group (one (task, init state), G consecutive positions of the task sequence), which
end at other times, on other envs and workers. So, in the learner process's batcher thread:

    TrajectoriesReady(ids) --> each real step (buffer, t < T) filed under its episode's group (position // G);
        each episode end records its outcome at member position % G
    a group with G outcomes is complete --> dropped if an episode failed, if it began before this run (resume),
        or, with --dynamic_sampling, if its outcomes are all equal; else queued
    queued steps >= capacity and a free slot --> the oldest whole groups that fit are gathered into a GroupBatch
        --> training_batch_ready(slot); a batch's worth of dropped steps --> an empty GroupBatch that only counts
        them (no update), so the run's env steps and stop stay on time while every group is uniform
    a buffer whose every step is in a batch or dropped --> buffers_released_<owner>(ids)

A trajectory's steps may belong to two or more episodes, so a buffer goes back to its worker only when all the
groups it holds steps of are done. No time axis survives: group advantages need no bootstrapping.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from signal_slot.signal_slot import signal
from torch import Tensor

from sfengine.engine.buffers import ANNOTATION_FIELDS, SharedBuffers
from sfengine.engine.event_loop import Component
from sfengine.engine.messages import TrajectoriesReady
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.learning.batcher import release_buffers


@dataclass
class GroupBatch:
    """A training batch of whole groups, flat over steps. Rows ``[:num_steps]`` and ``outcomes[:num_groups]`` are
    this batch's; step ``i`` belongs to member ``episodes[i] % G`` of group ``episodes[i] // G`` of the batch."""

    obs: dict[str, Tensor]  # [capacity, *shape]
    actions: Tensor  # [capacity, *action shape]
    log_probs: Tensor  # [capacity] the acting policy's
    versions: Tensor  # [capacity] the acting policy's version
    episodes: Tensor  # [capacity] int64: group in batch * G + member
    recon_errors: Tensor  # [capacity] FlowSAR's self-annotation (empty vectors in other runs)
    flow_times: Tensor  # [capacity]
    flow_noise: Tensor  # [capacity, D]
    v_old: Tensor  # [capacity, D]
    outcomes: Tensor  # [capacity // G + 1, G] float32
    groups: Tensor  # [capacity // G + 1] int64: each group's number in the task sequence (position // G)
    num_steps: int = 0
    num_groups: int = 0
    env_steps: int = 0  # steps sampled since the previous batch: these and the dropped groups'
    dropped_groups: dict[str, int] = field(default_factory=dict)  # since the previous batch, by reason

    @classmethod
    def allocate(
        cls, capacity: int, group_size: int, obs_spec: ObsSpec, action_spec: ActionSpec, annotated: bool = False
    ) -> GroupBatch:
        annotation = (capacity, action_spec.dim if annotated else 0)
        return cls(
            obs={
                key: torch.zeros((capacity, *shape), dtype=obs_spec.dtypes[key])
                for key, shape in obs_spec.shapes.items()
            },
            actions=torch.zeros((capacity, *action_spec.shape), dtype=action_spec.dtype),
            log_probs=torch.zeros(capacity),
            versions=torch.zeros(capacity, dtype=torch.int64),
            episodes=torch.zeros(capacity, dtype=torch.int64),
            recon_errors=torch.zeros(capacity),
            flow_times=torch.zeros(capacity),
            flow_noise=torch.zeros(annotation),
            v_old=torch.zeros(annotation),
            outcomes=torch.zeros((capacity // group_size + 1, group_size)),
            groups=torch.zeros(capacity // group_size + 1, dtype=torch.int64),
        )

    def sampled_env_steps(self) -> int:
        """The batch's env steps and those of the groups dropped since the last one."""
        return self.env_steps

    @property
    def trainable(self) -> bool:
        """False for a batch of dropped groups' steps only (--dynamic_sampling): nothing to train on."""
        return self.num_groups > 0

    def acting_versions(self) -> Tensor:
        """The policy version that chose each step's action."""
        return self.versions[: self.num_steps]

    def batch_stats(self) -> dict[str, float]:
        """How many groups were dropped since the last batch, and why (``--dynamic_sampling``: uniform outcomes)."""
        dropped = sum(self.dropped_groups.values())
        stats = {
            "groups_trained": float(self.num_groups),
            "groups_dropped_fraction": dropped / (dropped + self.num_groups),
        }
        for reason, count in self.dropped_groups.items():
            stats[f"groups_dropped_{reason}"] = float(count)
        return stats

    def tensors(self) -> dict[str, Tensor]:
        out = {f"obs.{key}": t for key, t in self.obs.items()}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)})
        return out

    def to(self, device: torch.device) -> GroupBatch:
        moved = {name: t.to(device, non_blocking=True) for name, t in self.tensors().items()}
        obs = {name[len("obs.") :]: t for name, t in moved.items() if name.startswith("obs.")}
        tensors = {name: t for name, t in moved.items() if not name.startswith("obs.")}
        return GroupBatch(obs, **tensors, num_steps=self.num_steps, num_groups=self.num_groups)

    def pin_memory_(self) -> GroupBatch:
        self.obs = {key: t.pin_memory() for key, t in self.obs.items()}
        for name, t in self.tensors().items():
            if not name.startswith("obs."):
                setattr(self, name, t.pin_memory())
        return self


@dataclass
class PendingGroup:
    """A group whose steps are arriving: flat step indices with their member, and the members' outcomes."""

    expected: int  # episodes of this group played in this run (G, fewer for a group begun before a resume)
    env_steps: int = 0  # env steps its entries took (more than its entries with action chunks)
    steps: list[np.ndarray] = field(default_factory=list)  # flat indices buffer * (T + 1) + t
    members: list[np.ndarray] = field(default_factory=list)
    outcomes: dict[int, float] = field(default_factory=dict)  # member -> outcome

    @property
    def num_steps(self) -> int:
        return sum(len(s) for s in self.steps)


class GroupBatcher(Component):
    def __init__(
        self,
        event_loop,
        buffers: SharedBuffers,
        rollout: int,
        group_size: int,
        capacity: int,
        dynamic_sampling: bool,
        first_position: int = 0,
    ):
        super().__init__(event_loop, "batcher")
        self.buffers, self.rollout, self.group_size = buffers, rollout, group_size
        self.capacity, self.dynamic_sampling = capacity, dynamic_sampling
        self.first_position = first_position  # the task sequence's position when this run began
        self.entries = rollout + 1
        self.pending: dict[int, PendingGroup] = {}
        self.ready: deque[int] = deque()  # complete groups in completion order
        self.ready_steps = 0
        self.unconsumed: dict[int, int] = {}  # buffer id -> its steps not yet batched or dropped
        self.batch_slots: list[GroupBatch] = []
        self.free_slots: deque[int] = deque()
        self.dropped_steps = 0  # entries of dropped groups since the last batch (a batch's worth forms an empty one)
        self.dropped_env_steps = 0  # and the env steps they took
        self.dropped_groups: dict[str, int] = {}
        self.busy_sec = 0.0

    @signal
    def training_batch_ready(self): ...

    @signal
    def failed(self): ...  # (reason: str) its loop ended on an exception; see LearnerWorker._run_batcher

    def set_batch_slots(self, slots: list[GroupBatch]) -> None:
        """The learner allocates the slots before the batcher starts, in the process the batcher runs in: views of
        the shared buffers are made here too (a numpy view made before the spawn would travel as a copy)."""
        self.batch_slots = slots
        self.free_slots = deque(range(len(slots)))
        traj = self.buffers.trajectories
        self.flat = {name: t.flatten(0, 1) for name, t in traj.tensors().items()}
        self.positions_np = traj.episode_positions.numpy()
        self.chunk_steps_np = traj.chunk_steps.numpy()

    def on_trajectories_ready(self, message: TrajectoriesReady) -> None:
        started = time.perf_counter()
        traj, size, steps = self.buffers.trajectories, self.group_size, self.rollout
        for buffer_id in message.buffer_ids:
            positions = self.positions_np[buffer_id, :steps]
            flat = buffer_id * self.entries + np.arange(steps)
            self.unconsumed[buffer_id] = steps
            for position in np.unique(positions):
                if position < 0:
                    raise RuntimeError(f"buffer {buffer_id} holds steps of no episode: the rollout worker wrote none")
                mine = positions == position
                group, member = divmod(int(position), size)
                if group not in self.pending:
                    self.pending[group] = PendingGroup(self._expected(group))
                pending = self.pending[group]
                pending.steps.append(flat[mine])
                pending.env_steps += int(self.chunk_steps_np[buffer_id, :steps][mine].sum())
                pending.members.append(np.full(int(mine.sum()), member))
            ends = (traj.terminated[buffer_id, :steps] | traj.truncated[buffer_id, :steps]).nonzero().flatten()
            for t in ends.tolist():
                group, member = divmod(int(positions[t]), size)
                pending = self.pending[group]
                pending.outcomes[member] = float(traj.outcomes[buffer_id, t])
                if len(pending.outcomes) == pending.expected:
                    self._complete(group)
        self.busy_sec += time.perf_counter() - started
        self._assemble()

    def on_batch_released(self, slot: int) -> None:
        self.free_slots.append(slot)
        self._assemble()

    def on_episodes_dropped(self, positions: tuple[int, ...]) -> None:
        """Episodes a dead rollout worker was playing (sfengine.engine.respawn): the steps of theirs filed so far are
        discarded, and each member waits for its replay, which the task sequence hands out at the same position."""
        flat_chunk_steps = self.chunk_steps_np.reshape(-1)
        for position in positions:
            group, member = divmod(int(position), self.group_size)
            pending = self.pending.get(group)
            if pending is None or member in pending.outcomes:
                continue  # nothing of it arrived, or it ended before the worker died
            kept_steps, kept_members, dropped = [], [], []
            for steps, members in zip(pending.steps, pending.members):
                mine = members == member
                dropped.append(steps[mine])
                kept_steps.append(steps[~mine])
                kept_members.append(members[~mine])
            pending.steps, pending.members = kept_steps, kept_members
            pending.env_steps -= int(sum(flat_chunk_steps[s].sum() for s in dropped))
            self._consume(dropped)

    def _expected(self, group: int) -> int:
        """Episodes of ``group`` this run plays: a group begun before a resume lost its first members."""
        return min(self.group_size, (group + 1) * self.group_size - self.first_position)

    def _complete(self, group: int) -> None:
        pending = self.pending[group]
        outcomes = list(pending.outcomes.values())
        reason = None
        if pending.expected < self.group_size:
            reason = "incomplete"  # begun before this run: its first members' steps are gone
        elif any(math.isnan(outcome) for outcome in outcomes):
            reason = "failed"  # an env failed during one of its episodes
        elif self.dynamic_sampling and len(set(outcomes)) == 1:
            reason = "uniform"
        if reason is None:
            if pending.num_steps > self.capacity:
                raise RuntimeError(
                    f"a group of {pending.num_steps} steps does not fit a training batch of {self.capacity} samples"
                )
            self.ready.append(group)
            self.ready_steps += pending.num_steps
            return
        del self.pending[group]
        self.dropped_groups[reason] = self.dropped_groups.get(reason, 0) + 1
        self.dropped_steps += pending.num_steps
        self.dropped_env_steps += pending.env_steps
        self._consume(pending.steps)

    def _assemble(self) -> None:
        # A batch forms when complete groups fill it, or, empty, when a batch's worth of steps was dropped: the
        # learner then counts those env steps (and stops on time) even while every group is uniform.
        while self.free_slots and (self.ready_steps >= self.capacity or self.dropped_steps >= self.capacity):
            started = time.perf_counter()
            slot_index = self.free_slots.popleft()
            slot = self.batch_slots[slot_index]
            chosen: list[PendingGroup] = []
            total = 0
            while self.ready_steps >= self.capacity and self.ready:
                if total + self.pending[self.ready[0]].num_steps > self.capacity:
                    break
                group = self.ready.popleft()
                slot.groups[len(chosen)] = group
                pending = self.pending.pop(group)
                chosen.append(pending)
                total += pending.num_steps
            if chosen:
                self.ready_steps -= total
                self._gather(slot, chosen, total)
            slot.num_steps, slot.num_groups = total, len(chosen)
            slot.env_steps = sum(group.env_steps for group in chosen) + self.dropped_env_steps
            self.dropped_steps = self.dropped_env_steps = 0
            slot.dropped_groups, self.dropped_groups = self.dropped_groups, {}
            self.busy_sec += time.perf_counter() - started
            self.training_batch_ready.emit(slot_index)

    def _gather(self, slot: GroupBatch, chosen: list[PendingGroup], total: int) -> None:
        """Copy the chosen groups' steps into ``slot`` and give their buffers back where nothing else is left."""
        size = self.group_size
        flat = torch.from_numpy(np.concatenate([s for group in chosen for s in group.steps]))
        out = slot.tensors()
        for name in ("log_probs", "versions", "actions", *ANNOTATION_FIELDS, *(f"obs.{key}" for key in slot.obs)):
            torch.index_select(self.flat[name], 0, flat, out=out[name][:total])
        episodes = np.concatenate([j * size + members for j, group in enumerate(chosen) for members in group.members])
        slot.episodes[:total] = torch.from_numpy(episodes)
        for j, group in enumerate(chosen):
            slot.outcomes[j] = torch.tensor([group.outcomes[member] for member in range(size)])
        self._consume([s for group in chosen for s in group.steps])

    def _consume(self, steps: list[np.ndarray]) -> None:
        """These steps are batched or dropped: return each buffer none of whose steps is left to its worker."""
        if not steps:
            return
        buffer_ids, counts = np.unique(np.concatenate(steps) // self.entries, return_counts=True)
        done = []
        for buffer_id, count in zip(buffer_ids.tolist(), counts.tolist()):
            self.unconsumed[buffer_id] -= count
            if self.unconsumed[buffer_id] == 0:
                del self.unconsumed[buffer_id]
                done.append(buffer_id)
        if done:
            release_buffers(self, self.buffers, done)
