"""The off-policy replay: n-step targets across terminations, truncations and row ends against hand-computed values,
the ring's overwrite, uniform sampling; the critic ensemble's batched members and the subset-min target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfengine.algorithms.offpolicy.critics import (
    CriticEnsemble,
    EnsembleLayerNorm,
    EnsembleLinear,
    soft_update_,
    subset_min,
)
from sfengine.algorithms.offpolicy.replay import Replay
from sfengine.demos import Demo, DemoSet
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec

OBS_SPEC = ObsSpec({"obs": (1,)}, {"obs": torch.float32})
ACTION_SPEC = ActionSpec(discrete=False, dim=1, low=(-1.0,), high=(1.0,))
T = 5
GAMMA = 0.5


def trajectories(count: int, first_obs: float = 0.0) -> TrajectoryBuffers:
    """Rows whose observation at entry t is first_obs + 10 * row + t, whose reward at t is 2^t, whose final
    observations are 100 + the entry's observation."""
    batch = TrajectoryBuffers.allocate(count, T, OBS_SPEC, ACTION_SPEC, shared=False, final_obs=True)
    entries = first_obs + 10 * torch.arange(count)[:, None] + torch.arange(T + 1)[None]
    batch.obs["obs"][:] = entries[..., None].float()
    batch.final_obs["obs"][:] = 100 + entries[..., None].float()
    batch.rewards[:] = 2.0 ** torch.arange(T + 1).float()
    batch.actions[:] = entries[..., None].float() / 100
    batch.chunk_steps[:] = 1
    return batch


def demonstration(start: float, steps: int, success: bool) -> Demo:
    """Observations start, start + 1, ...; actions a hundredth of them; reward 1 at the last step of a success."""
    obs = start + np.arange(steps, dtype=np.float32)[:, None]
    rewards = np.zeros(steps, np.float32)
    rewards[-1] = float(success)
    dones = np.zeros(steps, np.uint8)
    dones[-1] = success
    return Demo({"obs": obs}, obs / 100, rewards, dones, None, 0, 0)


def test_n_step_returns_stop_at_terminations_truncations_and_the_rows_end():
    batch = trajectories(1)
    batch.terminated[0, 1] = True  # the episode ends at step 1: nothing to bootstrap
    batch.truncated[0, 3] = True  # a time limit at step 3: bootstrap from its final observation
    replay = Replay(100, T, OBS_SPEC, ACTION_SPEC)
    replay.insert(batch)
    rows, t = torch.zeros(5, dtype=torch.long), torch.arange(5)
    out = replay.n_step(rows, t, 3, GAMMA)
    # t=0: r0 + g r1, terminated at 1 -> 2 steps, no bootstrap
    # t=1: r1, terminated -> 1 step, no bootstrap
    # t=2: r2 + g r3, truncated at 3 -> 2 steps, bootstrap g^2 V(final obs of step 3 = 103)
    # t=3: r3, truncated -> 1 step, bootstrap g V(103)
    # t=4: r4 only, the row ends at T=5 -> bootstrap g V(obs[5] = 5)
    assert out.returns.tolist() == [1 + 0.5 * 2, 2, 4 + 0.5 * 8, 8, 16]
    assert out.discounts.tolist() == [0.0, 0.0, 0.25, 0.5, 0.5]
    assert out.steps.tolist() == [2, 1, 2, 1, 1]
    assert out.next_obs["obs"].squeeze(1)[2:].tolist() == [103, 103, 5]
    assert out.obs["obs"].squeeze(1).tolist() == [0, 1, 2, 3, 4]
    assert out.actions.squeeze(1).tolist() == pytest.approx([0, 0.01, 0.02, 0.03, 0.04])


def test_a_failed_env_step_is_never_a_transition_and_returns_that_reach_it_stop_before_it():
    batch = trajectories(1)
    # The env step of entry 2 raised: the rollout worker cut the episode there (a NaN outcome marks the failure) and
    # the next episode starts at entry 3.
    batch.truncated[0, 2] = True
    batch.outcomes[0, 2] = float("nan")
    batch.truncated[0, 4] = True  # an ordinary time limit: its outcome is a number
    replay = Replay(100, T, OBS_SPEC, ACTION_SPEC)
    replay.insert(batch)
    out = replay.n_step(torch.zeros(2, dtype=torch.long), torch.tensor([0, 1]), 3, GAMMA)
    # t=0: r0 + g r1, then the failed entry: bootstrap g^2 V(obs[2] = 2), the last good observation
    # t=1: r1, bootstrap g V(2)
    assert out.returns.tolist() == [1 + 0.5 * 2, 2]
    assert out.discounts.tolist() == [0.25, 0.5]
    assert out.next_obs["obs"].squeeze(1).tolist() == [2, 2]
    rows, t = replay.sample_indices(3000, torch.Generator().manual_seed(0))
    assert set(t.tolist()) == {0, 1, 3, 4}  # never the failed entry; the time limit's entry is a transition


