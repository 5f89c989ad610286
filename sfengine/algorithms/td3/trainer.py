"""TD3's update on the off-policy base: the critics learn the value of the target actor's smoothed action, the
actor the critics' mean Q of its own action, every ``--actor_delay`` critic steps (2), with its target following.

    target   V(s') = min_{M of E} Q'(s', clip(mu'(s') + clip(eps, -c, c)))     eps ~ N(0, --target_noise)
    actor    -mean_e Q_e(s, mu(s))
"""

from __future__ import annotations

import copy

from torch import Tensor

from sfengine.algorithms.offpolicy.critics import soft_update_, subset_min
from sfengine.algorithms.offpolicy.replay import NStep
from sfengine.algorithms.offpolicy.trainer import OffPolicyTrainer
from sfengine.config import Config
from sfengine.engine.distributed import LearnerGroup

from .actor import DeterministicActor


class TD3Trainer(OffPolicyTrainer):
    def __init__(self, model: DeterministicActor, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        self.target_actor = copy.deepcopy(model).requires_grad_(False)

    def target_value(self, next_obs: dict[str, Tensor], next_features: Tensor) -> Tensor:
        options = self.options
        target_actions = self.target_actor.action(self.target_actor.policy_params(next_obs))
        smoothed = self.target_actor.noisy(target_actions, options.target_noise, options.target_noise_clip)
        next_q = self.target_critics(next_features, self.model.unit_actions(smoothed))
        return subset_min(next_q, options.critic_subset, self.generator)

    def actor_step(self, b: NStep) -> dict[str, float]:
        params = self.model.policy_params(b.obs)
        actions = self.model.action(params)
        q = self.actor_q(b.obs, actions)
        extra, stats = self.actor_terms(b, params, actions, q)
        loss = -q.mean() + extra
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return stats | {"actor_loss": float(loss.detach()), "grad_norm": self.apply_gradients()}

    def after_actor_step(self) -> None:
        soft_update_(self.target_actor, self.model, self.options.tau)

    def extra_state(self) -> dict:
        return {"target_actor": {name: t.detach().cpu() for name, t in self.target_actor.state_dict().items()}}

    def load_extra_state(self, state: dict) -> None:
        self.target_actor.load_state_dict(state["target_actor"])
