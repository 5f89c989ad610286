"""FlowSAR's pieces against values computed by hand (sfengine.algorithms.flow_sar.sar)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sfengine.algorithms.flow_sar.sar import (
    branch_energies,
    credit_weights,
    ema_decay,
    ema_update_,
    flow_sar_loss,
    mirror_branches,
    reconstruction_error,
)


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def test_reconstruction_error_is_the_squared_distance_per_step():
    actions = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    reconstructed = torch.tensor([[0.0, 4.0], [0.5, -0.5]])
    assert reconstruction_error(actions, reconstructed).tolist() == [5.0, 0.5]


ERRORS = torch.tensor([1.0, 2.0, 3.0, 0.5, 1.5])
EPISODES = torch.tensor([0, 0, 0, 1, 1])
SUCCESS = torch.tensor([1.0, 0.0])


def test_credit_weights_favour_uncertain_steps_of_successes_and_confident_steps_of_failures():
    weights, labels = credit_weights(ERRORS, EPISODES, SUCCESS, temperature=0.5, w_min=0.0, w_max=1.0)
    # Success: softmax(e / 0.5) = softmax(2, 4, 6); failure: softmax(-e / 0.5) = softmax(-1, -3).
    expected = softmax([2.0, 4.0, 6.0]) + softmax([-1.0, -3.0])
    assert weights.tolist() == pytest.approx(expected, rel=1e-6)
    assert labels.tolist() == [1.0, 1.0, 1.0, -1.0, -1.0]


def test_credit_weights_are_clipped_then_renormalised_within_each_episode():
    weights, _ = credit_weights(ERRORS, EPISODES, SUCCESS, temperature=0.5, w_min=0.05, w_max=0.5)
    success = [min(max(w, 0.05), 0.5) for w in softmax([2.0, 4.0, 6.0])]  # 0.0159 -> 0.05, 0.8668 -> 0.5
    failure = [min(max(w, 0.05), 0.5) for w in softmax([-1.0, -3.0])]  # 0.8808 -> 0.5, 0.1192 stays
    expected = [w / sum(success) for w in success] + [w / sum(failure) for w in failure]
    assert weights.tolist() == pytest.approx(expected, rel=1e-6)
    assert weights[:3].sum().item() == pytest.approx(1.0) and weights[3:].sum().item() == pytest.approx(1.0)


def test_mirror_branches_and_their_energies():
    v_pos, v_neg = mirror_branches(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), beta=0.5)
    assert v_pos.tolist() == [[2.0, 3.0]]  # 0.5 * (3, 4) + 0.5 * (1, 2)
    assert v_neg.tolist() == [[4.0, 5.0]]  # 1.5 * (3, 4) - 0.5 * (1, 2)
    target, t = torch.tensor([[0.0, 1.0]]), torch.tensor([0.25])
    e_pos, e_neg = branch_energies(v_pos, v_neg, target, t, "mse")
    assert (e_pos.item(), e_neg.item()) == (8.0, 32.0)  # 2^2 + 2^2, 4^2 + 4^2
    e_pos, e_neg = branch_energies(v_pos, v_neg, target, t, "sde")
    assert (e_pos.item(), e_neg.item()) == (16.0, 64.0)  # divided by 2t = 0.5


# Two steps of two episodes, each the only step of its episode (weight 1): a success and a failure.
V_THETA = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
V_OLD = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
TARGET = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
T = torch.tensor([0.5, 0.5])
WEIGHTS, LABELS = torch.tensor([1.0, 1.0]), torch.tensor([1.0, -1.0])
# beta 0.5: success v+ = (2, 3), v- = (4, 5): E+ = 8, E- = 32; failure v+ = (0.5, 0), v- = (1.5, 0): E+ = 2.25,
# E- = 0.25. ||v_theta - v_old||^2: 8 and 1.


def test_mse_branch_loss_takes_the_positive_branch_on_success_and_the_negative_on_failure():
    out = flow_sar_loss(V_THETA, V_OLD, TARGET, T, WEIGHTS, LABELS, 2, beta=0.5, variant="mse_branch")
    assert out.loss.item() == pytest.approx((8.0 + 0.25) / 2)
    assert (out.e_pos.item(), out.e_neg.item()) == pytest.approx(((8.0 + 2.25) / 2, (32.0 + 0.25) / 2))
    assert out.kl_penalty.item() == pytest.approx(4.5)  # reported, not in this variant's loss


def test_softplus_kl_loss_ranks_the_branches_and_adds_the_kl_penalty():
    out = flow_sar_loss(V_THETA, V_OLD, TARGET, T, WEIGHTS, LABELS, 2, beta=0.5, variant="softplus_kl", kl_coeff=1.0)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    contrastive = (softplus(0.5 * (8.0 - 32.0)) + softplus(-0.5 * (2.25 - 0.25))) / 2
    assert out.contrastive.item() == pytest.approx(contrastive, rel=1e-6)
    assert out.loss.item() == pytest.approx(contrastive + 4.5, rel=1e-6)
    quarter = torch.tensor([0.25, 0.25])  # sde: energies divided by 2t = 0.5
    sde = flow_sar_loss(V_THETA, V_OLD, TARGET, quarter, WEIGHTS, LABELS, 2, 0.5, energy="sde", kl_coeff=0.0)
    assert sde.loss.item() == pytest.approx((softplus(0.5 * (16.0 - 64.0)) + softplus(-0.5 * (4.5 - 0.5))) / 2)


@pytest.mark.parametrize("variant", ["mse_branch", "softplus_kl"])
def test_a_step_pulls_the_velocity_towards_the_target_on_success_and_pushes_it_away_on_failure(variant):
    for label in (1.0, -1.0):
        v_theta = torch.tensor([[0.5, -0.5]], requires_grad=True)
        v_old, target = torch.tensor([[0.5, -0.5]]), torch.tensor([[1.0, 1.0]])
        out = flow_sar_loss(
            v_theta, v_old, target, torch.tensor([0.5]), torch.ones(1), torch.tensor([label]), 1, 1.0, "mse", variant
        )
        out.loss.backward()
        towards_target = float((-v_theta.grad * (target - v_old)).sum())
        assert towards_target > 0 if label > 0 else towards_target < 0


def test_ema_schedules_and_update():
    assert ema_decay("fixed", 7, fixed_beta=0.995, eta_rate=0.001, eta_max=0.5) == 0.995
    assert ema_decay("linear", 100, fixed_beta=0.995, eta_rate=0.001, eta_max=0.5) == pytest.approx(0.1)
    assert ema_decay("linear", 2000, fixed_beta=0.995, eta_rate=0.001, eta_max=0.5) == 0.5
    reference, policy = nn.Linear(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        for p in reference.parameters():
            p.fill_(0.0)
        for p in policy.parameters():
            p.fill_(1.0)
    ema_update_(reference, policy, decay=0.25)
    assert all(torch.allclose(p, torch.full_like(p, 0.75)) for p in reference.parameters())
