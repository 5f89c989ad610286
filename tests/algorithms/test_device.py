"""The learner's math stays on the device of its inputs, so that it runs on a GPU as on the CPU.

A tensor made without ``device=`` lands on the CPU, and a GPU learner then fails half-way through its first update
(FlowSAR's credit weights did, on the first GPU run). The ``meta`` device finds such a tensor on any machine: it has
shapes but no data, and mixing it with a CPU tensor is the same error as mixing a CUDA one.
"""

from __future__ import annotations

import pytest
import torch

from sfengine.algorithms.advantages import gae, vtrace
from sfengine.algorithms.flow_sar.sar import credit_weights, flow_sar_loss
from sfengine.algorithms.group_advantages import grpo, rloo

META = torch.device("meta")
B, T, N, D = 3, 5, 6, 4


def on_meta(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.empty(shape, device=META) for shape in shapes]


def test_advantages_keep_to_their_inputs_device():
    rewards, values, terminated, truncated, truncation_values, log_rhos = on_meta(
        (B, T), (B, T + 1), (B, T), (B, T), (B, T), (B, T)
    )
    for advantages, returns in (
        gae(rewards, values, terminated, truncated, truncation_values, 0.99, 0.95),
        vtrace(rewards, values, terminated, truncated, truncation_values, log_rhos, 0.99),
    ):
        assert advantages.device == returns.device == META


@pytest.mark.parametrize("variant", ["softplus_kl", "mse_branch"])
def test_flow_sar_credit_and_loss_keep_to_their_inputs_device(variant):
    errors, success = on_meta((N,), (3,))
    episodes = torch.tensor([0, 0, 1, 1, 2, 2], device=META)
    weights, labels = credit_weights(errors, episodes, success, 0.5, 0.1, 0.9)
    assert weights.device == labels.device == META
    v_theta, v_old, target, t = on_meta((N, D), (N, D), (N, D), (N,))
    assert flow_sar_loss(v_theta, v_old, target, t, weights, labels, 3, 1.0, "sde", variant).loss.device == META


def test_group_advantages_keep_to_their_inputs_device():
    (outcomes,) = on_meta((4, 8))
    assert rloo(outcomes).device == grpo(outcomes).device == META
