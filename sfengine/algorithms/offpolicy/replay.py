"""The replay of the off-policy algorithms: whole trajectories of the engine's training batches, kept in a ring of
preallocated tensors in the learner process, and minibatches of n-step transitions drawn from it uniformly.

    training batch (TrajectoryBuffers, [B, T+1]) --insert--> rows of the ring [capacity_rows, T+1]
    sample(n)  --> (row, t) uniform over the stored steps --> n_step_targets: the discounted rewards of up to
                   n steps, and where to bootstrap (the observation, its discount; 0 after a termination)

A stored row keeps its env's T steps and the bootstrap entry T (the observation the next row starts from). A
transition's next observation is the next entry's, except where the episode ended at that step: a termination
(nothing to bootstrap) or a truncation (time limit, chunk cut short), whose bootstrap is the episode's own last
observation, ``final_obs``, which the rollout worker keeps for the algorithms that declare it. Returns of n steps
stop at an episode's end and at a row's end (entry T bootstraps them): each is exact, only shorter.

Those last observations are kept only where an episode was truncated, in a ring of slots beside the rows
(``final_slot[row, t]`` names an entry's slot): a slot for every entry without images, as many as two a row with
them, so that images are stored about once, not twice. A slot reused while its entry is still in the replay (more
than two truncations a row on average) leaves that entry without its bootstrap: it is then handled as a failed
step (below) and counted in ``finals_dropped``.

An entry whose env step failed (it raised, or returned a NaN) has no outcome to learn from: no draw starts there,
and a return that reaches it stops at the entry before, bootstrapped from that entry's next observation (the failed
entry's own, the last good one), so that no target counts a made-up reward or a made-up next state.
``replay_size`` counts env steps; the ring holds ``replay_size // (T x K)`` rows and overwrites the oldest.

With action chunks (``--action_chunk=K``) an entry is one decision: the chunk's K actions, their reward discounted
to the chunk's first step, and the env steps it took (K, fewer where the episode ended inside it). n-step returns
then run over n decisions and discount each by the env steps before it, so a chunk cut short is exact too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from sfengine.config import ConfigError
from sfengine.demos.dataset import DemoSet
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec


class NStep(NamedTuple):
    """Minibatch of n-step transitions: ``returns + discounts * V(next_obs)`` is each one's target (discounts are
    0 where the episode terminated inside the n steps)."""

    obs: dict[str, Tensor]
    actions: Tensor
    returns: Tensor
    next_obs: dict[str, Tensor]
    discounts: Tensor
    steps: Tensor  # env steps to the bootstrap: 1..n (with chunks of K: up to n x K)


def each_tensor(minibatch: NStep, fn) -> NStep:
    """``minibatch`` with ``fn`` applied to each of its tensors (those of its observation dicts too)."""
    return NStep(
        *(
            {key: fn(value) for key, value in field.items()} if isinstance(field, dict) else fn(field)
            for field in minibatch
        )
    )


def bytes_per_step(obs_spec: ObsSpec, action_spec: ActionSpec) -> int:
    """Memory a stored env step takes: its observation twice without images (the entry's and a truncation's final
    one), at most 1.1875 times with them (the rows' bootstrap entries and two final slots a row, at rollouts of 16
    or more), the action, the reward and the flags (with chunks of K: an entry's, shared by its K env steps)."""
    obs = sum(
        torch.empty((), dtype=obs_spec.dtypes[key]).element_size() * int(torch.Size(shape).numel())
        for key, shape in obs_spec.shapes.items()
    )
    copies = 1.1875 if any(obs_spec.is_image(key) for key in obs_spec.shapes) else 2
    action = torch.empty((), dtype=action_spec.dtype).element_size() * max(1, action_spec.dim)
    return -(-(int(copies * obs) + action + 4 + 2 + 8 + 2 + 4) // action_spec.chunk)


def check_replay_fits(replay_size: int, obs_spec: ObsSpec, action_spec: ActionSpec, available: int) -> None:
    """A replay of ``replay_size`` steps (one per rank on this machine) must fit in ``available`` bytes with room
    to spare for the run itself (a fifth)."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    per_step = bytes_per_step(obs_spec, action_spec)
    needed = replay_size * per_step * ranks
    if needed > 0.8 * available:
        fits = int(0.8 * available / (per_step * ranks))
        each = f" for each of {ranks} ranks" if ranks > 1 else ""
        raise ConfigError(
            f"--replay_size={replay_size} needs {needed / 2**30:.1f} GiB ({per_step} bytes a step{each}) and this "
            f"machine has {available / 2**30:.1f} GiB free: lower --replay_size to {fits:,} or less"
        )


def replay_rows(capacity_steps: int, horizon: int, action_spec: ActionSpec) -> int:
    """The trajectories of ``horizon`` entries a replay of ``capacity_steps`` env steps holds."""
    return max(1, capacity_steps // (horizon * action_spec.chunk))


class Replay:
    def __init__(self, capacity_steps: int, horizon: int, obs_spec: ObsSpec, action_spec: ActionSpec):
        self.horizon = horizon
        self.capacity = replay_rows(capacity_steps, horizon, action_spec)
        rows, steps = (self.capacity, horizon + 1), (self.capacity, horizon)
        self.obs = {
            key: torch.zeros(rows + shape, dtype=obs_spec.dtypes[key]) for key, shape in obs_spec.shapes.items()
        }
        # Truncated episodes' last observations: slot final_slot[row, t] of final_obs (-1: none).
        images = any(obs_spec.is_image(key) for key in obs_spec.shapes)
        slots = self.capacity * (min(horizon, 2) if images else horizon)
        self.final_obs = {
            key: torch.zeros((slots, *shape), dtype=obs_spec.dtypes[key]) for key, shape in obs_spec.shapes.items()
        }
        self.final_slot = torch.full(steps, -1, dtype=torch.int32)
        self.slot_entry = torch.full((slots,), -1, dtype=torch.int64)  # the flat entry a slot serves (-1: free)
        self.next_slot = 0
        self.finals_dropped = 0
        self.actions = torch.zeros(steps + action_spec.shape, dtype=action_spec.dtype)
        self.rewards = torch.zeros(steps)
        self.terminated = torch.zeros(steps, dtype=torch.bool)
        self.truncated = torch.zeros(steps, dtype=torch.bool)
        self.failed = torch.zeros(steps, dtype=torch.bool)  # the env step failed: never a transition
        self.env_steps = torch.ones(steps, dtype=torch.int16)  # env steps an entry took: 1, or up to K with chunks
        self.size = 0  # rows filled
        self.next_row = 0
        self.inserted_steps = 0
        self.starts: Tensor | None = None  # flat indices of the steps a draw may start at (None: every stored one)

    @property
    def stored_steps(self) -> int:
        return self.size * self.horizon

    def insert(self, batch: TrajectoryBuffers, rewards: Tensor | None = None) -> None:
        """Store every trajectory of ``batch`` ([B, T+1]); ``rewards``: the learner's view of them (scaled,
        clipped), else the batch's own."""
        count = batch.rewards.shape[0]
        rows = (self.next_row + torch.arange(count)) % self.capacity
        steps = slice(0, self.horizon)
        self.free_finals(rows)
        for key, obs in batch.obs.items():
            self.obs[key][rows] = obs.cpu()
        self.actions[rows] = batch.actions[:, steps].cpu()
        self.rewards[rows] = (batch.rewards[:, steps] if rewards is None else rewards).float().cpu()
        self.terminated[rows] = batch.terminated[:, steps].cpu()
        self.truncated[rows] = batch.truncated[:, steps].cpu()
        # The rollout worker marks a failed step's end with a NaN outcome.
        self.failed[rows] = (batch.truncated[:, steps] & batch.outcomes[:, steps].isnan()).cpu()
        self.env_steps[rows] = batch.chunk_steps[:, steps].clamp(min=1).to(torch.int16).cpu()
        needs = (self.truncated[rows] & ~self.terminated[rows] & ~self.failed[rows]).nonzero()  # [k, 2]: (i, t)
        if len(needs):
            finals = {
                key: value[needs[:, 0].to(value.device), needs[:, 1].to(value.device)].cpu()
                for key, value in batch.final_obs.items()
            }
            self.store_finals(rows[needs[:, 0]], needs[:, 1], finals)
        self.next_row = int((self.next_row + count) % self.capacity)
        self.size = min(self.capacity, self.size + count)
        self.inserted_steps += int(batch.chunk_steps[:, steps].clamp(min=1).sum())  # env steps

    def free_finals(self, rows: Tensor) -> None:
        """The slots of ``rows``' entries, about to be overwritten, are free again."""
        held = self.final_slot[rows]
        self.slot_entry[held[held >= 0].long()] = -1
        self.final_slot[rows] = -1

    def store_finals(self, rows: Tensor, t: Tensor, finals: dict[str, Tensor]) -> None:
        """Keep the last observations ``finals`` ([k, ...] by key) of the truncated entries (rows, t), each in the
        ring's next slot. Where that slot still serves an entry, that entry loses its bootstrap and becomes a failed
        step (never drawn, returns stop before it)."""
        count, slots_total = len(t), len(self.slot_entry)
        if count > slots_total:  # more at once than the ring holds: the last ones, the others failed steps
            self.failed.view(-1)[rows[:-slots_total] * self.horizon + t[:-slots_total]] = True
            rows, t, finals = rows[-slots_total:], t[-slots_total:], {k: v[-slots_total:] for k, v in finals.items()}
            self.finals_dropped += count - slots_total
            count = slots_total
        slots = (self.next_slot + torch.arange(count)) % slots_total
        self.next_slot = int((self.next_slot + count) % slots_total)
        evicted = self.slot_entry[slots]
        evicted = evicted[evicted >= 0]
        if len(evicted):
            self.failed.view(-1)[evicted] = True
            self.final_slot.view(-1)[evicted] = -1
            self.finals_dropped += len(evicted)
        entries = rows * self.horizon + t
        self.slot_entry[slots] = entries
        self.final_slot.view(-1)[entries] = slots.to(torch.int32)
        for key, value in finals.items():
            self.final_obs[key][slots] = value

    def good_steps(self) -> int:
        """Stored steps whose env step did not fail: those a draw can start at."""
        return self.stored_steps - int(self.failed.view(-1)[: self.stored_steps].sum())

    def sample_indices(self, count: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(row, t) of ``count`` stored steps, uniformly with replacement over those whose env step did not fail."""
        if self.starts is not None:
            flat = self.starts[torch.randint(0, len(self.starts), (count,), generator=generator)]
            return flat // self.horizon, flat % self.horizon
        failed = self.failed.view(-1)[: self.stored_steps]
        flat = torch.randint(0, self.stored_steps, (count,), generator=generator)
        redraw = failed[flat]
        if redraw.any():  # rare (a failed env step is one in thousands at most): draw those again from the rest
            good = (~failed).nonzero().squeeze(1)
            if len(good) == 0:
                raise RuntimeError("every env step in the replay failed: there is nothing to learn from")
            flat[redraw] = good[torch.randint(0, len(good), (int(redraw.sum()),), generator=generator)]
        return flat // self.horizon, flat % self.horizon

    def sample(self, count: int, n: int, gamma: float, generator: torch.Generator | None = None) -> NStep:
        rows, t = self.sample_indices(count, generator)
        return self.n_step(rows, t, n, gamma)

    def n_step(self, rows: Tensor, t: Tensor, n: int, gamma: float) -> NStep:
        """The n-step transitions that start at entries (rows, t)."""
        ahead = t[:, None] + torch.arange(n)[None]  # [B, n]
        inside = ahead < self.horizon
        at = ahead.clamp(max=self.horizon - 1)
        row = rows[:, None]
        terminated = self.terminated[row, at] & inside
        ends = (terminated | self.truncated[row, at]) & inside
        # Entry k counts while no earlier entry of the n ended the episode, it lies inside the row and neither it
        # nor an earlier one failed (the entry before a failed one bootstraps from its next observation).
        ended_before = (ends.cumsum(1) - ends.long()) > 0
        failed_by = (self.failed[row, at] & inside).cumsum(1) > 0
        counted = inside & ~ended_before & ~failed_by
        # Each entry is discounted by the env steps before it (k without chunks).
        env_steps = self.env_steps[row, at].long() * counted
        before = env_steps.cumsum(1) - env_steps
        returns = (self.rewards[row, at] * counted * gamma ** before.float()).sum(1)
        taken = counted.sum(1)  # entries to the bootstrap, 1..n
        waited = env_steps.sum(1)  # env steps to the bootstrap
        last = t + taken - 1  # the last entry counted
        ended = ends[torch.arange(len(t)), taken - 1]
        truncated_at_last = ended & ~terminated[torch.arange(len(t)), taken - 1]
        discounts = (gamma ** waited.float()) * ~terminated[torch.arange(len(t)), taken - 1]
        next_obs = {}
        # A truncated last entry bootstraps from its episode's last observation, in its slot (every such entry has
        # one: one whose slot was reused is a failed step, never counted).
        from_final = truncated_at_last.nonzero().squeeze(1)
        slots = self.final_slot[rows[from_final], last[from_final]].long()
        for key, obs in self.obs.items():
            following = obs[rows, (last + 1).clamp(max=self.horizon)]
            following[from_final] = self.final_obs[key][slots]
            next_obs[key] = following
        return NStep(
            obs={key: obs[rows, t] for key, obs in self.obs.items()},
            actions=self.actions[rows, t],
            returns=returns,
            next_obs=next_obs,
            discounts=discounts,
            steps=waited,
        )

    @classmethod
    def of_demos(
        cls,
        demo_set: DemoSet,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        reward: Callable[[Tensor], Tensor],
        gamma: float = 1.0,
    ) -> Replay:
        """A replay that holds ``demo_set``, never overwritten. A successful demonstration (``dones`` 1 at its last
        step) terminates there; any other ends one step early, truncated, and bootstraps from its last
        observation, the one after that step's action. Draws start only at those steps. ``reward``: the learner's
        view of the demonstrations' rewards (scaled, clipped), as of the online ones.

        One demonstration a row; with chunks of K, K rows, the chunks starting at steps o, o + K, ... for each
        offset o < K, so that every step starts a chunk. A chunk's reward is its steps' discounted by ``gamma``
        to its first; one that runs past the demonstration's end repeats its last action (as the clone learns
        it) and took only the steps that remained."""
        k = action_spec.chunk
        demos = demo_set.demos
        horizon = -(-max(len(demo) for demo in demos) // k)
        replay = cls(len(demos) * k * horizon * k, horizon, obs_spec, action_spec)
        starts, row = [], 0
        for demo in demos:
            success = bool(demo.dones[-1])
            steps = len(demo) if success else len(demo) - 1  # transitions with a next observation (or an end)
            observed = {key: torch.as_tensor(demo.obs[key]) for key in replay.obs}
            actions = torch.as_tensor(demo.actions).reshape(len(demo), -1)
            rewards = torch.as_tensor(demo.rewards).float()
            for offset in range(min(k, steps)):
                first = torch.arange(offset, steps, k)  # each entry's first step
                entries = len(first)
                taken = (steps - first).clamp(max=k)  # env steps of each entry
                within = torch.arange(k)
                at = (first[:, None] + within[None]).clamp(max=len(demo) - 1)
                counts = within[None] < taken[:, None]
                for key in replay.obs:
                    replay.obs[key][row, :entries] = observed[key][first]
                if not success:
                    last = {key: observed[key][steps][None] for key in replay.obs}
                    replay.store_finals(torch.tensor([row]), torch.tensor([entries - 1]), last)
                replay.actions[row, :entries] = actions[at].reshape(entries, *action_spec.shape)
                chunk_rewards = (rewards[at] * counts * gamma ** within.float()).sum(1)
                replay.rewards[row, :entries] = reward(chunk_rewards)
                replay.env_steps[row, :entries] = taken.to(torch.int16)
                (replay.terminated if success else replay.truncated)[row, entries - 1] = True
                starts.append(row * replay.horizon + torch.arange(entries))
                row += 1
        if not starts:
            raise ConfigError("--demos: no demonstration has a step to learn from (each is one step long and failed)")
        replay.starts = torch.cat(starts)
        replay.size = row
        replay.inserted_steps = int(sum(len(s) for s in starts))
        return replay

    def state_dict(self) -> dict:
        """The whole ring, for ``--save_replay``."""
        return {
            "obs": self.obs,
            "final_obs": self.final_obs,
            "final_slot": self.final_slot,
            "slot_entry": self.slot_entry,
            "next_slot": self.next_slot,
            "finals_dropped": self.finals_dropped,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "failed": self.failed,
            "env_steps": self.env_steps,
            "size": self.size,
            "next_row": self.next_row,
            "inserted_steps": self.inserted_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        if "final_slot" not in state:  # saved before the slots: a final observation for every entry
            state = {**state, **dense_finals_as_slots(state, self.horizon)}
        for key in self.obs:
            self.obs[key].copy_(state["obs"][key])
            self.final_obs[key].copy_(state["final_obs"][key])
        self.final_slot.copy_(state["final_slot"])
        self.slot_entry.copy_(state["slot_entry"])
        self.next_slot, self.finals_dropped = int(state["next_slot"]), int(state["finals_dropped"])
        for name in ("actions", "rewards", "terminated", "truncated", "env_steps"):
            getattr(self, name).copy_(state[name])
        self.failed.copy_(state.get("failed", torch.zeros_like(self.failed)))  # replays saved before it: none
        self.size, self.next_row = int(state["size"]), int(state["next_row"])
        self.inserted_steps = int(state["inserted_steps"])


def dense_finals_as_slots(state: dict, horizon: int) -> dict:
    """A replay saved with a final observation for every entry ([rows, T, ...]) in the slots' form: slot
    row * T + t serves entry (row, t), which only a replay without images has room for."""
    rows = state["actions"].shape[0]
    entries = torch.arange(rows * horizon)
    return {
        "final_obs": {key: value.flatten(0, 1) for key, value in state["final_obs"].items()},
        "final_slot": entries.view(rows, horizon).to(torch.int32),
        "slot_entry": entries,
        "next_slot": 0,
        "finals_dropped": 0,
    }
