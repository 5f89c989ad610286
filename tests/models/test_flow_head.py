"""The flow-matching head: its Euler sampler against closed-form velocity fields, its one-step reconstruction, and
behavioural cloning of a two-mode action distribution that a Gaussian head could not represent."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import one_hot

from sfengine.models.flow_head import FlowHead, flow_matching_loss


def head_with_field(field, flow_steps: int, times: list | None = None) -> FlowHead:
    """A head whose velocity is the closed-form ``field(x, t)``, recording the times it is asked at."""
    head = FlowHead(feature_dim=3, action_dim=2, hidden_sizes=[8], flow_steps=flow_steps)

    def velocity(x_t, t, features):
        if times is not None:
            times.append(t.tolist())
        return field(x_t, t[:, None])

    head.velocity = velocity
    return head


def test_euler_steps_run_from_noise_at_t1_down_to_t0():
    # dx/dt = x: each Euler step back multiplies by (1 - dt), so 10 steps give 0.9^10 x_1 (the exact ODE: e^-1).
    times: list = []
    head = head_with_field(lambda x, t: x, flow_steps=10, times=times)
    noise = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    x_0 = head.sample(torch.zeros(2, 3), noise)
    assert torch.allclose(x_0, 0.9**10 * noise)
    assert [round(t[0], 6) for t in times] == [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]


@pytest.mark.parametrize("flow_steps", [1, 4, 10])
def test_the_ideal_field_of_one_target_action_lands_on_it_in_any_number_of_steps(flow_steps):
    # All data at a*: the flow-matching velocity is u = (x - a*) / t, whose straight path Euler follows exactly.
    target = torch.tensor([0.3, -0.7])
    head = head_with_field(lambda x, t: (x - target) / t, flow_steps)
    x_0 = head.sample(torch.zeros(5, 3), torch.randn(5, 2))
    assert torch.allclose(x_0, target.expand(5, 2), atol=1e-6)
    assert torch.allclose(head.mode(torch.zeros(5, 3)), target.expand(5, 2), atol=1e-6)
    # One step back from any noise level reconstructs a* as well.
    t = torch.tensor([0.2, 0.5, 0.9, 0.5, 0.7])
    reconstructed = head.reconstruct(target.expand(5, 2), t, torch.randn(5, 2), torch.zeros(5, 3))
    assert torch.allclose(reconstructed, target.expand(5, 2), atol=1e-6)


def test_flow_matching_loss_is_zero_for_the_ideal_field_and_positive_otherwise():
    target = torch.tensor([0.3, -0.7])
    actions, t, noise = target.expand(6, 2), torch.rand(6) * 0.9 + 0.05, torch.randn(6, 2)
    ideal = head_with_field(lambda x, t: (x - target) / t, 10)
    assert torch.allclose(flow_matching_loss(ideal, torch.zeros(6, 3), actions, t, noise), torch.zeros(6), atol=1e-9)
    off = head_with_field(lambda x, t: (x - target) / t + 0.1, 10)
    assert torch.allclose(flow_matching_loss(off, torch.zeros(6, 3), actions, t, noise), torch.full((6,), 0.02))


@pytest.mark.slow
def test_behavioural_cloning_learns_a_two_mode_action_distribution_from_demonstrations():
    # State 0: half the demonstrations at (0.5, 0.5), half at (-0.5, -0.5) (std 0.05); state 1: (0.5, -0.5) (std 0.1).
    # A Gaussian head fits state 0 with one wide mode at the origin; the flow head must reproduce both modes.
    torch.manual_seed(0)
    n = 3000
    state, upper = torch.randint(0, 2, (n,)), torch.randint(0, 2, (n,)).bool()
    centers = torch.where(upper[:, None], torch.tensor([0.5, 0.5]), torch.tensor([-0.5, -0.5]))
    centers = torch.where((state == 0)[:, None], centers, torch.tensor([0.5, -0.5]))
    actions = centers + torch.where(state == 0, 0.05, 0.1)[:, None] * torch.randn(n, 2)
    features = one_hot(state, 2).float()
    head = FlowHead(feature_dim=2, action_dim=2, hidden_sizes=[128, 128], flow_steps=10)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(2000):
        i = torch.randint(0, n, (256,))
        loss = flow_matching_loss(head, features[i], actions[i], torch.rand(256), torch.randn(256, 2)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        two_modes = head.sample(one_hot(torch.zeros(4000, dtype=torch.long), 2).float())
        one_mode = head.sample(one_hot(torch.ones(4000, dtype=torch.long), 2).float())
    in_upper = two_modes[:, 0] > 0
    assert 0.4 < float(in_upper.float().mean()) < 0.6
    assert float((two_modes.norm(dim=1) < 0.2).float().mean()) < 0.05  # nearly nothing between the modes
    for samples, center in [(two_modes[in_upper], [0.5, 0.5]), (two_modes[~in_upper], [-0.5, -0.5])]:
        assert torch.allclose(samples.mean(0), torch.tensor(center), atol=0.1), samples.mean(0)
        assert bool((samples.std(0) < 0.2).all()), samples.std(0)
    assert torch.allclose(one_mode.mean(0), torch.tensor([0.5, -0.5]), atol=0.1), one_mode.mean(0)
    assert bool((one_mode.std(0) > 0.03).all() and (one_mode.std(0) < 0.2).all()), one_mode.std(0)
