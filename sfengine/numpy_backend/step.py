"""The learner's minibatch step for MLP policies, in numpy: the same loss, gradients and Adam step as
``PPOTrainer``'s torch step, with the backward pass written out by hand.

An MLP actor-critic over vector observations costs almost nothing in arithmetic at minibatch sizes of 64-512;
in torch its step costs the dispatcher, autograd's graph and the optimiser's per-tensor loops, about 100 ops of
microseconds each. Here the parameters, their gradients and Adam's moments are each one flat float32 array (the
step is a few dozen numpy calls, and Adam and the gradient clip a handful of calls over the whole model). What it
saves: ``benchmarks/README.md``, "The learner in numpy against the learner in torch".

    torch model --begin()--> flat params | moments --step() x epochs x minibatches--> --end()--> torch model

The torch model and optimiser stay the source of truth between training batches: ``begin`` copies the weights
and Adam's state in (the return normaliser may have rescaled the value head, a checkpoint may have been loaded),
``end`` copies them back, so checkpoints, weight publishing and the torch code paths see an ordinary model and an
ordinary ``torch.optim.Adam`` state.

What it runs (``numpy_learner_unsupported_reason`` says why not otherwise): the built-in ``ActorCritic`` with MLP
encoders over vector keys (tanh, ReLU or ELU), a categorical head or a Gaussian with a state-independent log-std,
a separate, shared or no critic, the ``ppo_clip`` surrogate with or without value clipping, on CPU, on one rank
or many (gradients averaged over the ranks as the torch step does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from sfengine.algorithms import algorithm_for
from sfengine.config import Config, ConfigError
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.trainer import StepStats
from sfengine.models.actor_critic import ActorCritic, is_critic_key
from sfengine.models.distributions import HALF_LOG_2PI, LOG_STD_RANGE, gaussian_entropy
from sfengine.numpy_backend.policy import (
    NUMPY_ACTIVATIONS,
    numpy_unsupported_reason,
    vector_inputs,
)

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the torch step uses


def choose_learner_backend(cfg: Config, model: ActorCritic) -> str:
    """ "numpy" or "torch" for ``--learner_backend``; ConfigError when numpy is asked for and cannot train the model."""
    requested = cfg.learner.learner_backend
    reason = numpy_learner_unsupported_reason(cfg, model)
    if requested == "auto":
        return "torch" if reason else "numpy"
    if requested == "numpy" and reason:
        raise ConfigError(f"--learner_backend=numpy cannot train this policy: {reason}; use --learner_backend=auto")
    return requested


def numpy_learner_unsupported_reason(cfg: Config, model: ActorCritic) -> str | None:
    """Why ``NumpyStep`` cannot train this model with this config, or None if it can: what the numpy path cannot
    compute (``numpy_unsupported_reason``, the check acting shares: a registered model among them), and what it
    computes but the step has no gradient for."""
    algorithm = algorithm_for(cfg)
    if algorithm.numpy_learner is None:
        return f"--algo={cfg.learner.algo} trains in torch"
    if cfg.learner.device != "cpu":
        return f"the learner runs on --device={cfg.learner.device}"
    if reason := numpy_unsupported_reason(model):
        return reason
    if reason := algorithm.numpy_learner(cfg):
        return reason
    if model.state_dependent_std:
        return "a state-dependent log-std runs in torch"
    return None


class _Layer(NamedTuple):
    weight: np.ndarray  # [out, in], as nn.Linear keeps it
    bias: np.ndarray
    grad_weight: np.ndarray
    grad_bias: np.ndarray
    activation: type[nn.Module] | None  # nn.Tanh, nn.ReLU or nn.ELU; None for a head


def _activation_grad(activation: type[nn.Module] | None, y: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """The gradient through an activation, from its output ``y``."""
    if activation is nn.Tanh:
        return grad * (1.0 - y * y)
    if activation is nn.ReLU:
        return grad * (y > 0.0)
    if activation is nn.ELU:
        return grad * np.where(y > 0.0, 1.0, y + 1.0)
    return grad


class NumpyStep:
    """One PPO minibatch step of ``PPOTrainer`` on a CPU MLP ``ActorCritic``, in numpy.

    >>> step = NumpyStep(model, optimizer, cfg, group)
    >>> step.begin(learning_rate, train_policy=True)   # before the first minibatch of a training batch
    >>> stats = step(obs, actions, old_log_probs, advantages, (old_values, returns))   # torch tensors in
    >>> step.end()                                      # the weights and Adam's state back into torch
    """

    def __init__(self, model: ActorCritic, optimizer: torch.optim.Adam, cfg: Config, group: LearnerGroup):
        if reason := numpy_learner_unsupported_reason(cfg, model):
            raise ValueError(f"NumpyStep cannot train this model: {reason}")
        self.optimizer, self.cfg, self.group = optimizer, cfg, group
        self.vector_keys = model.vector_keys
        self.discrete = model.action_spec.discrete
        # The flat layout: the policy's parameters first, then the critic's, so a critic warm-up updates one slice.
        named = [(name, p) for name, p in model.named_parameters() if not is_critic_key(name)]
        self.num_policy_params = len(named)
        named += [(name, p) for name, p in model.named_parameters() if is_critic_key(name)]
        self.params = [p for _, p in named]
        sizes = [p.numel() for p in self.params]
        self.policy_size = sum(sizes[: self.num_policy_params])
        total = sum(sizes)
        self.flat, self.grad = np.zeros(total, np.float32), np.zeros(total, np.float32)
        self.exp_avg, self.exp_avg_sq = np.zeros(total, np.float32), np.zeros(total, np.float32)
        self.steps = np.zeros(2, np.int64)  # Adam's step count of the policy slice and of the critic slice
        views, grads, offset = {}, {}, 0
        for (name, param), size in zip(named, sizes):
            views[name] = self.flat[offset : offset + size].reshape(param.shape)
            grads[name] = self.grad[offset : offset + size].reshape(param.shape)
            offset += size

        def layer(name: str, activation: type[nn.Module] | None) -> _Layer:
            weight, bias = f"{name}.weight", f"{name}.bias"
            return _Layer(views[weight], views[bias], grads[weight], grads[bias], activation)

        def layers(encoder: nn.Sequential | None, encoder_name: str, head_name: str) -> list[_Layer]:
            """The encoder's Linear layers, each with the activation that follows it, then the head."""
            modules = list(encoder or [])
            return [
                layer(f"{encoder_name}.{i}", type(modules[i + 1]) if i + 1 < len(modules) else None)
                for i, module in enumerate(modules)
                if isinstance(module, nn.Linear)
            ] + [layer(head_name, None)]

        key = model.vector_name
        self.actor_trunk = layers(model.encoders[key], f"encoders.{key}", "policy_head")
        self.critic_layers: list[_Layer] = []
        self.shared = model.value_head is not None and model.value_encoders is None
        if model.value_head is not None:
            if self.shared:
                self.critic_layers = layers(None, "", "value_head")
            else:
                self.critic_layers = layers(model.value_encoders[key], f"value_encoders.{key}", "value_head")
        self.log_std = views.get("log_std")
        self.grad_log_std = grads.get("log_std")
        self.normalizer = model.normalizers[key] if model.normalizers else None
        self.obs_mean = self.obs_scale = None
        self.train_policy, self.active, self.learning_rate = True, False, 0.0

    # -- torch <-> flat ------------------------------------------------------------------------------------------

    def begin(self, learning_rate: float, train_policy: bool) -> None:
        """Take the torch model's weights and Adam's state, and the settings of this training batch."""
        self.learning_rate, self.train_policy = learning_rate, train_policy
        offset = 0
        for i, param in enumerate(self.params):
            size = param.numel()
            self.flat[offset : offset + size] = param.detach().reshape(-1).numpy()
            state = self.optimizer.state.get(param, {})
            if "exp_avg" in state:
                self.exp_avg[offset : offset + size] = state["exp_avg"].reshape(-1).numpy()
                self.exp_avg_sq[offset : offset + size] = state["exp_avg_sq"].reshape(-1).numpy()
                self.steps[int(i >= self.num_policy_params)] = int(state["step"])
            else:
                self.exp_avg[offset : offset + size] = 0.0
                self.exp_avg_sq[offset : offset + size] = 0.0
                self.steps[int(i >= self.num_policy_params)] = 0
            offset += size
        if self.normalizer is not None:
            self.obs_mean = self.normalizer.mean.numpy().astype(np.float32)
            self.obs_scale = (1.0 / np.sqrt(self.normalizer.var.numpy() + 1e-8)).astype(np.float32)
        self.active = True

    def end(self) -> None:
        """Put the weights and Adam's state back into the torch model and optimiser (a no-op when nothing ran)."""
        if not self.active:
            return
        offset = 0
        with torch.no_grad():
            for i, param in enumerate(self.params):
                size = param.numel()
                param.copy_(torch.from_numpy(self.flat[offset : offset + size]).view_as(param))
                step = int(self.steps[int(i >= self.num_policy_params)])
                if step > 0:
                    state = self.optimizer.state[param]
                    if "exp_avg" not in state:
                        state.update(
                            step=torch.zeros((), dtype=torch.float32),
                            exp_avg=torch.zeros_like(param),
                            exp_avg_sq=torch.zeros_like(param),
                        )
                    state["step"].fill_(step)
                    state["exp_avg"].copy_(torch.from_numpy(self.exp_avg[offset : offset + size]).view_as(param))
                    state["exp_avg_sq"].copy_(torch.from_numpy(self.exp_avg_sq[offset : offset + size]).view_as(param))
                offset += size
        self.active = False

    # -- the step --------------------------------------------------------------------------------------------------

    def _inputs(self, obs: dict[str, torch.Tensor]) -> np.ndarray:
        arrays = {key: obs[key].numpy() for key in self.vector_keys}
        clip = self.normalizer.clip if self.normalizer is not None else math.inf
        return vector_inputs(arrays, self.vector_keys, self.obs_mean, self.obs_scale, clip)

    @staticmethod
    def _forward(layers: list[_Layer], x: np.ndarray) -> list[np.ndarray]:
        """Every layer's input and the last output: [x, h1, ..., out]."""
        outputs = [x]
        for layer in layers:
            y = outputs[-1] @ layer.weight.T
            y += layer.bias
            outputs.append(y if layer.activation is None else NUMPY_ACTIVATIONS[layer.activation](y))
        return outputs

    @staticmethod
    def _backward(
        layers: list[_Layer], outputs: list[np.ndarray], grad_out: np.ndarray, grad_features: np.ndarray | None = None
    ) -> None:
        """Write the layers' gradients from the output's (``outputs``: as ``_forward`` returned them), adding
        ``grad_features`` at the last hidden layer's output (a shared trunk's gradient from the value head)."""
        grad = grad_out
        for i in range(len(layers) - 1, -1, -1):
            layer = layers[i]
            np.matmul(grad.T, outputs[i], out=layer.grad_weight)
            layer.grad_bias[...] = grad.sum(0)
            if i == 0:
                return
            grad = grad @ layer.weight
            if i == len(layers) - 1 and grad_features is not None:
                grad += grad_features
            grad = _activation_grad(layers[i - 1].activation, outputs[i], grad)

    def __call__(
        self,
        obs: dict[str, torch.Tensor],
        actions: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        value_anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> StepStats:
        """``PPOTrainer._step``'s loss and optimiser step on one minibatch; ``value_anchors``: the acting critic's
        values and the value targets in the critic's units (None without a critic)."""
        cfg, ppo = self.cfg.learner, self.cfg.algorithm_options  # PPO's (the one algorithm with a numpy step)
        x = self._inputs(obs)
        n = x.shape[0]
        actor = self._forward(self.actor_trunk, x)
        params = actor[-1]
        advantage = advantages.numpy()
        old_log_prob = old_log_probs.numpy()

        # Log-probs and entropy, and their gradients with respect to the head's outputs (per sample).
        if self.discrete:
            action_index = actions.numpy().astype(np.int64)
            shifted = params - params.max(-1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            p = np.exp(log_p)
            rows = np.arange(n)
            log_probs = log_p[rows, action_index]
            entropy = -(p * log_p).sum(-1)
            mean_entropy = float(entropy.mean())
        else:
            action = actions.numpy()
            log_std = np.clip(self.log_std, *LOG_STD_RANGE)
            inv_std = np.exp(-log_std)
            z = (action - params) * inv_std
            log_probs = -0.5 * np.einsum("ij,ij->i", z, z) - (log_std.sum() + HALF_LOG_2PI * log_std.size)
            mean_entropy = float(gaussian_entropy(log_std))

        # The clipped surrogate: a sample's gradient flows where the unclipped term is the smaller, or the ratio is
        # within the range (the clamp passes it there); elsewhere it is cut off.
        log_ratio = log_probs - old_log_prob
        ratio = np.exp(log_ratio)
        low, high = 1.0 - ppo.ppo_clip_ratio, 1.0 + ppo.ppo_clip_ratio
        unclipped, clipped = ratio * advantage, np.clip(ratio, low, high) * advantage
        policy_loss = -float(np.minimum(unclipped, clipped).mean())
        live = (unclipped < clipped) | ((ratio >= low) & (ratio <= high))
        grad_log_probs = np.where(live, -advantage * ratio / n, 0.0).astype(np.float32)  # d loss / d log-prob

        if self.discrete:
            grad_params = -grad_log_probs[:, None] * p
            grad_params[rows, action_index] += grad_log_probs
            # d(-c * mean H)/d logits = c / N * p * (log p + H)
            grad_params += (cfg.entropy_coeff / n) * p * (log_p + entropy[:, None])
        else:
            grad_params = grad_log_probs[:, None] * z * inv_std
            in_range = (self.log_std >= LOG_STD_RANGE[0]) & (self.log_std <= LOG_STD_RANGE[1])
            grad_log_std = grad_log_probs @ (z * z - 1.0) - cfg.entropy_coeff
            self.grad_log_std[...] = np.where(in_range, grad_log_std, 0.0)

        value_loss = 0.0
        if value_anchors is not None:
            features = actor[-2] if self.shared else None
            critic = self._forward(self.critic_layers, features if self.shared else x)
            values = critic[-1][:, 0]
            old_values, targets = (t.numpy() for t in value_anchors)
            errors = values - targets
            squared = errors * errors
            grad_values = errors
            if ppo.ppo_clip_value:
                moved = values - old_values
                clipped_errors = old_values + np.clip(moved, -ppo.ppo_clip_value, ppo.ppo_clip_value) - targets
                clipped_squared = clipped_errors * clipped_errors
                # The larger error wins; the clipped one passes a gradient only where the clamp did not bite.
                use_clipped = clipped_squared > squared
                inside = np.abs(moved) <= ppo.ppo_clip_value
                grad_values = np.where(use_clipped, np.where(inside, clipped_errors, 0.0), errors)
                squared = np.maximum(squared, clipped_squared)
            value_loss = 0.5 * float(squared.mean())
            grad_values = (grad_values * (ppo.value_loss_coeff / n)).astype(np.float32)[:, None]

        # Backward. A shared trunk gets the value head's gradient too; in a critic warm-up the policy gets none (its
        # slice of the gradient stays 0 and Adam leaves it alone).
        grad_features = None
        if value_anchors is not None:
            self._backward(self.critic_layers, critic, grad_values)
            if self.shared:
                grad_features = grad_values @ self.critic_layers[-1].weight
        if self.train_policy:
            self._backward(self.actor_trunk, actor, grad_params, grad_features)

        loss = policy_loss + ppo.value_loss_coeff * value_loss - cfg.entropy_coeff * mean_entropy
        grad_norm, finite = self._apply_gradients()
        diagnostics = {
            "clip_fraction": float(((ratio < low) | (ratio > high)).mean()),
            "dead_grad_fraction": float((grad_log_probs == 0.0).mean()),
            "ess": float(
                ratio.astype(np.float64).sum() ** 2 / max(n * float((ratio.astype(np.float64) ** 2).sum()), 1e-300)
            ),
            "approx_kl": float(((ratio - 1.0) - log_ratio).mean()),
            "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
        }
        extra = {"nonfinite_steps": float(not finite)}
        return StepStats(loss, policy_loss, value_loss, mean_entropy, grad_norm, diagnostics, extra)

    def _apply_gradients(self) -> tuple[float, bool]:
        """Average over the ranks, clip the norm as ``clip_grad_norm_`` does, and take Adam's step on the slices
        that train; a non-finite gradient skips the step (as the torch step does)."""
        if self.group.distributed:
            self.group.sum(torch.from_numpy(self.grad))
            self.grad /= self.group.ranks.world_size
        norm = math.sqrt(float(np.dot(self.grad, self.grad)))
        if not math.isfinite(norm):
            return 0.0, False
        max_norm = self.cfg.learner.max_grad_norm
        if max_norm > 0:
            self.grad *= np.float32(min(max_norm / (norm + 1e-6), 1.0))
        start = 0 if self.train_policy else self.policy_size
        self._adam(slice(start, self.policy_size), 0)
        self._adam(slice(self.policy_size, self.flat.size), 1)
        return norm, True

    def _adam(self, part: slice, counter: int) -> None:
        """``torch.optim.Adam``'s update on ``flat[part]``, whose parameters share one step count."""
        if part.start >= part.stop:
            return
        beta1, beta2 = ADAM_BETAS
        self.steps[counter] += 1
        step = int(self.steps[counter])
        grad, exp_avg, exp_avg_sq = self.grad[part], self.exp_avg[part], self.exp_avg_sq[part]
        exp_avg += (1.0 - beta1) * (grad - exp_avg)
        exp_avg_sq *= beta2
        exp_avg_sq += (1.0 - beta2) * grad * grad
        bias_correction1 = 1.0 - beta1**step
        bias_correction2 = 1.0 - beta2**step
        denom = np.sqrt(exp_avg_sq) * np.float32(1.0 / math.sqrt(bias_correction2))
        denom += self.cfg.learner.adam_eps
        self.flat[part] -= np.float32(self.learning_rate / bias_correction1) * exp_avg / denom
