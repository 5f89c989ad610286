"""Building a run and wiring it: every component built (``build_components``), every signal connected in one place
(``connect_components``: reading it tells the whole data flow), and ``run``, which trains until a stop.

    RolloutWorker --InferenceRequest--> InferenceWorker --policy_outputs--> RolloutWorker
    RolloutWorker --TrajectoriesReady--> batcher (the algorithm's) --training_batch_ready--> LearnerWorker
    LearnerWorker --batch_released--> batcher --buffers_released_<w>--> RolloutWorker
    LearnerWorker --policy_updated--> RolloutWorker;  every component --report--> Runner"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

from sfengine.algorithms import Algorithm, algorithm_for
from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights
from sfengine.engine.distributed import RankInfo
from sfengine.engine.event_loop import Component, EngineEventLoop, EngineProcess
from sfengine.engine.fork_server import component_context
from sfengine.engine.hang_watch import HangWatch
from sfengine.engine.lifecycle import (
    component_loops,
    run_until_stopped,
)
from sfengine.engine.respawn import Respawner
from sfengine.engine.runner import Runner
from sfengine.env.multitask import TaskInfo, selected_init_states
from sfengine.env.registry import EnvFactory
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.evaluation.episode_queue import SINGLE_TASK
from sfengine.evaluation.training_evaluator import TrainingEvaluator
from sfengine.inference.inference_worker import InferenceWorker, connect_inference
from sfengine.inference.policy_actor import own_policy
from sfengine.learning.batcher import buffers_released_signal
from sfengine.learning.learner_worker import LearnerWorker
from sfengine.models.actor_critic import ActorCritic
from sfengine.reporting.progress import end_summary
from sfengine.reporting.reporter import json_text
from sfengine.tasks.scheduler import TaskSchedule, shard_pairs
from sfengine.tasks.seeding import component_seed, task_sequence_seed
from sfengine.tasks.sequence import GROUP_SEEDS_PER_RANK, SharedTaskSequence

log = logging.getLogger(__name__)


@dataclass
class Components:
    workers: list
    inference_workers: list
    batcher: Component  # the algorithm's: trajectories or whole groups of episodes (Algorithm.make_batcher)
    learner: LearnerWorker
    processes: list[EngineProcess]
    evaluator: TrainingEvaluator | None = None  # --eval_every_env_steps, rank 0 only
    grouped: bool = False  # the batcher gathers whole groups of episodes


def connect_components(runner: Runner, c: Components) -> None:
    """The whole data flow of the engine, in one place."""
    connect_inference(c.workers, c.inference_workers)
    for w, worker in enumerate(c.workers):
        worker.trajectories_ready.connect(c.batcher.on_trajectories_ready)
        c.batcher.connect(buffers_released_signal(w), worker.on_buffers_released)
        c.learner.policy_updated.connect(worker.on_policy_updated)
        worker.report.connect(runner.on_worker_report)
        worker.failed.connect(runner.on_component_failed)
    for inference in c.inference_workers:
        inference.report.connect(runner.on_inference_report)
    c.batcher.training_batch_ready.connect(c.learner.on_training_batch)
    c.learner.batch_released.connect(c.batcher.on_batch_released)
    c.batcher.failed.connect(runner.on_component_failed)
    c.learner.report.connect(runner.on_learner_report)
    runner.rank_episodes.connect(c.learner.on_rank_episodes)
    runner.stop_requested.connect(c.learner.on_stop_requested)
    for worker in c.workers:
        runner.inference_respawned.connect(worker.on_inference_respawned)
    if c.grouped:  # a group a respawn cut short is dropped whole
        runner.episodes_dropped.connect(c.batcher.on_episodes_dropped)
    for component in (*c.workers, *c.inference_workers, c.learner):
        component.event_loop.start.connect(component.on_start)
        runner.stop.connect(component.on_stop)
    if c.evaluator is not None:
        c.evaluator.event_loop.start.connect(c.evaluator.on_start)
        runner.evaluate.connect(c.evaluator.on_evaluate)
        runner.evaluate_final.connect(c.evaluator.on_evaluate_final)
        runner.stop_evaluator.connect(c.evaluator.on_stop)  # after training's components (FinalEvaluation)
        c.evaluator.evaluation_done.connect(runner.on_evaluation_done)
        c.evaluator.report.connect(runner.on_evaluator_report)


def build_components(
    cfg: Config,
    runner_loop: EngineEventLoop,
    buffers: SharedBuffers,
    weights: SharedWeights,
    env_factory: EnvFactory,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    resume_state: dict | None,
    mp_context,
    task_sequence: SharedTaskSequence | None = None,
    tasks: TaskInfo | None = None,
) -> Components:
    from sfengine.rollout.rollout_worker import RolloutWorker

    processes: list[EngineProcess] = []
    seed = component_seed(cfg.env.seed, RankInfo.from_environment().rank, resumed_count(resume_state, "env_steps"))
    loop_for = component_loops(cfg.sampler.serial_mode, runner_loop, mp_context, processes, seed)
    workers = [
        RolloutWorker(
            loop_for(f"rollout_worker_{w}"),
            w,
            cfg,
            buffers,
            env_factory,
            action_spec,
            task_sequence,
            policy=own_policy(cfg, buffers, weights, obs_spec, action_spec, w),
        )
        for w in range(cfg.sampler.num_workers)
    ]
    inference_workers = [
        InferenceWorker(loop_for(f"inference_worker_{i}"), i, cfg, buffers, weights, obs_spec, action_spec)
        for i in range(cfg.sampler.num_inference_workers)
    ]
    learner_loop = loop_for("learner")
    batcher_loop = runner_loop if cfg.sampler.serial_mode else EngineEventLoop("batcher_evt_loop")
    algorithm = algorithm_for(cfg)
    batcher = algorithm.make_batcher(cfg, batcher_loop, buffers, task_sequence)
    learner = LearnerWorker(
        learner_loop, cfg, buffers, weights, obs_spec, action_spec, batcher, resume_state, task_sequence
    )
    evaluator = None
    if cfg.eval.eval_every_env_steps and RankInfo.from_environment().rank == 0:
        evaluator = TrainingEvaluator(loop_for("evaluator"), cfg, weights, env_factory, obs_spec, action_spec, tasks)
    return Components(workers, inference_workers, batcher, learner, processes, evaluator, algorithm.grouped(cfg))


def run(
    cfg: Config,
    env_factory: EnvFactory,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    model: ActorCritic,
    resume_state: dict | None,
    tasks: TaskInfo | None = None,
) -> int:
    """Train until a stop condition; return the process exit code."""
    mp_context = component_context()
    initial_version = resumed_count(resume_state, "policy_version")
    initial_env_steps = resumed_count(resume_state, "env_steps")

    buffers = SharedBuffers.allocate(cfg, obs_spec, action_spec)
    algorithm = algorithm_for(cfg)
    weights = SharedWeights.allocate(model, reference=algorithm.annotate is not None)
    weights.publish(model, initial_version, initial_reference(algorithm, model, resume_state))

    task_sequence = None
    if tasks is not None or algorithm.grouped(cfg):
        task_sequence = build_task_sequence(cfg, tasks, resume_state)

    runner_loop = EngineEventLoop("runner_evt_loop", serial_mode=cfg.sampler.serial_mode)
    task_names = tasks.task_names if tasks else None
    hang_watch = None if cfg.sampler.serial_mode else HangWatch(cfg, buffers.splits, task_names, buffers.learner_clock)
    runner = Runner(runner_loop, cfg, initial_env_steps, task_names, hang_watch)
    runner_loop.start.connect(runner.on_start)
    components = build_components(
        cfg,
        runner_loop,
        buffers,
        weights,
        env_factory,
        obs_spec,
        action_spec,
        resume_state,
        mp_context,
        task_sequence,
        tasks,
    )
    connect_components(runner, components)
    runner.processes = components.processes
    if not cfg.sampler.serial_mode:
        inboxes = [p.event_loop.signal_queue for p in components.processes]
        inboxes += [runner_loop.signal_queue, components.batcher.event_loop.signal_queue]
        runner.respawner = Respawner(cfg, buffers, task_sequence, inboxes)

    run_until_stopped(runner, runner_loop, components.processes)
    summary = runner.finish()
    if runner.leads:
        print(end_summary(cfg, summary), flush=True)
        print(json_text(summary, indent=None), flush=True)
    return runner.exit_code


def resumed_count(resume_state: dict | None, key: str) -> int:
    """A count a resumed run goes on from (``env_steps``, ``policy_version``); 0 for a fresh run."""
    return int(resume_state[key]) if resume_state else 0


def initial_reference(algorithm: Algorithm, model: ActorCritic, resume_state: dict | None) -> ActorCritic | None:
    """The reference policy of an algorithm that annotates (FlowSAR) as the run starts: the policy itself, or on
    resume the one its trainer saved (``state_dict()["reference"]``): the acting side annotates the first batches
    with it, before the learner's first update."""
    if algorithm.annotate is None:
        return None
    reference = copy.deepcopy(model)
    saved = (resume_state or {}).get(algorithm.name)
    if saved is not None:
        reference.load_state_dict(saved["reference"])
    return reference


