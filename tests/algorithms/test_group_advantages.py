"""RLOO and GRPO advantages against groups worked out by hand."""

import math

import pytest
import torch

from sfengine.algorithms.group_advantages import (
    GROUP_ADVANTAGES,
    episode_step_weights,
    grpo,
    register_group_advantage,
    rloo,
    uniform_groups,
)
from sfengine.algorithms.ppo.options import GROUP_ADVANTAGE_NAMES
from sfengine.config import ConfigError, parse_config


def test_rloo_subtracts_the_mean_of_the_other_episodes():
    outcomes = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 6.0]])
    # group 0: 1 - (0 + 0 + 1)/3 = 2/3, 0 - 2/3 = -2/3; group 1: 3 - 3 = 0, 1 - 11/3 = -8/3, 2 - 10/3, 6 - 2 = 4
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, -8 / 3, -4 / 3, 4.0]])
    torch.testing.assert_close(rloo(outcomes), expected)
    # Leave-one-out advantages of a group sum to zero.
    torch.testing.assert_close(rloo(outcomes).sum(1), torch.zeros(2))


def test_grpo_standardises_within_the_group_with_the_sample_std():
    outcomes = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    std = math.sqrt(1 / 3)
    torch.testing.assert_close(grpo(outcomes), torch.tensor([[0.5, -0.5, -0.5, 0.5]]) / (std + 1e-6))


def test_a_group_of_equal_outcomes_has_zero_advantage_and_is_uniform():
    outcomes = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    for estimator in (rloo, grpo):
        advantages = estimator(outcomes)
        assert torch.equal(advantages[:2], torch.zeros(2, 3))
        assert bool(advantages[2].abs().gt(0).all())
    assert uniform_groups(outcomes).tolist() == [True, True, False]


@pytest.mark.parametrize("shape", [(3, 1), (4,)])
def test_groups_of_one_episode_are_refused(shape):
    with pytest.raises(ValueError, match="G >= 2"):
        rloo(torch.zeros(shape))


def test_the_estimators_are_registered_by_name():
    assert GROUP_ADVANTAGES["rloo"] is rloo and GROUP_ADVANTAGES["grpo"] is grpo
    # The names the option check reads without torch are those that have a function, no more and no fewer.
    assert GROUP_ADVANTAGE_NAMES == list(GROUP_ADVANTAGES)


def test_an_estimator_registered_by_name_is_taken_by_the_option_check():
    args = ["--advantage=median_baseline", "--task_group_size=4"]
    with pytest.raises(ConfigError, match="is not one of gae, vtrace, rloo, grpo"):
        parse_config(args)
    register_group_advantage("median_baseline", lambda outcomes: outcomes - outcomes.median(dim=1, keepdim=True).values)
    try:
        assert parse_config(args).options_group("ppo").advantage == "median_baseline"
    finally:
        GROUP_ADVANTAGES.pop("median_baseline")
        GROUP_ADVANTAGE_NAMES.remove("median_baseline")


def test_episode_weights_give_every_episode_the_same_total_weight_whatever_its_length():
    # Episodes 0 (2 steps), 1 (6 steps) and 2 (4 steps), their steps interleaved as a shuffled batch holds them.
    episodes = torch.tensor([1, 0, 1, 2, 1, 1, 2, 0, 1, 2, 2, 1])
    weights = episode_step_weights(episodes)
    totals = torch.zeros(3).index_add_(0, episodes, weights)
    torch.testing.assert_close(totals, torch.full((3,), 4.0))  # 12 steps / 3 episodes
    torch.testing.assert_close(weights.mean(), torch.tensor(1.0))
