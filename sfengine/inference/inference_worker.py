"""Inference worker: one forward pass for every request that arrived together.

    InferenceRequest(split_row) x k --> PolicyActor.act(the k rows) --> policy_outputs_<worker>(split, request number)

Requests carry only the split row; buffer ids and the step come from the shared SplitState, and the actor writes
its outputs at [buffer, t] (see sfengine.inference.policy_actor). With ``--num_inference_workers=0`` there is no
inference worker: each rollout worker acts for its own splits with a PolicyActor of its own.
"""

from __future__ import annotations

from signal_slot.signal_slot import Timer, signal

from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.event_loop import Component, stop_own_loop
from sfengine.engine.messages import InferenceRequest, PolicyOutputs
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.inference.policy_actor import PolicyActor
from sfengine.tasks.seeding import inference_seed


def policy_outputs_signal(worker: int) -> str:
    """Each rollout worker listens on its own signal, so it only receives its own splits."""
    return f"policy_outputs_{worker}"


def connect_inference(workers: list, inference_workers: list) -> None:
    """Rollout worker w asks inference worker w % len(inference_workers) and hears back on its own signal; with no
    inference workers (--num_inference_workers=0) each rollout worker's requests come back to itself."""
    for w, worker in enumerate(workers):
        if not inference_workers:
            worker.inference_request.connect(worker.on_own_request)
            continue
        inference = inference_workers[w % len(inference_workers)]
        worker.inference_request.connect(inference.on_inference_request)
        inference.connect(policy_outputs_signal(w), worker.on_policy_outputs)


class InferenceWorker(Component):
    def __init__(
        self,
        event_loop,
        index: int,
        cfg: Config,
        buffers: SharedBuffers,
        weights: SharedWeights,
        obs_spec: ObsSpec,
        action_spec: ActionSpec,
        deterministic: bool = False,
    ):
        super().__init__(event_loop, f"inference_worker_{index}")
        self.index, self.cfg = index, cfg
        seed = inference_seed(cfg.env.seed, index)
        self.actor = PolicyActor(cfg, buffers, weights, obs_spec, action_spec, seed, deterministic)
        self.pending: list[InferenceRequest] = []
        self.stopped = False

    @signal
    def report(self): ...

    def on_start(self) -> None:
        set_cpu_threads(1)
        self.actor.start()
        self.splits_per_worker = self.cfg.sampler.worker_num_splits
        self.event_loop.after_signals.append(self._run_pending)
        self.report_timer = Timer(self.event_loop, 1.0)
        self.report_timer.timeout.connect(self._send_report)
        self._send_report()  # the first report: start-up is over, the runner's hang watch begins

    def on_inference_request(self, request: InferenceRequest) -> None:
        self.pending.append(request)

    def _run_pending(self) -> None:
        if not self.pending or self.stopped:
            return
        requests, self.pending = self.pending, []
        self.actor.act([r.split_row for r in requests], [r.split_row for r in requests if r.needs_final_values])
        ready_by_worker: dict[int, list[tuple[PolicyOutputs]]] = {}
        for request in requests:
            worker, split = divmod(request.split_row, self.splits_per_worker)
            ready_by_worker.setdefault(worker, []).append((PolicyOutputs(split, request.request),))
        for worker, splits_ready in ready_by_worker.items():
            self.emit_many(policy_outputs_signal(worker), splits_ready)

    def _send_report(self) -> None:
        self.report.emit(self.actor.take_report(self.index))

    def on_stop(self) -> None:
        self.stopped = True
        stop_own_loop(self)