def test_one_step_targets_bootstrap_from_the_next_entry_inside_an_episode():
    replay = Replay(100, T, OBS_SPEC, ACTION_SPEC)
    replay.insert(trajectories(2))
    out = replay.n_step(torch.tensor([1, 1]), torch.tensor([0, 2]), 1, GAMMA)
    assert out.returns.tolist() == [1, 4] and out.discounts.tolist() == [0.5, 0.5]
    assert out.next_obs["obs"].squeeze(1).tolist() == [11, 13]


def test_the_ring_overwrites_its_oldest_rows_and_samples_only_stored_steps():
    replay = Replay(3 * T, T, OBS_SPEC, ACTION_SPEC)  # three rows
    replay.insert(trajectories(2, first_obs=0))
    assert replay.stored_steps == 2 * T
    rows, t = replay.sample_indices(2000, torch.Generator().manual_seed(0))
    assert set(rows.tolist()) == {0, 1} and set(t.tolist()) == set(range(T))
    replay.insert(trajectories(2, first_obs=1000))  # rows 2 and 0 (the oldest) now
    assert replay.size == 3 and replay.inserted_steps == 4 * T
    assert replay.obs["obs"][:, 0, 0].tolist() == [1010, 10, 1000]
    counts = torch.bincount(replay.sample_indices(30000, torch.Generator().manual_seed(1))[0], minlength=3)
    assert (counts.float() / 30000 - 1 / 3).abs().max() < 0.02  # uniform over the stored rows


def test_a_successful_demonstration_terminates_and_a_failed_one_bootstraps_from_its_last_observation():
    demos = DemoSet("env", "state", [demonstration(0, 3, True), demonstration(50, 4, False)])
    replay = Replay.of_demos(demos, OBS_SPEC, ACTION_SPEC, lambda rewards: 10 * rewards)
    # The success's 3 steps and the failure's first 3 (its last observation is only a bootstrap): 6 starts.
    rows, t = replay.sample_indices(3000, torch.Generator().manual_seed(0))
    starts = set(zip(rows.tolist(), t.tolist(), strict=True))
    assert starts == {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)}
    out = replay.n_step(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 0, 2]), 3, GAMMA)
    # Success: its reward (scaled by the learner's view, x10) at the last step, then nothing to bootstrap.
    # Failure: truncated at step 2, bootstrapping from observation 53 (the one after step 2's action).
    assert out.returns.tolist() == [0.25 * 10, 10, 0, 0]
    assert out.discounts.tolist() == [0, 0, 0.125, 0.5]
    assert out.next_obs["obs"].squeeze(1)[2:].tolist() == [53, 53]
    assert out.actions.squeeze(1).tolist() == pytest.approx([0, 0.02, 0.5, 0.52])


def test_each_member_of_the_ensemble_is_its_own_network_computed_in_one_batch():
    torch.manual_seed(0)
    critics = CriticEnsemble(3, 4, [8, 8])
    features, actions = torch.randn(6, 3), torch.randn(6, 1)
    q = critics(features, actions)
    assert q.shape == (3, 6)
    assert not torch.allclose(q[0], q[1])  # independently initialised
    # Member 1 alone, layer by layer, gives the same values.
    x = torch.cat([features, actions], 1)
    for layer in critics.net:
        if isinstance(layer, EnsembleLinear):
            x = x @ layer.weight[1] + layer.bias[1]
        elif isinstance(layer, EnsembleLayerNorm):
            x = torch.nn.functional.layer_norm(x, (layer.width,)) * layer.weight[1] + layer.bias[1]
        else:
            x = layer(x)
    assert torch.allclose(q[1], x.squeeze(-1), atol=1e-6)


def test_the_target_is_the_minimum_of_a_random_subset_of_members():
    q = torch.tensor([[1.0, 9.0], [5.0, 2.0], [3.0, 7.0], [4.0, 4.0]])
    assert subset_min(q, 4).tolist() == [1.0, 2.0]
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        chosen = subset_min(q, 2, generator)
        # the minimum of two distinct rows: every value is one of the pairwise minima
        pairs = {
            (min(q[i, 0], q[j, 0]).item(), min(q[i, 1], q[j, 1]).item()) for i in range(4) for j in range(4) if i < j
        }
        assert tuple(chosen.tolist()) in pairs
        seen.add(tuple(chosen.tolist()))
    assert len(seen) > 3  # the subset is drawn afresh


def test_polyak_averaging_moves_the_target_by_tau():
    source, target = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    before = target.weight.detach().clone()
    soft_update_(target, source, 0.25)
    assert torch.allclose(target.weight, 0.75 * before + 0.25 * source.weight)


