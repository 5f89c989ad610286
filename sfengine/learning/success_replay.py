"""Self-imitation: the run's own successful episodes, replayed for a behaviour-cloning loss beside the policy
surrogate (``--self_imitation_coeff``).

A clone fine-tuned by RLOO sees each success once, in the batch it arrived in, where the clip of the policy ratio
caps how much it may teach. Behavioural cloning gains steeply from more successful episodes (a LIBERO-Object clone
from 15 demonstrations a task succeeds more than twice as often as one from 5), and fine-tuning finds new ones
all the time: the replay keeps them, and every minibatch step also lowers their actions' negative
log-likelihood::

    group batch --(episodes with outcome 1)--> SuccessReplay (ring of the latest --self_imitation_steps steps)
    minibatch step: loss = policy surrogate + coeff * mean(-log pi(a | s)) over a random minibatch of the replay
"""

from __future__ import annotations

import torch
from torch import Tensor


class SuccessReplay:
    """The latest ``capacity`` steps of successful episodes: observations (key -> [capacity, ...]) and the actions
    taken ([capacity, D]), a ring that overwrites its oldest steps. Allocated at the first ``add``."""

    def __init__(self, capacity: int, seed: int = 0):
        self.capacity = capacity
        self.obs: dict[str, Tensor] = {}
        self.actions: Tensor | None = None
        self.size = 0  # steps held
        self.next = 0  # where the next step goes
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: dict[str, Tensor], actions: Tensor) -> None:
        """Keep steps ([N, ...] per key, [N, D] actions); past ``capacity``, the oldest are overwritten."""
        count = actions.shape[0]
        if count == 0:
            return
        if self.actions is None:
            self.obs = {key: o.new_empty((self.capacity, *o.shape[1:])) for key, o in obs.items()}
            self.actions = actions.new_empty((self.capacity, *actions.shape[1:]))
        if count > self.capacity:  # only the latest fit
            obs, actions, count = (
                {key: o[-self.capacity :] for key, o in obs.items()},
                actions[-self.capacity :],
                self.capacity,
            )
        rows = (self.next + torch.arange(count)) % self.capacity
        for key, o in obs.items():
            self.obs[key][rows] = o
        self.actions[rows] = actions
        self.next = (self.next + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    def sample(self, count: int) -> tuple[dict[str, Tensor], Tensor]:
        """``count`` steps drawn uniformly, with replacement: observations and actions."""
        rows = torch.randint(self.size, (count,), generator=self.generator)
        return {key: o[rows] for key, o in self.obs.items()}, self.actions[rows]
