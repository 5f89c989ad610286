"""The policy as the engine acts with it: outputs for rows of the split table, written into shared memory.

    rows (worker * num_splits + split) --> obs[buffer_ids, t] of each row's envs --> policy --> actions, log-probs,
    values, policy version (and FlowSAR's annotations) at [buffer_ids, t]; V(final obs) for rows with truncations

An inference worker owns one and serves every rollout worker it is connected to; with ``--num_inference_workers=0``
each rollout worker owns one and acts for its own splits, with no inference process (see RolloutWorker). Before
each batch the actor checks the shared policy version and pulls new weights when the learner has published some.

The policy runs in numpy (``NumpyPolicy``) where it is MLPs over vector observations on CPU, and in torch
otherwise (``--inference_backend``): at inference batch sizes torch's per-op overhead, not arithmetic, is the cost.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from sfengine.algorithms import algorithm_for
from sfengine.config import Config
from sfengine.engine.buffers import ANNOTATION_FIELDS, POLICY_FIELDS, SharedBuffers, SharedWeights
from sfengine.engine.distributed import rank_device
from sfengine.engine.messages import InferenceReport
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.policy import NumpyPolicy, choose_inference_backend
from sfengine.tasks.seeding import acting_worker_seed


def own_policy(
    cfg: Config,
    buffers: SharedBuffers,
    weights: SharedWeights,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    worker: int,
    deterministic: bool = False,
) -> PolicyActor | None:
    """The policy rollout worker ``worker`` acts with itself under --num_inference_workers=0; None otherwise."""
    if cfg.sampler.num_inference_workers:
        return None
    seed = acting_worker_seed(cfg.env.seed, worker)
    return PolicyActor(cfg, buffers, weights, obs_spec, action_spec, seed, deterministic)


class PolicyActor:
    """Acts for rows of the split table. Built in the parent and pickled to its process; ``start`` builds the
    model there. ``deterministic``: the distribution's mode instead of a sample (evaluation)."""

    def __init__(
        self,
        cfg: Config,
        buffers: SharedBuffers,
        weights: SharedWeights,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        seed: int,
        deterministic: bool = False,
    ):
        self.cfg, self.buffers, self.weights = cfg, buffers, weights
        self.obs_spec, self.action_spec = obs_spec, action_spec
        self.seed, self.deterministic = seed, deterministic

    def start(self) -> None:
        self.device = rank_device(self.cfg.learner.device)
        self.model = ActorCritic.for_config(self.cfg, self.obs_spec, self.action_spec).to(self.device)
        self.model.for_inference(getattr(torch, self.cfg.sampler.inference_dtype)).eval()
        # FlowSAR: the reference policy, pulled with the policy, self-annotates every step the policy acts.
        self.reference = None
        self.annotate = algorithm_for(self.cfg).annotate
        if self.annotate is not None and self.weights.reference_tensors is not None and not self.deterministic:
            self.reference = ActorCritic.for_config(self.cfg, self.obs_spec, self.action_spec).to(self.device).eval()
        self.version = self.weights.pull(self.model, self.reference)
        self.numpy_policy = None
        if choose_inference_backend(self.cfg, self.model) == "numpy":
            self.numpy_policy = NumpyPolicy(self.model, seed=self.seed)
        traj = self.buffers.trajectories
        self.entries_per_buffer = self.cfg.sampler.rollout + 1
        self.flat_obs = {key: t.flatten(0, 1) for key, t in traj.obs.items()}
        # The per-batch bookkeeping goes through numpy views of the shared tensors: an index or a write there skips
        # torch's dispatcher, and a batch does a dozen of them.
        self.flat_outputs_np = {name: getattr(traj, name).flatten(0, 1).numpy() for name in POLICY_FIELDS}
        self.flat_obs_np = {key: t.numpy() for key, t in self.flat_obs.items()}
        self.flat_annotations_np = {name: getattr(traj, name).flatten(0, 1).numpy() for name in ANNOTATION_FIELDS}
        self.split_ids_np = self.buffers.splits.buffer_ids.numpy()
        self.split_step_np = self.buffers.splits.step.numpy()
        self.published_version_np = self.weights.version.numpy()
        self.busy_sec, self.requests, self.batches = 0.0, 0, 0
        self.window_start = time.perf_counter()

    def act(self, rows: list[int], truncated_rows: list[int]) -> None:
        """Write the policy's outputs for the current step of every row in ``rows``, and V(final obs) for the
        rows in ``truncated_rows`` (episodes cut by a time limit at the step before)."""
        started = time.perf_counter()
        if self.published_version_np[0] != self.version:
            self.version = self.weights.pull(self.model, self.reference)
            if self.numpy_policy is not None:
                self.numpy_policy.refresh()
        # Entry (buffer, t) of the trajectory storage, flattened: one gather and one write per field.
        flat_np = (self.split_ids_np[rows] * self.entries_per_buffer + self.split_step_np[rows][:, None]).ravel()
        if self.numpy_policy is not None:
            self._act_numpy(flat_np, truncated_rows)
        else:
            self._act_torch(flat_np, truncated_rows)
        self.flat_outputs_np["versions"][flat_np] = self.version
        self.busy_sec += time.perf_counter() - started
        self.requests += len(rows)
        self.batches += 1

    def _act_torch(self, flat_np: np.ndarray, truncated_rows: list[int]) -> None:
        flat, out_fields, splits = torch.from_numpy(flat_np), self.flat_outputs_np, self.buffers.splits
        with torch.inference_mode():
            obs = {key: t.index_select(0, flat).to(self.device) for key, t in self.flat_obs.items()}
            out = self.model.act(obs, self.deterministic)
            out_fields["actions"][flat_np] = out.actions.cpu().numpy()
            out_fields["log_probs"][flat_np] = out.log_probs.cpu().numpy()
            out_fields["values"][flat_np] = out.values.cpu().numpy()
            if self.reference is not None:
                annotation = self.annotate(self.cfg, self.reference, obs, out.actions)
                for name, values in zip(ANNOTATION_FIELDS, annotation):
                    self.flat_annotations_np[name][flat_np] = values.cpu().numpy()
            if truncated_rows:
                # Rare (episode ends by time limit): value the final observations of those splits' envs.
                final = {key: t[truncated_rows].flatten(0, 1).to(self.device) for key, t in splits.final_obs.items()}
                _, final_values = self.model(final)
                splits.final_values[truncated_rows] = final_values.cpu().view(len(truncated_rows), -1)

    def _act_numpy(self, flat_np: np.ndarray, truncated_rows: list[int]) -> None:
        out_fields, splits = self.flat_outputs_np, self.buffers.splits
        out = self.numpy_policy.act({key: a[flat_np] for key, a in self.flat_obs_np.items()}, self.deterministic)
        out_fields["actions"][flat_np] = out.actions
        out_fields["log_probs"][flat_np] = out.log_probs
        out_fields["values"][flat_np] = out.values
        if truncated_rows:
            final = {key: t[truncated_rows].flatten(0, 1).numpy() for key, t in splits.final_obs.items()}
            splits.final_values[truncated_rows] = torch.from_numpy(self.numpy_policy.values(final)).view(
                len(truncated_rows), -1
            )

    def take_report(self, index: int) -> InferenceReport:
        """The busy time, requests and forward passes since the last report (the status line's inference share)."""
        now = time.perf_counter()
        report = InferenceReport(index, self.busy_sec, now - self.window_start, self.requests, self.batches)
        self.busy_sec, self.requests, self.batches = 0.0, 0, 0
        self.window_start = now
        return report