CHUNK_SPEC = ActionSpec(discrete=False, dim=2, low=(-1.0, -1.0), high=(1.0, 1.0), chunk=2)


def test_n_step_returns_over_chunks_discount_each_by_the_env_steps_before_it():
    # Entries are chunks of 2 actions; entry 2 is cut short by a time limit after 1 env step.
    batch = TrajectoryBuffers.allocate(1, T, OBS_SPEC, CHUNK_SPEC, shared=False, final_obs=True)
    entries = torch.arange(T + 1).float()
    batch.obs["obs"][0] = entries[:, None]
    batch.final_obs["obs"][0] = 100 + entries[:, None]
    batch.rewards[0] = 2.0**entries  # each already the chunk's discounted sum, as the rollout writes it
    batch.chunk_steps[0, :T] = torch.tensor([2, 2, 1, 2, 2])
    batch.truncated[0, 2] = True
    replay = Replay(100, T, OBS_SPEC, CHUNK_SPEC)
    replay.insert(batch)
    assert replay.inserted_steps == 9  # env steps, not entries
    out = replay.n_step(torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 3]), 3, GAMMA)
    # t=0: r0 + g^2 r1 + g^4 r2, cut at 2 after 5 env steps -> g^5 V(final obs of entry 2 = 102)
    # t=1: r1 + g^2 r2 -> g^3 V(102); t=3: r3 + g^2 r4, the row's end -> g^4 V(obs[5] = 5)
    assert out.returns.tolist() == [1 + 0.25 * 2 + 0.0625 * 4, 2 + 0.25 * 4, 8 + 0.25 * 16]
    assert out.discounts.tolist() == [0.5**5, 0.5**3, 0.5**4]
    assert out.steps.tolist() == [5, 3, 4]
    assert out.next_obs["obs"].squeeze(1).tolist() == [102, 102, 5]


def test_demonstrations_in_chunks_start_a_chunk_at_every_step():
    demos = DemoSet("env", "state", [demonstration(0, 5, True), demonstration(50, 4, False)])
    replay = Replay.of_demos(demos, OBS_SPEC, CHUNK_SPEC, lambda rewards: rewards, GAMMA)
    # Success: chunks from steps 0, 2, 4 (row 0) and 1, 3 (row 1). Failure, 3 steps with a next observation:
    # chunks from 0, 2 (row 2) and 1 (row 3).
    rows, t = replay.sample_indices(3000, torch.Generator().manual_seed(0))
    starts = set(zip(rows.tolist(), t.tolist(), strict=True))
    assert starts == {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)}
    assert replay.obs["obs"][:4, 0, 0].tolist() == [0, 1, 50, 51]
    # The last chunk of the success runs past its end: its last action repeated, one env step taken.
    assert replay.actions[0, 2].tolist() == pytest.approx([0.04, 0.04])
    assert replay.env_steps[0, :3].tolist() == [2, 2, 1]
    out = replay.n_step(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 0, 0, 0]), 3, GAMMA)
    # Row 0: the success's reward 4 env steps on; row 1: its chunk from step 3 holds r3 + g r4 = 0.5, 2 steps on.
    assert out.returns.tolist() == [0.5**4, 0.25 * 0.5, 0, 0]
    # The failure bootstraps from observation 53 after its 3 steps (row 2) or 2 (row 3, from step 1).
    assert out.discounts.tolist() == [0, 0, 0.5**3, 0.5**2]
    assert out.next_obs["obs"].squeeze(1)[2:].tolist() == [53, 53]


IMAGE_SPEC = ObsSpec({"image": (2, 2, 1), "obs": (1,)}, {"image": torch.uint8, "obs": torch.float32})


def image_trajectories(count: int, first: int = 0) -> TrajectoryBuffers:
    """Rows whose image at entry t is all first + 10 * row + t, whose final images are that + 100."""
    batch = TrajectoryBuffers.allocate(count, T, IMAGE_SPEC, ACTION_SPEC, shared=False, final_obs=True)
    entries = first + 10 * torch.arange(count)[:, None] + torch.arange(T + 1)[None]
    batch.obs["image"][:] = entries[..., None, None, None].to(torch.uint8)
    batch.final_obs["image"][:] = (100 + entries)[..., None, None, None].to(torch.uint8)
    batch.obs["obs"][:] = entries[..., None].float()
    batch.final_obs["obs"][:] = 100 + entries[..., None].float()
    batch.rewards[:] = 1.0
    batch.chunk_steps[:] = 1
    return batch