def build_task_sequence(cfg: Config, tasks: TaskInfo | None, resume_state: dict | None) -> SharedTaskSequence:
    """This rank's one assignment sequence over its shard of (task, init state) pairs, resumed if saved. A
    single-task env gets one too when its episodes form groups: its "init states" are the rank's group seeds."""
    ranks = RankInfo.from_environment()
    if tasks is None:
        first = ranks.rank * GROUP_SEEDS_PER_RANK
        shard = {SINGLE_TASK: list(range(first, first + GROUP_SEEDS_PER_RANK))}
    else:
        shard = shard_pairs(selected_init_states(tasks, cfg.env.tasks, "--tasks"), ranks.rank, ranks.world_size)
    schedule = TaskSchedule(shard, cfg.env.task_group_size)
    sequence = SharedTaskSequence.allocate(
        schedule,
        curriculum=cfg.env.task_sampling == "curriculum",
        window=cfg.env.curriculum_window,
        seed=task_sequence_seed(cfg.env.seed, ranks.rank),
        envs=cfg.sampler.num_workers * cfg.sampler.num_envs_per_worker,
    )
    saved = resumed_task_sequence(resume_state, ranks)
    if saved is not None:
        sequence.load_state_dict(saved)
    return sequence


def resumed_task_sequence(resume_state: dict | None, ranks: RankInfo) -> dict | None:
    """This rank's saved task sequence, if the checkpoint has one for the same number of ranks."""
    saved = (resume_state or {}).get("task_sequence", {}).get("ranks", [])
    if len(saved) == ranks.world_size:
        return saved[ranks.rank]
    if saved:
        log.warning(
            "the checkpoint's task sequences belong to %d ranks, this run has %d: the sequences start over",
            len(saved),
            ranks.world_size,
        )
    return None
