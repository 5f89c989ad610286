"""GAE and V-trace against numbers worked out by hand.

Shared setup unless a test says otherwise: one trajectory of T=3 steps, gamma=0.5, lambda=0.5 (so the advantage
carry factor gamma*lambda is 0.25), rewards [1, 2, 3] and values V0..V3 = [0.5, 1, 2, 4]. Without episode ends the
TD errors are:
    delta0 = 1 + 0.5*1 - 0.5 = 1
    delta1 = 2 + 0.5*2 - 1   = 2
    delta2 = 3 + 0.5*4 - 2   = 3
"""

import math

import torch
from torch.testing import assert_close

from sfengine.algo import gae, vtrace

REWARDS = torch.tensor([[1.0, 2.0, 3.0]])
VALUES = torch.tensor([[0.5, 1.0, 2.0, 4.0]])


def flags(*steps: int, num_steps: int = 3) -> torch.Tensor:
    """A [1, T] bool tensor set at the given steps."""
    result = torch.zeros(1, num_steps, dtype=torch.bool)
    result[0, list(steps)] = True
    return result


NO_FLAGS = flags()
NO_TRUNCATION_VALUES = torch.zeros(1, 3)


def test_gae_without_episode_ends_discounts_td_errors_by_gamma_lambda():
    advantages, returns = gae(REWARDS, VALUES, NO_FLAGS, NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.5, gae_lambda=0.5)
    # A2 = 3;  A1 = 2 + 0.25*3 = 2.75;  A0 = 1 + 0.25*2.75 = 1.6875
    assert_close(advantages, torch.tensor([[1.6875, 2.75, 3.0]]))
    # returns = A + V[:T] = [1.6875 + 0.5, 2.75 + 1, 3 + 2]
    assert_close(returns, torch.tensor([[2.1875, 3.75, 5.0]]))


def test_gae_lambda_zero_gives_td_errors_and_lambda_one_gives_discounted_sums():
    one_step, _ = gae(REWARDS, VALUES, NO_FLAGS, NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.5, gae_lambda=0.0)
    assert_close(one_step, torch.tensor([[1.0, 2.0, 3.0]]))

    # lambda = 1, carry factor gamma = 0.5:  A2 = 3;  A1 = 2 + 0.5*3 = 3.5;  A0 = 1 + 0.5*3.5 = 2.75
    full, _ = gae(REWARDS, VALUES, NO_FLAGS, NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.5, gae_lambda=1.0)
    assert_close(full, torch.tensor([[2.75, 3.5, 3.0]]))


def test_gae_gamma_zero_reduces_to_reward_minus_value():
    # gamma = 0 removes bootstrapping and carry: A = r - V[:T] = [1 - 0.5, 2 - 1, 3 - 2]
    advantages, _ = gae(REWARDS, VALUES, NO_FLAGS, NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.0, gae_lambda=0.5)
    assert_close(advantages, torch.tensor([[0.5, 1.0, 1.0]]))


def test_gae_does_not_bootstrap_through_termination_at_the_last_step():
    advantages, _ = gae(REWARDS, VALUES, flags(2), NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.5, gae_lambda=0.5)
    # delta2 = 3 + 0 - 2 = 1 (V3 = 4 ignored);  A1 = 2 + 0.25*1 = 2.25;  A0 = 1 + 0.25*2.25 = 1.5625
    assert_close(advantages, torch.tensor([[1.5625, 2.25, 1.0]]))


def test_gae_episode_boundary_mid_trajectory_cuts_bootstrap_and_carry():
    advantages, _ = gae(REWARDS, VALUES, flags(1), NO_FLAGS, NO_TRUNCATION_VALUES, gamma=0.5, gae_lambda=0.5)
    # Step 2 starts a new episode: A2 = delta2 = 3.
    # delta1 = 2 + 0 - 1 = 1 and nothing is carried back from A2: A1 = 1.
    # A0 = 1 + 0.25*1 = 1.25
    assert_close(advantages, torch.tensor([[1.25, 1.0, 3.0]]))


def test_gae_truncation_bootstraps_from_truncation_value_not_from_next_entry():
    truncation_values = torch.tensor([[0.0, 6.0, 0.0]])
    advantages, _ = gae(REWARDS, VALUES, NO_FLAGS, flags(1), truncation_values, gamma=0.5, gae_lambda=0.5)
    # delta1 = 2 + 0.5*6 - 1 = 4 (values[:, 2] = 2 would have given 2); no carry from A2 = 3.
    # A0 = 1 + 0.25*4 = 2
    assert_close(advantages, torch.tensor([[2.0, 4.0, 3.0]]))


def test_gae_truncation_at_last_step_ignores_bootstrap_value():
    truncation_values = torch.tensor([[0.0, 0.0, 10.0]])
    advantages, _ = gae(REWARDS, VALUES, NO_FLAGS, flags(2), truncation_values, gamma=0.5, gae_lambda=0.5)
    # delta2 = 3 + 0.5*10 - 2 = 6;  A1 = 2 + 0.25*6 = 3.5;  A0 = 1 + 0.25*3.5 = 1.875
    assert_close(advantages, torch.tensor([[1.875, 3.5, 6.0]]))


def test_gae_termination_wins_when_both_flags_are_set():
    truncation_values = torch.tensor([[0.0, 6.0, 0.0]])
    advantages, _ = gae(REWARDS, VALUES, flags(1), flags(1), truncation_values, gamma=0.5, gae_lambda=0.5)
    # Same as plain termination at step 1.
    assert_close(advantages, torch.tensor([[1.25, 1.0, 3.0]]))


