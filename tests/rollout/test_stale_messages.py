"""A respawned rollout worker reads its predecessor's inbox: answers and releases meant for it are ignored, and one
sent twice is taken once (real worker, real envs and shared buffers, on an in-process loop)."""

from __future__ import annotations

import multiprocessing

import torch

from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.event_loop import EngineEventLoop
from sfengine.engine.messages import BuffersReleased, InferenceRequest, PolicyOutputs
from sfengine.engine.runner import Runner
from sfengine.engine.wiring import build_components, connect_components
from sfengine.env.registry import make_gymnasium_env
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic


def started_worker(lent_before_start: tuple[int, ...] = ()):
    """Rollout worker 0 of a serial-mode CartPole engine, started; ``lent_before_start``: buffers its predecessor
    had handed to the batcher (lent once, not returned)."""
    cfg = Config()
    cfg.sampler.num_workers, cfg.sampler.serial_mode = 1, True
    obs, act = ObsSpec({"obs": (4,)}, {"obs": torch.float32}), ActionSpec(discrete=True, num_actions=2)
    buffers = SharedBuffers.allocate(cfg, obs, act)
    buffers.lends[list(lent_before_start), 0] = 1
    weights = SharedWeights.allocate(ActorCritic(obs, act, cfg.model))
    loop = EngineEventLoop("test_loop", serial_mode=True)
    c = build_components(cfg, loop, buffers, weights, make_gymnasium_env, obs, act, None, multiprocessing)
    connect_components(Runner(loop, cfg, 0), c)
    worker = c.workers[0]
    worker.on_start()
    return worker, buffers


def test_only_the_answer_to_the_request_a_split_waits_for_steps_its_envs():
    worker, buffers = started_worker()
    split = worker.splits[0]
    assert split.request == int(buffers.splits.requests[split.row]) == 1  # the first request of its row
    worker.on_policy_outputs(PolicyOutputs(0, 0))  # an answer to the predecessor's request
    assert split.t == 0
    worker.on_policy_outputs(PolicyOutputs(0, 1))
    assert split.t == 1 and split.request == 2  # stepped, and asked for the next step
    worker.on_policy_outputs(PolicyOutputs(0, 1))  # the same answer again (a request sent twice)
    assert split.t == 1


def test_a_successor_takes_back_only_the_lendings_still_out():
    worker, buffers = started_worker(lent_before_start=(5, 6))
    owned = set(buffers.worker_buffer_ids(0))
    in_use = {int(i) for split in worker.splits for i in split.buffer_ids}
    assert worker.lent == {5, 6} and set(worker.free_ids) == owned - in_use - {5, 6}
    free = len(worker.free_ids)
    worker.on_buffers_released(BuffersReleased((5, 7), (0, 0)))  # releases of lendings before these
    assert len(worker.free_ids) == free
    worker.on_buffers_released(BuffersReleased((5, 6), (1, 1)))
    worker.on_buffers_released(BuffersReleased((5,), (1,)))  # sent twice
    assert worker.lent == set() and sorted(worker.free_ids).count(5) == 1 and len(worker.free_ids) == free + 2


def test_a_split_waiting_for_buffers_asks_nothing_again_when_the_inference_worker_is_respawned():
    worker, buffers = started_worker()
    split = worker.splits[0]
    worker.free_ids.clear()  # every other buffer is with the batcher: the split will wait at the rollout's end
    for _ in range(worker.rollout + 1):
        worker.on_policy_outputs(PolicyOutputs(0, split.request))
    assert split in worker.waiting_splits and split.request == -1  # answered, and no request out
    inbox = worker.event_loop.signal_queue  # serial mode: every component's signals go through this one queue
    inbox.get_many_nowait()  # what was sent so far
    worker.on_inference_respawned(0)
    sent = [args[0] for _, name, args in inbox.get_many_nowait() if name == "inference_request"]
    other = worker.splits[1]
    assert sent == [InferenceRequest(other.row, False, other.request)]  # only the split still waiting for an answer
