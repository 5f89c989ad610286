"""An ensemble of Q critics computed as one batched network, and the target from the minimum of a random subset.

Each of the E members is an MLP over (observation features, action) with LayerNorm after every hidden layer
(Linear -> LayerNorm -> ReLU, as RLPD's critics). The members' weights are stacked ([E, in, out]) and every layer
is one batched matrix product (``torch.baddbmm``), so E critics cost about one larger network, not E Python calls.

Target (REDQ, RLPD): min over a random subset of M of the E target critics, drawn afresh for every minibatch;
M = E = 2 is the clipped double Q of TD3 and SAC.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EnsembleLinear(nn.Module):
    """E independent linear layers applied to E inputs at once: [E, N, in] -> [E, N, out]."""

    def __init__(self, members: int, fan_in: int, fan_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default initialisation, member by member
        self.weight = nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the features, with each member's own scale and shift."""

    def __init__(self, members: int, width: int):
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.ones(members, 1, width))
        self.bias = nn.Parameter(torch.zeros(members, 1, width))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.width,)) * self.weight + self.bias


class CriticEnsemble(nn.Module):
    def __init__(self, members: int, input_dim: int, hidden_sizes: list[int], layer_norm: bool = True):
        super().__init__()
        self.members = members
        layers: list[nn.Module] = []
        width = input_dim
        for size in hidden_sizes:
            layers.append(EnsembleLinear(members, width, size))
            if layer_norm:
                layers.append(EnsembleLayerNorm(members, size))
            layers.append(nn.ReLU())
            width = size
        layers.append(EnsembleLinear(members, width, 1))
        self.net = nn.Sequential(*layers)

    @classmethod
    def of_options(cls, options, input_dim: int) -> CriticEnsemble:
        """The ensemble the off-policy options ask for (--num_critics, --critic_hidden_sizes, --critic_layer_norm)."""
        return cls(options.num_critics, input_dim, options.critic_hidden_sizes, options.critic_layer_norm)

    def forward(self, features: Tensor, actions: Tensor) -> Tensor:
        """Q of every member: [E, N] for features [N, F] and actions [N, A] (or [E, N, ...] each, one per member)."""
        x = torch.cat([features, actions], dim=-1)
        if x.dim() == 2:
            x = x.expand(self.members, *x.shape)
        return self.net(x).squeeze(-1)


def subset_min(q: Tensor, subset: int, generator: torch.Generator | None = None) -> Tensor:
    """min over ``subset`` members drawn at random (without replacement) of ``q`` [E, N]: [N]."""
    members = q.shape[0]
    if subset >= members:
        return q.min(0).values
    chosen = torch.randperm(members, generator=generator)[:subset].to(q.device)
    return q.index_select(0, chosen).min(0).values


def soft_update_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau source (Polyak averaging), parameter by parameter; a parameter the two
    share (a module the target holds by reference, see TD3Trainer) is left as it is."""
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters(), strict=True):
            if t is not s:
                t.lerp_(s, tau)
