"""Behavioural cloning: the actor learns to reproduce demonstrated actions (``python -m sfengine.pretrain``).

    demos: episodes of (obs[t], action[t])
        --demo_samples-->  one sample per step: obs[t] and the chunk action[t : t + K] (--action_chunk=K)
        --split_by_episode-->  training and validation episodes
        --bc_loss-->  Gaussian head: -log pi(chunk | obs), the negative log-likelihood of the unclipped action
                      flow head:     the flow-matching regression of sfengine.models.flow_head
        --fit_action_std-->  Gaussian head: the log-std set to the actions' spread around the trained mean

A chunk that runs past its episode's end is padded with the episode's last action repeated: the demonstrator
would have held it, and the policy, which acts in whole chunks, must still emit K actions there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor

from sfengine.models.actor_critic import ActorCritic
from sfengine.models.flow_head import flow_matching_loss

if TYPE_CHECKING:
    from sfengine.demos.dataset import Demo


class DemoSamples(NamedTuple):
    """Every step of some demonstrations as a training sample."""

    obs: dict[str, Tensor]  # key -> [N, ...], the observation before the chunk's first action
    actions: Tensor  # [N, K * action_dim] float32: K actions side by side
    episodes: Tensor  # [N] int64: the demonstration each sample comes from

    def __len__(self) -> int:
        return self.actions.shape[0]

    def select(self, rows: Tensor) -> DemoSamples:
        return DemoSamples({key: o[rows] for key, o in self.obs.items()}, self.actions[rows], self.episodes[rows])

    def of_episodes(self, episodes: Sequence[int]) -> DemoSamples:
        rows = torch.isin(self.episodes, torch.as_tensor(list(episodes), dtype=torch.int64)).nonzero().squeeze(1)
        return self.select(rows)

    def to(self, device: torch.device) -> DemoSamples:
        obs = {key: o.to(device) for key, o in self.obs.items()}
        return DemoSamples(obs, self.actions.to(device), self.episodes.to(device))


def demo_samples(demos: Sequence[Demo], chunk: int) -> DemoSamples:
    """Samples of ``demos`` (each with ``obs``: key -> [T, ...] and ``actions``: [T, action_dim]), chunks of
    ``chunk`` actions. Image keys stay uint8; vector keys become float32."""
    obs: dict[str, list[np.ndarray]] = {key: [] for key in demos[0].obs}
    actions, episodes = [], []
    for index, demo in enumerate(demos):
        steps = len(demo.actions)
        # Row t takes actions t .. t + K - 1; indices past the end repeat the last action.
        rows = np.minimum(np.arange(steps)[:, None] + np.arange(chunk)[None, :], steps - 1)
        actions.append(np.asarray(demo.actions, dtype=np.float32)[rows].reshape(steps, -1))
        episodes.append(np.full(steps, index, dtype=np.int64))
        for key in obs:
            obs[key].append(np.asarray(demo.obs[key]))
    stacked = {key: np.concatenate(parts) for key, parts in obs.items()}
    return DemoSamples(
        {key: torch.from_numpy(a if a.dtype == np.uint8 else a.astype(np.float32)) for key, a in stacked.items()},
        torch.from_numpy(np.concatenate(actions)),
        torch.from_numpy(np.concatenate(episodes)),
    )


def split_by_episode(num_episodes: int, validation_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Training and validation episode indices: a random ``validation_fraction`` of the episodes (at least one
    when the fraction is above 0), held out whole, so validation measures generalisation to unseen episodes."""
    held_out = round(validation_fraction * num_episodes)
    if validation_fraction > 0:
        held_out = max(held_out, 1)
    if held_out >= num_episodes:
        raise ValueError(
            f"--validation_fraction={validation_fraction} holds out {held_out} of {num_episodes} demonstrations and "
            "leaves none to train on: lower it, or give more demonstrations"
        )
    order = torch.randperm(num_episodes, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[held_out:]), sorted(order[:held_out])


def bc_loss(model: ActorCritic, obs: dict[str, Tensor], actions: Tensor, generator: torch.Generator) -> Tensor:
    """Per-sample loss [N] of the actor on demonstrated chunks [N, D]: the Gaussian's negative log-likelihood,
    or the flow head's flow-matching error at a time t ~ U(0, 1) and noise drawn from ``generator``."""
    if model.flow_head is not None:
        t = torch.rand(actions.shape[0], generator=generator, device=actions.device)
        noise = torch.randn(actions.shape, generator=generator, device=actions.device)
        return flow_matching_loss(model.flow_head, model.policy_features(obs), actions, t, noise)
    params, _ = model(obs)
    log_probs, _ = model.log_prob_entropy(params, actions)
    return -log_probs


def train_epoch(
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    samples: DemoSamples,
    batch_size: int,
    generator: torch.Generator,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """One pass over ``samples`` in shuffled minibatches; the mean loss. ``on_step(steps_done, loss)`` after each
    optimiser step (the progress line)."""
    order = torch.randperm(len(samples), generator=generator, device=generator.device)
    total, steps = 0.0, 0
    for rows in order.split(batch_size):
        batch = samples.select(rows)
        loss = bc_loss(model, batch.obs, batch.actions, generator).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total, steps = total + float(loss.detach()) * len(rows), steps + 1
        if on_step is not None:
            on_step(steps, float(loss.detach()))
    return total / len(samples)


@torch.no_grad()
def fit_action_std(model: ActorCritic, samples: DemoSamples, batch_size: int) -> Tensor | None:
    """Set a Gaussian head's state-independent log-std to its maximum-likelihood value given the trained mean:
    the root-mean-square deviation of the demonstrated actions from the mean, per action dimension. Returns the
    std (None for a flow head or a state-dependent std, which learn theirs). Gradient steps move a log-std
    slowly: on 15 LIBERO demonstrations 300 epochs left it at 0.53 against a spread of the actions around the
    mean of about 0.2, and a clone whose mean succeeds then fails with its own samples."""
    if model.flow_head is not None or getattr(model, "log_std", None) is None:
        return None
    squares = torch.zeros_like(model.log_std, dtype=torch.float64)
    for rows in torch.arange(len(samples), device=samples.actions.device).split(batch_size):
        batch = samples.select(rows)
        params, _ = model(batch.obs)
        mean, _ = model._mean_log_std(params)
        squares += (batch.actions - mean).double().pow(2).sum(0)
    std = (squares / len(samples)).sqrt().clamp(np.exp(-5.0), np.exp(2.0)).float()
    model.log_std.copy_(std.log())
    return std


@torch.no_grad()
def validation_loss(model: ActorCritic, samples: DemoSamples, batch_size: int, seed: int) -> float:
    """The mean loss over ``samples``. The flow head's times and noise are drawn from a generator seeded alike at
    every call, so the losses of successive epochs differ by the model alone."""
    generator = torch.Generator(device=samples.actions.device).manual_seed(seed)
    total = 0.0
    for rows in torch.arange(len(samples), device=samples.actions.device).split(batch_size):
        batch = samples.select(rows)
        total += float(bc_loss(model, batch.obs, batch.actions, generator).sum())
    return total / len(samples)
