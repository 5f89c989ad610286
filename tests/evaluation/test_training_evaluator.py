"""The evaluator during training on a multi-task env: per-task results, cycling init states."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import read_summary, run_train
from sfengine.config import parse_config
from sfengine.engine.buffers import SharedWeights
from sfengine.engine.event_loop import EngineEventLoop
from sfengine.engine.messages import EpisodeStats, EvalResult, EvaluationRequest, LearnerReport
from sfengine.engine.runner import Runner
from sfengine.env.multitask import TaskInfo
from sfengine.env.registry import resolve_env_factory
from sfengine.evaluation.episode_queue import SINGLE_TASK, EvalEpisode, training_evaluation_episodes
from sfengine.evaluation.training_evaluator import TrainingEvaluator
from sfengine.models.actor_critic import ActorCritic
from sfengine.reporting.events import read_scalars
from sfengine_envs.multitask_toy import NUM_TASKS


def test_capped_evaluations_cycle_through_every_init_state():
    tasks = TaskInfo(["a", "b"], [5, 2])
    rounds = [training_evaluation_episodes(tasks, r, per_task=2) for r in range(5)]
    assert [[e.init_state for e in episodes if e.task == 0] for episodes in rounds[:3]] == [[0, 1], [2, 3], [4, 0]]
    assert all([e.init_state for e in episodes if e.task == 1] == [0, 1] for episodes in rounds)
    # Over five evaluations of two states each, every init state of task 0 came up exactly twice.
    assert Counter(e.init_state for episodes in rounds for e in episodes if e.task == 0) == Counter(
        {s: 2 for s in range(5)}
    )
    assert len(training_evaluation_episodes(tasks, 0)) == 7  # no cap: every pair
    assert training_evaluation_episodes(None, 3, eval_episodes=3) == [
        EvalEpisode(SINGLE_TASK, s, False) for s in range(3)
    ]


def test_a_respawned_evaluator_goes_on_cycling_init_states_where_its_predecessor_stopped(train_dir):
    # A respawn builds the evaluator anew from its start-up arguments, and a resume starts a new run: each learns
    # from the runner's request which evaluation it plays, so the init states go on cycling instead of restarting.
    from sfengine.train import probe_env

    cfg = parse_config(["--env=multitask_toy", "--eval_every_env_steps=1000", "--eval_episodes_per_task=2"])
    factory = resolve_env_factory("multitask_toy")
    obs_spec, action_spec, tasks = probe_env(cfg, factory)
    runner = Runner(EngineEventLoop("test_eval_index_runner", serial_mode=True), cfg, 0, tasks.task_names)
    sent = []
    runner.emit = lambda name, *args: sent.append((name, *args))
    episode = EpisodeStats(1.0, 10, 1.0, 0, 0)
    for done in range(3):
        runner.on_learner_report(LearnerReport(1000 * (done + 1), done, 0.1, 0.0, {}))
        runner.on_evaluation_done(EvalResult(1000 * (done + 1), done, [episode], 1.0))
    runner.on_evaluation_done(EvalResult(3000, 3, [episode], 1.0, final=True))  # a final one plays the next's
    requests = [args[0] for name, *args in sent if name == "evaluate"]
    assert requests == [EvaluationRequest(1000 * (i + 1), i) for i in range(3)] and runner.evaluations_done == 3
    # The report that ends training asks none: the final evaluation plays those weights (or the run stops its
    # evaluator), where one asked too would race it and leave two in the last interval.
    cfg.set("train_for_env_steps", 4000)
    runner.on_learner_report(LearnerReport(4000, 3, 0.1, 0.0, {}))
    assert len([name for name, *args in sent if name == "evaluate"]) == 3
    # A periodic evaluation that ends once the stop has begun (by the clock here) is dropped: the final one plays
    # the last weights. The final one is kept; so is a periodic one when the run is cut short (no final one).
    runner.request_stop("reached --train_for_seconds")
    runner.on_evaluation_done(EvalResult(4000, 3, [episode], 1.0))
    assert [r["env_steps"] for r in runner.evaluations] == [1000, 2000, 3000, 3000] and runner.evaluations_done == 3
    runner.on_evaluation_done(EvalResult(4100, 4, [episode], 1.0, final=True))
    assert runner.evaluations[-1] == {**runner.evaluations[-1], "env_steps": 4100, "final": True}
    runner.interrupts = 1
    runner.on_evaluation_done(EvalResult(4200, 4, [episode], 1.0))
    assert runner.evaluations[-1]["env_steps"] == 4200 and runner.evaluations_done == 4
    # A run resumed at 5,000 env steps had 5 evaluations behind it.
    assert Runner(EngineEventLoop("test_eval_index_resumed", serial_mode=True), cfg, 5000).evaluations_done == 5

    model = ActorCritic.for_config(cfg, obs_spec, action_spec)
    weights = SharedWeights.allocate(model)
    weights.publish(model, 0)
    successor = TrainingEvaluator(
        EngineEventLoop("test_eval_index_evaluator", serial_mode=True),
        cfg,
        weights,
        factory,
        obs_spec,
        action_spec,
        tasks,
    )
    successor.on_start()
    try:
        successor.on_evaluate(EvaluationRequest(4000, 3))
        # Its envs took the first episodes of the list; the rest wait.
        pending, first = successor.source.pending, training_evaluation_episodes(tasks, 0, per_task=2)
        expected = training_evaluation_episodes(tasks, 3, per_task=2)
        assert 0 < len(pending) < len(expected) and pending == expected[-len(pending) :] != first[-len(pending) :]
    finally:
        successor.on_stop()


@pytest.mark.slow
def test_evaluator_reports_per_task_success_to_tensorboard_and_summary(train_dir):
    # Evaluations are due at 6000, 12000 and 18000 env steps, none at the end: the final one runs anew.
    args = ["--env=multitask_toy", "--train_for_env_steps=20000", "--num_workers=1", "--eval_every_env_steps=6000"]
    result = run_train(train_dir, "toy_eval", *args, "--eval_episodes_per_task=2")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "toy_eval")
    evaluations = summary["eval"]
    assert len(evaluations) >= 3
    # The last is the final policy's (--eval_at_end), once the learner had stopped: the checkpoint's weights.
    final = evaluations[-1]
    assert final.get("final") and not any(e.get("final") for e in evaluations[:-1])
    assert (final["env_steps"], final["policy_version"]) == (summary["env_steps"], summary["policy_version"])
    assert "evaluating the final policy" in result.stdout and evaluations[-2]["env_steps"] < final["env_steps"]
    names = {f"toy_task_{t}" for t in range(NUM_TASKS)}
    for evaluation in evaluations:
        assert evaluation["episodes"] == 2 * NUM_TASKS
        assert set(evaluation["per_task_success"]) == names
        assert evaluation["success"] == sum(evaluation["per_task_success"].values()) / NUM_TASKS
    curves = read_scalars(train_dir / "toy_eval")
    assert len(curves["eval/success"]) == len(evaluations)
    for name in names:
        assert len(curves[f"eval/tasks/{name}/success"]) == len(evaluations)
