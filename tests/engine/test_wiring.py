"""The signal graph: every rollout worker talks to its inference worker and only receives its own outputs."""

import multiprocessing

import torch

from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.event_loop import EngineEventLoop
from sfengine.engine.runner import Runner
from sfengine.engine.wiring import build_components, connect_components
from sfengine.env.registry import make_gymnasium_env
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic


def build(num_workers=3, num_inference_workers=2, serial=False):
    cfg = Config()
    cfg.sampler.num_workers, cfg.sampler.num_inference_workers, cfg.sampler.serial_mode = (
        num_workers,
        num_inference_workers,
        serial,
    )
    obs, act = ObsSpec({"obs": (4,)}, {"obs": torch.float32}), ActionSpec(discrete=True, num_actions=2)
    ctx = multiprocessing.get_context("spawn")
    buffers = SharedBuffers.allocate(cfg, obs, act)
    weights = SharedWeights.allocate(ActorCritic(obs, act, cfg.model))
    loop = EngineEventLoop("test_runner_loop", serial_mode=True)
    runner = Runner(loop, cfg, 0)
    c = build_components(cfg, loop, buffers, weights, make_gymnasium_env, obs, act, None, ctx)
    connect_components(runner, c)
    return runner, c


def receivers(obj, signal_name):
    return obj.send_signals_to.get(signal_name, set())


def test_each_worker_requests_from_one_inference_worker_round_robin():
    _, c = build()
    for w, worker in enumerate(c.workers):
        assert receivers(worker, "inference_request") == {c.inference_workers[w % 2].object_id}


def test_policy_outputs_and_released_buffers_go_only_to_their_worker():
    _, c = build()
    for w, worker in enumerate(c.workers):
        inference = c.inference_workers[w % 2]
        assert receivers(inference, f"policy_outputs_{w}") == {worker.object_id}
        assert receivers(c.batcher, f"buffers_released_{w}") == {worker.object_id}


def test_trajectories_flow_to_batcher_then_learner_and_back():
    runner, c = build()
    assert all(receivers(w, "trajectories_ready") == {"batcher"} for w in c.workers)
    assert receivers(c.batcher, "training_batch_ready") == {"learner"}
    assert receivers(c.learner, "batch_released") == {"batcher"}
    assert receivers(c.learner, "report") == {"runner"}
    # Multi-rank: a rank's episodes and its stop requests reach the other ranks through its learner.
    assert receivers(runner, "rank_episodes") == receivers(runner, "stop_requested") == {"learner"}
    stopped = {w.object_id for w in c.workers} | {i.object_id for i in c.inference_workers} | {"learner"}
    assert receivers(runner, "stop") == stopped


def test_multiprocess_mode_gives_every_component_its_own_process():
    _, c = build()
    names = sorted(p.name for p in c.processes)
    assert names == sorted(
        ["rollout_worker_0_process", "rollout_worker_1_process", "rollout_worker_2_process"]
        + ["inference_worker_0_process", "inference_worker_1_process", "learner_process"]
    )
    assert c.batcher.event_loop is not c.learner.event_loop  # the batcher runs a loop of its own (a thread)


def test_with_no_inference_workers_each_rollout_worker_acts_on_its_own_requests():
    _, c = build(num_workers=2, num_inference_workers=0)
    assert not c.inference_workers
    assert sorted(p.name for p in c.processes) == [
        "learner_process",
        "rollout_worker_0_process",
        "rollout_worker_1_process",
    ]
    for w, worker in enumerate(c.workers):
        assert receivers(worker, "inference_request") == {worker.object_id}
        assert worker.policy is not None and worker.policy.seed != c.workers[1 - w].policy.seed
    _, c = build(num_workers=2, num_inference_workers=1)
    assert all(worker.policy is None for worker in c.workers)


def test_serial_mode_puts_everything_on_one_loop():
    runner, c = build(num_workers=2, num_inference_workers=1, serial=True)
    assert not c.processes
    loops = {id(x.event_loop) for x in (*c.workers, *c.inference_workers, c.batcher, c.learner, runner)}
    assert len(loops) == 1
