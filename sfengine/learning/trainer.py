"""What every algorithm's trainer shares: the optimiser, the learning-rate schedule, the gradient step (averaged
over the ranks, clipped, skipped when not finite) and the state a checkpoint keeps beside the model.

An algorithm's trainer subclasses ``Trainer`` and writes ``train``: one update on a training batch, returning
its statistics (losses, diagnostics) for the status line and TensorBoard::

    class MyTrainer(Trainer):
        def train(self, batch, learner_version, env_steps):
            self.set_learning_rate(env_steps)
            loss = ...                       # from self.model and the batch
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = self.apply_gradients()
            return {"loss": float(loss.detach()), "grad_norm": grad_norm}

The learner worker builds it once (``Algorithm.trainer(model, cfg, group)``), calls ``train`` per batch, and
saves ``state_dict()`` under the algorithm's name in each checkpoint.

A trainer whose minibatch step has more than one implementation takes it from a backend with one interface
(``begin``, the step, ``end``; ``StepStats`` back): ``TorchStep`` here, ``sfengine.numpy_backend.step.NumpyStep``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from sfengine.config import Config
from sfengine.engine.distributed import LearnerGroup, RankInfo
from sfengine.models.actor_critic import ActorCritic


class Trainer:
    # A policy published beside the model for the acting side (FlowSAR's reference); None for most algorithms.
    reference: ActorCritic | None = None
    # Called after every gradient step (the learner worker's, for its hang watch); a trainer built alone has none.
    heartbeat: Callable[[], None] | None = None

    def __init__(self, model: ActorCritic, cfg: Config, group: LearnerGroup | None = None):
        self.model, self.cfg = model, cfg
        self.group = group or LearnerGroup(RankInfo(), torch.device("cpu"))  # the ranks, in a multi-rank run
        self.optimizer = adam(model.parameters(), cfg.learner.learning_rate, cfg)
        self.sums: dict[str, float] = {}  # the current update's per-step sums (apply_gradients counts skips here)

    def train(self, batch, learner_version: int, env_steps: int) -> dict[str, float]:
        """One update on ``batch`` (what the algorithm's batcher fills); the update's statistics."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What a checkpoint keeps beside the model and the optimiser (a reference policy, counters)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def learning_rate(self, env_steps: int) -> float:
        lr = self.cfg.learner.learning_rate
        if self.cfg.learner.lr_schedule == "linear":
            lr *= max(0.0, 1.0 - env_steps / self.cfg.run.train_for_env_steps)
        return lr

    def set_learning_rate(self, env_steps: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(env_steps)

    def apply_gradients(self) -> float:
        """Average the gradients over the ranks, clip them and step; the gradient norm before the clip. A step
        whose gradient is not finite (a NaN or infinite loss: say, a NaN observation or reward from the env) is
        skipped and counted in ``nonfinite_steps``, so one bad sample cannot turn every weight into NaN. Every rank
        sees the same averaged norm, so all skip together."""
        norm, skipped = torch.stack(self.apply_gradients_on_device()).tolist()  # one read-back
        self.sums["nonfinite_steps"] = self.sums.get("nonfinite_steps", 0.0) + skipped
        return norm

    def apply_gradients_on_device(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``apply_gradients`` with nothing read back from the model's device (a trainer that takes many steps a
        round reads its statistics once): the norm (0 for a skipped step) and 1 for a skipped step, as tensors."""
        self.group.average_gradients(self.model)
        # The optimiser's own list: walking the module tree for it every minibatch is a visible cost for a small MLP.
        # Parameters without a gradient (None) are skipped by the clip.
        params = self.optimizer.param_groups[0]["params"]
        result = clip_and_step(self.optimizer, params, self.cfg.learner.max_grad_norm)
        if self.heartbeat is not None:
            self.heartbeat()
        return result


def clip_and_step(optimizer: torch.optim.Optimizer, params, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradients of ``params`` to the norm ``max_norm`` (0: no clip) and step ``optimizer`` (one of
    ``adam``'s) unless their norm is not finite, without waiting for the device: the fused optimiser reads the
    verdict there (its ``found_inf``, as under a gradient scaler) and leaves the weights, moments and step count
    as they were (on a GPU a read-back waits for every kernel launched before it). The norm before the clip (0 for
    a skipped step) and 1 for a skipped step, as 0-dim float32 tensors on the gradients' device."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf).float()
    skipped = (~torch.isfinite(norm)).float()
    optimizer.found_inf = skipped
    optimizer.step()
    return torch.where(skipped > 0, torch.zeros_like(norm), norm), skipped


def adam(params, rate: float, cfg: Config) -> torch.optim.Adam:
    """An Adam optimiser of the run: --adam_eps, and the fused implementation (one kernel for every parameter: on
    the CPU a critic ensemble's step takes a fifth of the time of the loop over its tensors)."""
    return torch.optim.Adam(params, lr=rate, eps=cfg.learner.adam_eps, fused=True)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Take the moments and step counts of a checkpoint's optimiser; keep this run's settings (rate, eps, betas,
    implementation), which ``load_state_dict`` alone would replace with the saved run's: a resumed run learns as
    its command says."""
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, settings, strict=True):
        group.update(own)


class StepStats(NamedTuple):
    """What ``PPOTrainer`` sums over the minibatch steps of an update, from either backend's step."""

    loss: float
    policy_loss: float
    value_loss: float
    entropy: float
    grad_norm: float  # 0.0 for a skipped (non-finite) step
    diagnostics: dict[str, float]
    extra: dict[str, float]  # further sums: nonfinite_steps, kl_to_reference

    def sums(self) -> dict[str, float]:
        values = {name: getattr(self, name) for name in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm")}
        return {**values, **self.extra}


class TorchStep:
    """The torch backend with ``NumpyStep``'s interface: ``step_fn`` takes the step on the torch model itself, so
    there is nothing to take at ``begin`` or give back at ``end``."""

    active = True

    def __init__(self, step_fn: Callable[..., StepStats]):
        self.step_fn = step_fn

    def begin(self, learning_rate: float, train_policy: bool) -> None:
        pass

    def __call__(self, *minibatch) -> StepStats:
        return self.step_fn(*minibatch)

    def end(self) -> None:
        pass
