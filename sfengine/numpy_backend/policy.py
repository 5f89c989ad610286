"""The inference workers' policy for MLP models, in numpy: the same function as ``ActorCritic.act`` without torch.

At inference batch sizes (4-16 rows) an MLP actor-critic's forward pass costs almost nothing in arithmetic; what it
costs in torch is the dispatcher and ``nn.Module`` calls, microseconds per op and per module. On a light env that
is most of the inference worker's core, which rollout workers and the learner then get (``benchmarks/README.md``,
"MLP policies in numpy").

    obs[keys] --concat (sorted keys)--normalise--actor MLP--policy head--> Gaussian mean, log-std | logits --> sample
                                               +-critic MLP--value head--> x std + mean of the returns --> values

It reads the model's own parameters and buffers through numpy views of their storage, so weights pulled into the
model in place (``SharedWeights.pull``) reach it; ``refresh()`` after a pull recomputes what is derived from them
(the normaliser's scale, the action std, the return statistics). Draws come from a numpy generator: a sample is
the same distribution as the torch model's, and its log-prob is that of the policy that acted, as PPO's ratio
needs. Models with image keys stay on torch (their CNNs are where the cost is, and torch runs them well), and so
do registered models: this is the built-in ``ActorCritic``'s computation, and a subclass may override any part of it.
``numpy_unsupported_reason`` is the one check of what numpy runs, for acting and for the learner's numpy step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from torch import nn

from sfengine.config import Config, ConfigError
from sfengine.models.actor_critic import ActorCritic, CNNEncoder
from sfengine.models.distributions import HALF_LOG_2PI, LOG_STD_RANGE, gaussian_log_prob

TINY = np.finfo(np.float32).tiny  # the smallest positive float32


class PolicyOutputArrays(NamedTuple):
    actions: np.ndarray  # [N] int64 or [N, A] float32
    log_probs: np.ndarray  # [N]
    values: np.ndarray  # [N]


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0.0, x, np.expm1(np.minimum(x, 0.0)))


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


NUMPY_ACTIVATIONS = {nn.Tanh: _tanh, nn.ReLU: _relu, nn.ELU: _elu}


def choose_inference_backend(cfg: Config, model: ActorCritic) -> str:
    """ "numpy" or "torch" for ``--inference_backend``; ConfigError when numpy is asked for and cannot run the model."""
    requested = cfg.sampler.inference_backend
    reason = numpy_unsupported_reason(model)
    if reason is None and cfg.learner.device != "cpu":
        reason = f"inference runs on --device={cfg.learner.device}"
    if requested == "auto":
        return "torch" if reason else "numpy"
    if requested == "numpy" and reason:
        raise ConfigError(f"--inference_backend=numpy cannot run this policy: {reason}; use --inference_backend=auto")
    return requested


def numpy_unsupported_reason(model: ActorCritic) -> str | None:
    """Why the numpy path cannot compute this model, or None if it can: the check that ``NumpyPolicy`` (acting) and
    ``numpy_learner_unsupported_reason`` (the learner's step) share, so a model acts and learns in numpy or in
    neither."""
    if type(model) is not ActorCritic:
        # Numpy computes the built-in model: a subclass's own sample, heads or forward would be skipped, and the
        # acting policy would silently differ from the one the learner trains.
        return f"a registered model ({type(model).__name__}) may compute its own way, which numpy would skip"
    if model.flow_head is not None:
        return "the flow head runs in torch"
    if model.image_keys:
        return f"image observations ({', '.join(model.image_keys)}) need the CNN encoders, which run in torch"
    for encoders in (model.encoders, model.value_encoders or {}):
        for encoder in encoders.values():
            if isinstance(encoder, CNNEncoder):
                return "CNN encoders run in torch"
            for layer in encoder:
                if not isinstance(layer, nn.Linear) and type(layer) not in NUMPY_ACTIVATIONS:
                    return f"its MLP has a {type(layer).__name__} layer"
    if any(p.device.type != "cpu" for p in model.parameters()):
        return "its weights are on a GPU"
    if any(type(layer) is nn.ELU and layer.alpha != 1.0 for layer in model.modules()):
        return "an ELU with alpha other than 1"
    return None


def vector_inputs(
    obs: dict[str, np.ndarray], keys: list[str], mean: np.ndarray | None, scale: np.ndarray | None, clip: float
) -> np.ndarray:
    """The model's vector input, as ``ActorCritic`` builds it: the keys side by side in float32, then normalised
    (``(x - mean) * scale``, clipped to ``[-clip, clip]``) unless ``mean`` is None. A new array."""
    parts = [obs[key] for key in keys]
    x = (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)).astype(np.float32)
    if mean is not None:
        x -= mean
        x *= scale
        np.clip(x, -clip, clip, out=x)
    return x


class _MLP:
    """Linear and activation layers as (weight [out, in] view, bias view, activation) triples."""

    def __init__(self, encoder: nn.Sequential | None, head: nn.Linear):
        self.layers: list[tuple[np.ndarray, np.ndarray, object]] = []
        modules = list(encoder or []) + [head]
        for i, layer in enumerate(modules):
            if isinstance(layer, nn.Linear):
                follows = modules[i + 1] if i + 1 < len(modules) else None
                activation = NUMPY_ACTIVATIONS[type(follows)] if follows is not None else None
                self.layers.append((_view(layer.weight), _view(layer.bias), activation))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for weight, bias, activation in self.layers:
            x = x @ weight.T
            x += bias
            if activation is not None:
                x = activation(x)
        return x


def _view(tensor) -> np.ndarray:
    """A numpy array sharing the tensor's storage: in-place copies into the tensor show through it."""
    return tensor.detach().numpy()


class NumpyPolicy:
    """``ActorCritic.act`` and ``ActorCritic.forward``'s values in numpy, for a CPU model of MLPs over vector keys.

    >>> policy = NumpyPolicy(model, seed=1)      # model: an ActorCritic whose numpy_unsupported_reason is None
    >>> out = policy.act({"obs": obs_np})         # obs_np [N, dim] -> actions [N, A] or [N], log_probs [N], values [N]
    """

    def __init__(self, model: ActorCritic, seed: int):
        if reason := numpy_unsupported_reason(model):
            raise ValueError(f"NumpyPolicy cannot run this model: {reason}")
        self.vector_keys = model.vector_keys
        self.discrete = model.action_spec.discrete
        self.action_dim = 0 if self.discrete else model.action_spec.dim
        self.state_dependent_std = model.state_dependent_std
        normalizer = model.normalizers[model.vector_name] if model.normalizers else None
        self.obs_mean = _view(normalizer.mean) if normalizer is not None else None
        self.obs_var = _view(normalizer.var) if normalizer is not None else None
        self.obs_clip = normalizer.clip if normalizer is not None else math.inf
        self.actor = _MLP(model.encoders[model.vector_name], model.policy_head)
        self.critic = None
        if model.value_head is not None:
            trunk = model.encoders if model.value_encoders is None else model.value_encoders
            self.critic = _MLP(trunk[model.vector_name], model.value_head)
        returns = model.return_normalizer
        self.return_mean = _view(returns.stats.mean) if returns is not None else None
        self.return_var = _view(returns.stats.var) if returns is not None else None
        self.return_min_std = returns.MIN_STD if returns is not None else 0.0
        self.log_std = _view(model.log_std) if hasattr(model, "log_std") else None
        self.rng = np.random.default_rng(seed)
        self.refresh()

    def refresh(self) -> None:
        """Recompute what derives from the weights and statistics: call it after every pull into the model."""
        if self.obs_mean is not None:
            self.obs_scale = (1.0 / np.sqrt(self.obs_var + 1e-8)).astype(np.float32)
        if self.return_mean is not None:
            self.return_std = np.float32(max(math.sqrt(float(self.return_var[0])), self.return_min_std))
        if self.log_std is not None:
            self.clipped_log_std = np.clip(self.log_std, *LOG_STD_RANGE)
            self.std = np.exp(self.clipped_log_std)

    def _inputs(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        scale = None if self.obs_mean is None else self.obs_scale
        return vector_inputs(obs, self.vector_keys, self.obs_mean, scale, self.obs_clip)

    def values(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The critic in return units, [N] float32 (0 for a critic-free model)."""
        return self._values(self._inputs(obs))

    def _values(self, x: np.ndarray) -> np.ndarray:
        if self.critic is None:
            return np.zeros(x.shape[0], np.float32)
        values = self.critic(x)[:, 0]
        if self.return_mean is not None:
            values = values * self.return_std + self.return_mean[0]
        return values

    def act(self, obs: dict[str, np.ndarray], deterministic: bool = False) -> PolicyOutputArrays:
        """A draw from the policy (its mode with ``deterministic``), the draw's log-probs and the values."""
        x = self._inputs(obs)
        params = self.actor(x)
        values = self._values(x)
        if self.discrete:
            log_p = params - params.max(-1, keepdims=True)
            log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
            if deterministic:
                actions = log_p.argmax(-1)
            else:
                # Gumbel-max, as ActorCritic.sample: argmax(log p - log E), E ~ Exp(1). A draw of exactly 0 (about
                # one in 16M in float32) would make -log E infinite and pick its action whatever p is.
                draws = self.rng.standard_exponential(log_p.shape, dtype=np.float32)
                actions = (log_p - np.log(np.maximum(draws, TINY))).argmax(-1)
            log_probs = np.take_along_axis(log_p, actions[:, None], -1)[:, 0]
            return PolicyOutputArrays(actions, log_probs, values)
        if self.state_dependent_std:
            mean, log_std = params[:, : self.action_dim], np.clip(params[:, self.action_dim :], *LOG_STD_RANGE)
            std = np.exp(log_std)
        else:
            mean, log_std, std = params, self.clipped_log_std, self.std
        if deterministic:
            log_probs = np.broadcast_to(-log_std - HALF_LOG_2PI, mean.shape).sum(-1)
            return PolicyOutputArrays(mean, log_probs, values)
        noise = self.rng.standard_normal(mean.shape, dtype=np.float32)
        actions = mean + noise * std
        return PolicyOutputArrays(actions, gaussian_log_prob(noise, log_std), values)
