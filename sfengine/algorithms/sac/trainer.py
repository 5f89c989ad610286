"""SAC's update on the off-policy base (``sfengine.algorithms.offpolicy.trainer``): the critics learn the soft
value of the next observation, the actor the critics' mean Q less the entropy's price, the temperature holds the
target entropy.

    target   V(s') = min_{M of E} Q'(s', a') - alpha log pi(a'|s'),  a' ~ pi(s')
    actor    alpha log pi(a|s) - mean_e Q_e(s, a),  a ~ pi(s) reparameterised
    alpha    -log alpha (log pi(a|s) + target entropy)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy.critics import subset_min
from sfengine.algorithms.offpolicy.replay import NStep
from sfengine.algorithms.offpolicy.trainer import OffPolicyTrainer
from sfengine.config import Config
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.trainer import adam, load_optimizer_state

from . import default_target_entropy
from .actor import SquashedGaussianActor


class SACTrainer(OffPolicyTrainer):
    def __init__(self, model: SquashedGaussianActor, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        options = self.options
        self.log_alpha = torch.tensor(math.log(options.init_temperature), device=self.device, requires_grad=True)
        self.alpha_optimizer = adam([self.log_alpha], options.critic_learning_rate, cfg)
        scale = options.residual_scale if options.residual_over else 1.0
        self.target_entropy = options.target_entropy or default_target_entropy(model.action_spec.dim, scale)

    def target_value(self, next_obs: dict[str, Tensor], next_features: Tensor) -> Tensor:
        next_actions, next_log_probs = self.model.sample(self.model.policy_params(next_obs, next_features))
        next_q = self.target_critics(next_features, self.model.unit_actions(next_actions))
        return subset_min(next_q, self.options.critic_subset, self.generator) - self.alpha * next_log_probs

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    def actor_step(self, b: NStep, features: Tensor) -> dict[str, Tensor]:
        params = self.model.policy_params(b.obs, features)
        actions, log_probs = self.model.sample(params)
        q = self.actor_q(features, actions)
        extra, stats = self.actor_terms(b, params, actions, q)
        loss = (self.alpha * log_probs - q).mean() + extra
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self.apply_gradients_on_device()[0]
        if self.options.learn_temperature:
            alpha_loss = -(self.log_alpha * (log_probs.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            if self.group.distributed:
                self.log_alpha.grad.copy_(self.group.sum(self.log_alpha.grad.clone()) / self.group.ranks.world_size)
            self.alpha_optimizer.step()
        return stats | {
            "actor_loss": loss.detach(),
            "entropy": -log_probs.detach().mean(),
            "grad_norm": grad_norm,
        }

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [*super().optimizers(), self.alpha_optimizer]

    def round_stats(self) -> dict[str, float]:
        return {"temperature": float(self.alpha)}

    def extra_state(self) -> dict:
        return {"log_alpha": self.log_alpha.detach().cpu(), "alpha_optimizer": self.alpha_optimizer.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        load_optimizer_state(self.alpha_optimizer, state["alpha_optimizer"])
