"""The PPO loss, its gradients and its statistics against numbers worked out by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from sfengine.algo import explained_variance, kl_penalty, normalize_advantages, ppo_loss
from sfengine.algorithms.ppo.surrogates import SURROGATES


def loss_with(**overrides):
    """ppo_loss on two samples whose every term is zero unless overridden (ratio 1, A 0, V = target, H 0)."""
    arguments = dict(
        log_probs=torch.zeros(2),
        old_log_probs=torch.zeros(2),
        advantages=torch.zeros(2),
        values=torch.zeros(2),
        old_values=torch.zeros(2),
        value_targets=torch.zeros(2),
        entropy=torch.zeros(2),
        clip_ratio=0.2,
        value_clip=None,
        value_loss_coeff=0.5,
        entropy_coeff=0.01,
    )
    arguments.update(overrides)
    return ppo_loss(**arguments)


def test_policy_clipping_stops_gradient_only_when_the_ratio_moved_in_the_helpful_direction():
    # Both samples have ratio 1.5, outside [0.8, 1.2].
    log_probs = torch.full((2,), math.log(1.5), requires_grad=True)
    result = loss_with(log_probs=log_probs, advantages=torch.tensor([1.0, -1.0]))
    # A = +1: min(1.5*1, 1.2*1) = 1.2 (clipped, constant).  A = -1: min(-1.5, -1.2) = -1.5 (unclipped).
    # policy_loss = -(1.2 - 1.5)/2 = 0.15
    assert_close(result.policy_loss, torch.tensor(0.15))
    result.loss.backward()
    # d/dlogp of -(ratio*A)/2 = -ratio*A/2:  sample 0 gets nothing, sample 1 gets -1.5*(-1)/2 = 0.75
    assert_close(log_probs.grad, torch.tensor([0.0, 0.75]))


def test_policy_gradient_flows_inside_the_clip_range():
    log_probs = torch.full((2,), math.log(1.1), requires_grad=True)
    result = loss_with(log_probs=log_probs, advantages=torch.tensor([2.0, 2.0]))
    # ratio 1.1 is inside the range: policy_loss = -1.1*2 = -2.2, gradient -1.1*2/2 = -1.1 per sample
    assert_close(result.policy_loss, torch.tensor(-2.2))
    result.loss.backward()
    assert_close(log_probs.grad, torch.tensor([-1.1, -1.1]))


def test_value_clipping_keeps_the_larger_error():
    values = torch.tensor([2.0, 2.0], requires_grad=True)
    result = loss_with(
        values=values, old_values=torch.tensor([1.0, 1.0]), value_targets=torch.tensor([3.0, 1.0]), value_clip=0.5
    )
    # Clipped prediction: 1 + clamp(2 - 1, -0.5, 0.5) = 1.5 for both.
    # Sample 0 (target 3): unclipped (2-3)^2 = 1, clipped (1.5-3)^2 = 2.25 -> 2.25 (clipped branch, no grad)
    # Sample 1 (target 1): unclipped (2-1)^2 = 1, clipped (1.5-1)^2 = 0.25 -> 1 (unclipped branch)
    # value_loss = 0.5 * (2.25 + 1)/2 = 0.8125
    assert_close(result.value_loss, torch.tensor(0.8125))
    result.loss.backward()
    # d loss / d v1 = value_loss_coeff * 0.5 * 2*(v1 - target1)/2 = 0.5 * 0.5 * 1 = 0.25
    assert_close(values.grad, torch.tensor([0.0, 0.25]))


def test_value_loss_without_clipping_is_half_mean_squared_error():
    result = loss_with(values=torch.tensor([2.0, 2.0]), value_targets=torch.tensor([3.0, 0.0]), value_clip=None)
    # 0.5 * ((2-3)^2 + (2-0)^2)/2 = 0.5 * 2.5 = 1.25
    assert_close(result.value_loss, torch.tensor(1.25))


def test_entropy_is_a_bonus_that_lowers_the_loss():
    entropy = torch.tensor([1.0, 3.0], requires_grad=True)
    result = loss_with(entropy=entropy, entropy_coeff=0.01)
    # mean entropy 2, loss = -0.01*2 = -0.02; raising entropy must lower the loss
    assert_close(result.entropy, torch.tensor(2.0))
    assert_close(result.loss, torch.tensor(-0.02))
    result.loss.backward()
    assert_close(entropy.grad, torch.tensor([-0.005, -0.005]))


def test_total_loss_combines_the_three_terms_with_their_coefficients():
    result = loss_with(
        log_probs=torch.tensor([math.log(1.1), 0.0]),
        advantages=torch.tensor([1.0, 1.0]),
        values=torch.tensor([1.0, 0.0]),
        entropy=torch.tensor([0.5, 0.5]),
    )
    # policy = -(1.1 + 1)/2 = -1.05;  value = 0.5 * (1 + 0)/2 = 0.25;  entropy = 0.5
    # loss = -1.05 + 0.5*0.25 - 0.01*0.5 = -0.93
    assert_close(result.loss, torch.tensor(-0.93))


def test_clip_fraction_and_approx_kl_statistics():
    log_probs = torch.log(torch.tensor([2.0, 0.5, 1.0, 1.0])).requires_grad_()
    result = loss_with(
        log_probs=log_probs,
        old_log_probs=torch.zeros(4),
        advantages=torch.ones(4),
        values=torch.zeros(4),
        old_values=torch.zeros(4),
        value_targets=torch.zeros(4),
        entropy=torch.zeros(4),
    )
    # |ratio - 1| = [1, 0.5, 0, 0] vs clip 0.2 -> 2 of 4 clipped
    assert result.diagnostics["clip_fraction"] == pytest.approx(0.5)
    # (r - 1) - log r:  (1 - ln 2) + (-0.5 + ln 2) + 0 + 0 = 0.5 -> mean 0.125
    assert result.diagnostics["approx_kl"] == pytest.approx(0.125)
    # A = +1: ratio 2 is clipped (no gradient), 0.5 is not (min picks r A), the two at 1 are inside
    assert result.diagnostics["dead_grad_fraction"] == pytest.approx(0.25)
    assert (result.diagnostics["ratio_min"], result.diagnostics["ratio_max"]) == pytest.approx((0.5, 2.0))


@pytest.mark.parametrize("clip_mode", sorted(SURROGATES))
def test_statistics_read_after_backward_agree_with_those_read_before(clip_mode):
    # After backward() the per-sample gradients come from that pass (a hook on log_probs), before it from a
    # separate one: a trainer reads them after, the tests above before. The dead-gradient fraction must not care.
    generator = torch.Generator().manual_seed(3)
    log_ratio = 0.5 * torch.randn(256, generator=generator)
    advantages = torch.randn(256, generator=generator)
    advantages[:16] = 0.0  # no gradient in any mode

    def losses():
        log_probs = (log_ratio - 1.0).requires_grad_()
        return loss_with(
            log_probs=log_probs,
            old_log_probs=torch.full((256,), -1.0),
            advantages=advantages,
            values=None,
            old_values=None,
            value_targets=None,
            entropy=torch.zeros(256),
            clip_mode=clip_mode,
        )

    before = losses().diagnostics
    after_backward = losses()
    after_backward.loss.backward()
    after = after_backward.diagnostics
    assert after == pytest.approx(before)
    assert after["dead_grad_fraction"] >= 16 / 256
    if clip_mode == "ppo_clip":  # about a third of these ratios lie outside [0.8, 1.2] on the helpful side
        assert 0.2 < after["dead_grad_fraction"] < 0.5


def test_without_a_critic_the_value_loss_is_zero():
    result = loss_with(values=None, old_values=None, value_targets=None, advantages=torch.tensor([1.0, -1.0]))
    assert float(result.value_loss) == 0.0


def test_normalize_advantages_gives_zero_mean_unit_std():
    normalized = normalize_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # mean 2.5, population std sqrt((2.25 + 0.25 + 0.25 + 2.25)/4) = sqrt(1.25) = 1.1180340
    # (1 - 2.5)/1.1180340 = -1.3416408, (2 - 2.5)/1.1180340 = -0.4472136
    assert_close(normalized, torch.tensor([-1.3416408, -0.4472136, 0.4472136, 1.3416408]))


def test_explained_variance_is_one_for_a_perfect_critic():
    target = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(target.clone(), target) == pytest.approx(1.0)


def test_explained_variance_is_zero_when_predicting_the_mean():
    # residuals [-1, 0, 1] have the same variance as the target
    assert explained_variance(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(0.0)


def test_explained_variance_is_nan_for_a_constant_target():
    assert math.isnan(explained_variance(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 5.0])))


def test_kl_penalty_estimates_the_gaussian_kl_from_the_policys_own_samples_and_is_zero_at_the_reference():
    # pi = N(0, 1), pi_ref = N(0.5, 0.8^2): KL(pi || pi_ref) = log(0.8) + (1 + 0.25) / (2 * 0.64) - 0.5 = 0.2534.
    generator = torch.Generator().manual_seed(0)
    actions = torch.randn(200_000, generator=generator)
    log_probs = torch.distributions.Normal(0.0, 1.0).log_prob(actions)
    reference = torch.distributions.Normal(0.5, 0.8).log_prob(actions)
    assert float(kl_penalty(log_probs, reference)) == pytest.approx(0.2534, abs=0.01)
    assert float(kl_penalty(log_probs, log_probs)) == 0.0
    # A log-ratio far out of range (a many-dimensional Gaussian's) stays finite.
    assert math.isfinite(float(kl_penalty(torch.zeros(2), torch.tensor([500.0, -500.0]))))