def test_gae_treats_trajectories_independently_and_accepts_float_flags():
    rewards = REWARDS.repeat(2, 1)
    values = VALUES.repeat(2, 1)
    terminated = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    advantages, _ = gae(rewards, values, terminated, torch.zeros(2, 3), torch.zeros(2, 3), gamma=0.5, gae_lambda=0.5)
    assert_close(advantages, torch.tensor([[1.6875, 2.75, 3.0], [1.25, 1.0, 3.0]]))


def test_vtrace_on_policy_equals_gae_with_lambda_one():
    generator = torch.Generator().manual_seed(0)
    batch_size, num_steps = 4, 9
    rewards = torch.randn(batch_size, num_steps, generator=generator)
    values = torch.randn(batch_size, num_steps + 1, generator=generator)
    terminated = torch.rand(batch_size, num_steps, generator=generator) < 0.15
    truncated = torch.rand(batch_size, num_steps, generator=generator) < 0.15
    truncation_values = torch.randn(batch_size, num_steps, generator=generator)

    _, gae_returns = gae(rewards, values, terminated, truncated, truncation_values, gamma=0.9, gae_lambda=1.0)
    value_targets, _ = vtrace(
        rewards,
        values,
        terminated,
        truncated,
        truncation_values,
        log_rhos=torch.zeros(batch_size, num_steps),
        gamma=0.9,
        rho_clip=1.0,
        c_clip=2.0,
    )
    assert_close(value_targets, gae_returns)


def test_vtrace_rho_clipping_limits_the_weight_of_an_off_policy_step():
    # T=2, gamma=0.5, rewards [1, 2], V0..V2 = [0.5, 1, 2], no episode ends.
    # TD errors: delta0 = 1 + 0.5*1 - 0.5 = 1;  delta1 = 2 + 0.5*2 - 1 = 2.
    # Step 0 has ratio 0.5 (rho0 = c0 = 0.5), step 1 has ratio 2.
    rewards = torch.tensor([[1.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 2.0]])
    no_flags = torch.zeros(1, 2, dtype=torch.bool)
    log_rhos = torch.tensor([[math.log(0.5), math.log(2.0)]])

    clipped_targets, clipped_pg = vtrace(
        rewards, values, no_flags, no_flags, torch.zeros(1, 2), log_rhos, gamma=0.5, rho_clip=1.0, c_clip=1.0
    )
    # rho1 clipped to 1:  vs1 - V1 = 1*2 = 2  ->  vs1 = 3
    # vs0 - V0 = rho0*delta0 + gamma*c0*(vs1 - V1) = 0.5*1 + 0.5*0.5*2 = 1  ->  vs0 = 1.5
    assert_close(clipped_targets, torch.tensor([[1.5, 3.0]]))
    # pg0 = rho0*(r0 + gamma*vs1 - V0) = 0.5*(1 + 1.5 - 0.5) = 1;  pg1 = 1*(2 + 0.5*V2 - 1) = 2
    assert_close(clipped_pg, torch.tensor([[1.0, 2.0]]))

    loose_targets, loose_pg = vtrace(
        rewards, values, no_flags, no_flags, torch.zeros(1, 2), log_rhos, gamma=0.5, rho_clip=10.0, c_clip=1.0
    )
    # rho1 = 2:  vs1 - V1 = 2*2 = 4  ->  vs1 = 5
    # vs0 - V0 = 0.5*1 + 0.5*0.5*4 = 1.5  ->  vs0 = 2
    assert_close(loose_targets, torch.tensor([[2.0, 5.0]]))
    # pg0 = 0.5*(1 + 0.5*5 - 0.5) = 1.5;  pg1 = 2*(2 + 1 - 1) = 4
    assert_close(loose_pg, torch.tensor([[1.5, 4.0]]))


def test_vtrace_truncation_bootstraps_targets_and_pg_advantage_from_truncation_value():
    # T=2, gamma=0.5, rewards [1, 2], V0..V2 = [0.5, 1, 2], on-policy, step 0 truncated with final value 4.
    rewards = torch.tensor([[1.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 2.0]])
    truncated = torch.tensor([[True, False]])
    value_targets, pg_advantages = vtrace(
        rewards,
        values,
        torch.zeros(1, 2, dtype=torch.bool),
        truncated,
        torch.tensor([[4.0, 0.0]]),
        log_rhos=torch.zeros(1, 2),
        gamma=0.5,
    )
    # vs1 - V1 = 2 + 0.5*2 - 1 = 2  ->  vs1 = 3
    # vs0 - V0 = 1 + 0.5*4 - 0.5 = 2.5 (no trace through the boundary)  ->  vs0 = 3
    assert_close(value_targets, torch.tensor([[3.0, 3.0]]))
    # pg0 = 1 + 0.5*4 - 0.5 = 2.5 (bootstrapping from vs1 = 3 would give 2);  pg1 = 2 + 0.5*2 - 1 = 2
    assert_close(pg_advantages, torch.tensor([[2.5, 2.0]]))


def test_vtrace_does_not_bootstrap_through_termination():
    rewards = torch.tensor([[1.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 2.0]], requires_grad=True)
    terminated = torch.tensor([[True, False]])
    value_targets, pg_advantages = vtrace(
        rewards,
        values,
        terminated,
        torch.zeros(1, 2, dtype=torch.bool),
        torch.tensor([[4.0, 0.0]]),
        log_rhos=torch.zeros(1, 2),
        gamma=0.5,
    )
    # vs0 = V0 + (1 + 0 - 0.5) = 1;  pg0 = 1 - 0.5 = 0.5;  step 1 as in the truncation test.
    assert_close(value_targets, torch.tensor([[1.0, 3.0]]))
    assert_close(pg_advantages, torch.tensor([[0.5, 2.0]]))
    assert not value_targets.requires_grad and not pg_advantages.requires_grad
