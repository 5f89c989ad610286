"""SuccessReplay: the ring of successful episodes' steps that self-imitation learns from."""

import torch

from sfengine.learning.success_replay import SuccessReplay


def steps(first: int, count: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``count`` steps numbered from ``first``: the number is the observation and the action."""
    numbers = torch.arange(first, first + count, dtype=torch.float32)
    return {"obs": numbers[:, None].repeat(1, 3)}, numbers[:, None]


def test_the_replay_keeps_the_latest_steps_and_overwrites_the_oldest():
    replay = SuccessReplay(capacity=5)
    replay.add(*steps(0, 3))
    assert len(replay) == 3
    replay.add(*steps(3, 4))  # 7 steps into 5 places: 0 and 1 leave
    assert len(replay) == 5
    assert sorted(replay.actions[:, 0].tolist()) == [2, 3, 4, 5, 6]
    replay.add(*steps(7, 9))  # more than it holds at once: the latest 5 stay
    assert sorted(replay.actions[:, 0].tolist()) == [11, 12, 13, 14, 15]
    replay.add(*steps(16, 0))
    assert len(replay) == 5


def test_a_sample_pairs_each_observation_with_its_own_action():
    replay = SuccessReplay(capacity=100, seed=3)
    replay.add(*steps(0, 40))
    obs, actions = replay.sample(64)
    assert obs["obs"].shape == (64, 3) and actions.shape == (64, 1)
    assert torch.equal(obs["obs"][:, 0], actions[:, 0])
    assert actions.max() < 40  # only rows that hold a step
