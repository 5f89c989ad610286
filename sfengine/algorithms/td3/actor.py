"""TD3's policy: a deterministic action squashed into the box, ``center + half_range * tanh(mu(s))``, acted with
Gaussian exploration noise (``--exploration_noise`` half-ranges, clipped to the box); evaluation and the update use
the noiseless action. No likelihood: the log-probs it reports are 0."""

from __future__ import annotations

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy.residual import ResidualPolicy
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.config import Config
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic


class DeterministicActor(SquashedGaussianActor):
    def __init__(self, obs_spec: ObsSpec, action_spec: ActionSpec, cfg, exploration_noise: float):
        super().__init__(obs_spec, action_spec, cfg)
        self.exploration_noise = exploration_noise

    @classmethod
    def build(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> DeterministicActor:
        return cls(obs_spec, action_spec, cfg.model, cfg.algorithm_options.exploration_noise)

    def action(self, params: Tensor) -> Tensor:
        """The noiseless action (differentiable in the weights)."""
        mean, _ = self._mean_log_std(params)
        return self.action_center + self.action_half_range * torch.tanh(mean)

    def noisy(self, actions: Tensor, std: float, clip: float | None = None) -> Tensor:
        """``actions`` plus Gaussian noise of ``std`` half-ranges (each draw clipped to +-``clip`` half-ranges),
        kept inside the box."""
        noise = torch.randn_like(actions) * std
        if clip is not None:
            noise = noise.clamp(-clip, clip)
        low, high = self.action_center - self.action_half_range, self.action_center + self.action_half_range
        return torch.maximum(torch.minimum(actions + noise * self.action_half_range, high), low)

    def sample(self, params: Tensor) -> tuple[Tensor, Tensor]:
        actions = self.noisy(self.action(params), self.exploration_noise)
        return actions, actions.new_zeros(actions.shape[0])

    def mode(self, params: Tensor) -> tuple[Tensor, Tensor]:
        actions = self.action(params)
        return actions, actions.new_zeros(actions.shape[0])


class ResidualTD3(ResidualPolicy, DeterministicActor):
    """A deterministic correction (``--algo=td3``), acted and smoothed with noise in half-ranges of its own bound."""

    def __init__(self, obs_spec, action_spec, cfg, base, scale, base_action, exploration_noise):
        DeterministicActor.__init__(self, obs_spec, self.residual_spec(action_spec, scale), cfg, exploration_noise)
        self._init_residual(obs_spec, action_spec, cfg, base, scale, base_action)

    @classmethod
    def over(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec, base: ActorCritic) -> ResidualTD3:
        options = cfg.algorithm_options
        args = (options.residual_scale, options.residual_base_action, options.exploration_noise)
        return cls(obs_spec, action_spec, cfg.model, base, *args)

    def action(self, params: Tensor) -> Tensor:
        own, base = self.split(params)
        return self.inside_box(base + DeterministicActor.action(self, own))

    def noisy(self, actions: Tensor, std: float, clip: float | None = None) -> Tensor:
        noise = torch.randn_like(actions) * std
        if clip is not None:
            noise = noise.clamp(-clip, clip)
        return self.inside_box(actions + noise * self.action_half_range)
