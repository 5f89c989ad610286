"""Critic-free advantages: an episode is judged against the other episodes of its group.

A group is G episodes of one (task, init state). Each episode has one outcome R (its return, or its success);
every step of episode i gets the advantage A_i:

    rloo   A_i = R_i - mean_{j != i} R_j              leave-one-out baseline (Kool et al. 2019; RIPT-VLA)
    grpo   A_i = (R_i - mean_j R_j) / (std_j R_j + eps)  group-normalised (Shao et al. 2024, DeepSeekMath)

A group whose outcomes are all equal gets A = 0 everywhere: it carries no signal (``--dynamic_sampling`` drops
such groups before they reach the learner). A new estimator is one function ``fn(outcomes [groups, G]) ->
advantages [groups, G]`` and one ``register_group_advantage(name, fn)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sfengine.algorithms.ppo.options import GROUP_ADVANTAGE_NAMES

GroupAdvantageFn = Callable[[Tensor], Tensor]
GROUP_ADVANTAGES: dict[str, GroupAdvantageFn] = {}
GRPO_EPS = 1e-6


def register_group_advantage(name: str, fn: GroupAdvantageFn) -> None:
    """Make ``fn`` available as ``--advantage=name``."""
    GROUP_ADVANTAGES[name] = fn
    if name not in GROUP_ADVANTAGE_NAMES:
        GROUP_ADVANTAGE_NAMES.append(name)


def _check_groups(outcomes: Tensor) -> None:
    if outcomes.dim() != 2 or outcomes.shape[1] < 2:
        raise ValueError(f"outcomes must be [groups, G] with G >= 2, got shape {tuple(outcomes.shape)}")


@torch.no_grad()
def rloo(outcomes: Tensor) -> Tensor:
    """[groups, G] outcomes -> [groups, G] advantages: each outcome minus the mean of the group's others."""
    _check_groups(outcomes)
    size = outcomes.shape[1]
    others_mean = (outcomes.sum(dim=1, keepdim=True) - outcomes) / (size - 1)
    return outcomes - others_mean


@torch.no_grad()
def grpo(outcomes: Tensor) -> Tensor:
    """[groups, G] outcomes -> [groups, G] advantages: standardised within each group (sample std, as the
    reference implementations compute it)."""
    _check_groups(outcomes)
    mean = outcomes.mean(dim=1, keepdim=True)
    std = outcomes.std(dim=1, keepdim=True)
    return (outcomes - mean) / (std + GRPO_EPS)


@torch.no_grad()
def episode_step_weights(episodes: Tensor) -> Tensor:
    """[steps] episode index of each step -> [steps] weights under which every episode weighs the same in a
    step-averaged loss, whatever its length: ``num_steps / (num_episodes * len(own episode))``, mean 1.

    Step-averaged, a 280-step failure that ran to the time limit weighs twice a 140-step success, so a group with
    zero net advantage per episode still pushes away from its failures."""
    _, inverse, lengths = torch.unique(episodes, return_inverse=True, return_counts=True)
    return len(episodes) / (len(lengths) * lengths[inverse].to(torch.float32))


def uniform_groups(outcomes: Tensor) -> Tensor:
    """[groups] bool: the groups whose outcomes are all equal (no signal)."""
    return (outcomes == outcomes[:, :1]).all(dim=1)


register_group_advantage("rloo", rloo)
register_group_advantage("grpo", grpo)