def test_images_keep_a_truncated_episodes_last_observation_in_two_slots_a_row_not_one_per_entry():
    replay = Replay(4 * T, T, IMAGE_SPEC, ACTION_SPEC)  # four rows
    assert (
        replay.final_obs["image"].shape[0] == 8
        and Replay(4 * T, T, OBS_SPEC, ACTION_SPEC).final_obs["obs"].shape[0] == 4 * T
    )  # without images, a slot for every entry
    batch = image_trajectories(2)
    batch.truncated[0, 1] = batch.truncated[1, 3] = True
    batch.terminated[1, 3] = True  # a termination bootstraps from nothing: no slot
    replay.insert(batch)
    assert (replay.slot_entry >= 0).sum() == 1
    out = replay.n_step(torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2]), 2, GAMMA)
    # t=0: r0 + g r1, truncated at 1: bootstrap from its final image (101); t=1 the same; t=2 from entry 4.
    assert out.next_obs["image"][:, 0, 0, 0].tolist() == [101, 101, 4]
    assert out.next_obs["obs"].squeeze(1).tolist() == [101, 101, 4]
    assert out.discounts.tolist() == [0.25, 0.5, 0.25]
    # Row after row overwritten in the ring, one truncation each: every slot is freed with its row, none dropped.
    for first in range(0, 100, 10):
        more = image_trajectories(2, first)
        more.truncated[:, 2] = True
        replay.insert(more)
    assert replay.finals_dropped == 0 and not replay.failed.any()
    out = replay.n_step(torch.arange(4), torch.full((4,), 2), 1, GAMMA)
    assert out.next_obs["image"][:, 0, 0, 0].tolist() == [100 + 90 + 2, 100 + 90 + 12, 100 + 80 + 2, 100 + 80 + 12]


def test_a_slot_reused_while_its_entry_lives_makes_that_entry_a_failed_step():
    replay = Replay(2 * T, T, IMAGE_SPEC, ACTION_SPEC)  # two rows, four slots
    first, second = image_trajectories(1), image_trajectories(1, first=50)
    first.truncated[0, :3] = True  # three one-step episodes, each truncated, then two more: one over the slots
    second.truncated[0, :2] = True
    replay.insert(first)
    replay.insert(second)
    assert replay.finals_dropped == 1
    assert replay.failed[0].tolist() == [True, False, False, False, False]  # its slot went to the newest
    rows, t = replay.sample_indices(4000, torch.Generator().manual_seed(0))
    assert (0, 0) not in set(zip(rows.tolist(), t.tolist(), strict=True))
    out = replay.n_step(torch.tensor([0, 0, 1, 1]), torch.tensor([1, 2, 0, 1]), 1, GAMMA)
    assert out.next_obs["image"][:, 0, 0, 0].tolist() == [101, 102, 150, 151]
    # More truncations in one batch than there are slots: the last ones are kept.
    crowded = Replay(2 * T, T, IMAGE_SPEC, ACTION_SPEC)
    batch = image_trajectories(1)
    batch.truncated[0, :] = True
    crowded.insert(batch)
    assert crowded.finals_dropped == 1 and crowded.failed[0].tolist() == [True, False, False, False, False]
    out = crowded.n_step(torch.zeros(4, dtype=torch.long), torch.arange(1, 5), 1, GAMMA)
    assert out.next_obs["image"][:, 0, 0, 0].tolist() == [101, 102, 103, 104]


def test_a_saved_replay_comes_back_with_its_slots_and_one_saved_before_them_loads():
    replay = Replay(4 * T, T, IMAGE_SPEC, ACTION_SPEC)
    batch = image_trajectories(2)
    batch.truncated[:, 2] = True
    replay.insert(batch)
    again = Replay(4 * T, T, IMAGE_SPEC, ACTION_SPEC)
    again.load_state_dict(replay.state_dict())
    rows, t = torch.tensor([0, 1]), torch.tensor([2, 2])
    assert torch.equal(
        again.n_step(rows, t, 1, GAMMA).next_obs["image"], replay.n_step(rows, t, 1, GAMMA).next_obs["image"]
    )
    assert again.next_slot == replay.next_slot == 2
    # A vector replay saved with a final observation for every entry ([rows, T, ...]).
    old = Replay(4 * T, T, OBS_SPEC, ACTION_SPEC)
    vector = trajectories(2)
    vector.truncated[:, 3] = True
    old.insert(vector)
    state = old.state_dict()
    dense = torch.zeros(4, T, 1)
    dense[0, 3], dense[1, 3] = 103, 113
    state = {key: value for key, value in state.items() if key not in ("final_slot", "slot_entry", "next_slot")}
    state["final_obs"] = {"obs": dense}
    loaded = Replay(4 * T, T, OBS_SPEC, ACTION_SPEC)
    loaded.load_state_dict(state)
    assert loaded.n_step(torch.tensor([0, 1]), torch.tensor([3, 3]), 1, GAMMA).next_obs["obs"].squeeze(1).tolist() == [
        103,
        113,
    ]
