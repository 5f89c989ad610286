"""The agent learns: thresholds on summary.json within a bounded number of env steps.

Each run takes 10-40 s on 2 cores. Thresholds leave margin below what the presets reach (CartPole: above 400
after 85-210k steps, 500 at 300k; Pendulum: about -200 by 300k steps, against about -1200 for a random policy;
asserted: -400). Most runs stop at their threshold (``--stop_at_return``, ``--stop_at_success``: the mean of a
full window of 100 episodes, or of 20 where the test asks only that a layout learns: at 20 CartPole seeds 1 and 2
stopped at 66k and 68k env steps, at 100 at 153k and 82k), as a user stops a run that solved its env; the env-step
limit is the bound.
"""

from __future__ import annotations

import pytest
import torch

from helpers import reached_target, read_summary, run_train
from sfengine.engine.checkpoint import list_checkpoints, load_checkpoint
from sfengine.reporting.events import read_scalars

pytestmark = pytest.mark.slow
RLOO_STEPS = 60_000  # it crosses 0.9 near 50k steps (from 0.17 at random)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(["--serial_mode=true"], id="serial"),
        pytest.param(["--serial_mode=false", "--advantage=vtrace"], id="async-vtrace"),
        # No inference process: each rollout worker acts with its own copy, pulled as the learner publishes.
        pytest.param(["--serial_mode=false", "--num_inference_workers=0"], id="workers-act"),
    ],
)
def test_cartpole_reaches_400_within_300k_steps_in_every_layout(train_dir, mode):
    args = ["--cfg=cartpole", "--train_for_env_steps=300000", "--stop_at_return=400", "--stats_window=20", *mode]
    result = run_train(train_dir, "cartpole", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "cartpole")
    assert reached_target(summary, "stop_at_return=400"), summary


@pytest.mark.parametrize("clip_mode", ["soft_clip", "sapo", "ce_gppo", "cispo"])
def test_cartpole_reaches_400_within_500k_steps_with_each_clip_mode_alone(train_dir, clip_mode):
    # ppo_clip, the default, is the evaluator's run below. Each mode alone, in the default asynchronous mode: its own
    # --target_kl (0.01) is what keeps it up. Without one, at the preset's 1e-3, ce_gppo and cispo fell to a return
    # of 9 in 4 of 4 seeds; with it, every run of every mode crossed 400 within 216k steps and ended at 500. On a
    # loaded 2-core machine ce_gppo crossed it at 100k-200k in 21 of 22 runs, and one was at 321 at 300k (the same
    # seed again: 103k): the limit leaves room for such a slow run, not for a collapse.
    args = ["--cfg=cartpole", "--train_for_env_steps=500000", f"--clip_mode={clip_mode}", "--stop_at_return=400"]
    result = run_train(train_dir, clip_mode, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, clip_mode)
    curves = read_scalars(train_dir / clip_mode)
    assert reached_target(summary, "stop_at_return=400"), summary
    # The mode's own target KL is in force: it ends some updates early (about half, in 5 seeds of each mode).
    assert any(point.value > 0 for point in curves["train/target_kl_stop"]), "no update stopped at the target KL"
    diagnostics = ["clip_fraction", "dead_grad_fraction", "ess", "approx_kl", "ratio_min", "ratio_max"]
    if clip_mode == "sapo":
        diagnostics.append("sapo_saturated_fraction")
    for name in diagnostics:
        assert curves.get(f"train/{name}"), name
    ess = [point.value for point in curves["train/ess"]]
    assert all(0 < value <= 1 for value in ess), ess
    assert f"learner: {clip_mode} kl " in result.stdout


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(["--serial_mode=true", "--num_workers=1"], id="serial"),
        pytest.param(["--num_workers=1"], id="processes"),
        # Trajectories reach the batcher in any order; it orders each batch by buffer, as the workers own them.
        pytest.param(["--num_workers=2", "--num_inference_workers=0"], id="workers_act"),
    ],
)
def test_a_synchronous_run_repeats_its_weights_to_the_bit(train_dir, layout):
    # docs/training.md promises it: the same --seed trains the same weights. (The summary's mean return may differ:
    # it counts the episodes reported by the time the run stops.)
    args = ["--env=CartPole-v1", "--async_rl=false", "--seed=3", "--train_for_env_steps=20000", *layout]
    runs = []
    for name in ("first", "second"):
        result = run_train(train_dir, name, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(train_dir, name)
        weights = load_checkpoint(list_checkpoints(train_dir / name)[-1])["model"]
        runs.append((summary["env_steps"], summary["policy_version"], weights))
    (*first, first_weights), (*second, second_weights) = runs
    assert first == second
    assert first_weights.keys() == second_weights.keys()
    assert all(torch.equal(first_weights[key], second_weights[key]) for key in first_weights)


def test_synchronous_mode_is_on_policy_and_learns(train_dir):
    args = ["--cfg=cartpole", "--async_rl=false", "--train_for_env_steps=300000", "--stop_at_return=400"]
    args += ["--stats_window=20"]
    result = run_train(train_dir, "sync", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "sync")
    assert summary["policy_lag_mean"] == 0.0  # every sample acted by the policy being trained
    assert reached_target(summary, "stop_at_return=400"), summary


@pytest.mark.parametrize("chunk", [1, 4])
def test_pendulum_box_actions_reach_minus_400_within_300k_steps(train_dir, chunk):
    # With --action_chunk=4 the policy acts every 4th step with 4 actions; the same preset still learns it.
    args = ["--cfg=pendulum", "--train_for_env_steps=300000", f"--action_chunk={chunk}", "--stop_at_return=-400"]
    result = run_train(train_dir, "pendulum", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "pendulum")
    # A random policy scores about -1200. The preset swings the pendulum up and holds it (about -200 by 300k
    # steps); a regression that only halves its quality still fails here. At 36k env steps/s the episode statistics
    # (which the rollout workers report every second or so) can trail the learner's batches by more than the last
    # few thousand steps, so the run may reach its step limit with the window already past -400 (CI, 2026-11-27:
    # -230 at 303k steps, stopped by the limit): both count.
    assert reached_target(summary, "stop_at_return=-400") or summary["episode_return_mean"] >= -400, summary


def test_mujoco_preset_balances_the_inverted_pendulum_within_150k_steps(train_dir):
    # Continuous control on real MuJoCo physics (the mujoco extra) with the preset a user would pick for it:
    # InvertedPendulum-v5 pays 1 per step the pole stays up, to 1000; a random policy scores about 5, the preset
    # 1000 by 150k steps (crossing 500 near 80k).
    args = ["--cfg=mujoco", "--env=InvertedPendulum-v5", "--train_for_env_steps=150000", "--stop_at_return=700"]
    result = run_train(train_dir, "pole", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "pole")
    assert reached_target(summary, "stop_at_return=700"), summary


@pytest.mark.parametrize("reward_scale", [None, "0.01"])
def test_sparse_success_reward_is_learned_with_the_defaults_at_any_reward_scale(train_dir, reward_scale):
    # sparse_reach: reward 1 on success (which terminates), else 0, 40-step episodes, 2-dim actions; a random
    # policy succeeds about 17% of the time. Learning must not hinge on a hand-set --reward_scale: with normalised
    # returns the defaults learn it, and so does a reward a hundred times smaller.
    scale = [] if reward_scale is None else [f"--reward_scale={reward_scale}"]
    args = ["--env=sparse_reach", "--train_for_env_steps=200000", "--stop_at_success=0.9", *scale]
    result = run_train(train_dir, "reach", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "reach")
    assert reached_target(summary, "stop_at_success=0.9"), summary


@pytest.mark.parametrize("inference_dtype", ["float32", "bfloat16"])
def test_dict_observation_with_image_learns_through_the_cnn(train_dir, inference_dtype):
    # The answer is only in the uint8 image: a random policy scores 8 of 16, a policy that reads it 16.
    # With bfloat16 the inference workers act with a bf16 copy of the CNN while the learner trains in float32.
    result = run_train(
        train_dir,
        "bandit",
        "--env=image_bandit",
        "--reward_scale=1",
        "--num_epochs=2",
        "--num_inference_workers=2",
        f"--inference_dtype={inference_dtype}",
        "--train_for_env_steps=40000",
        "--stop_at_return=12",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "bandit")
    assert summary["episode_return_mean"] >= 11.0
    # The env reports info["success"] (>= 12 right of 16): a random policy succeeds in 4% of episodes.
    assert summary["success_rate"] >= 0.3


def test_cartpole_reaches_400_within_300k_steps_with_the_evaluator_running_and_stops_at_the_limit(train_dir):
    # The cartpole preset as a user runs it, with the training evaluator beside it (one run for both).
    args = ["--cfg=cartpole", "--train_for_env_steps=300000", "--eval_every_env_steps=50000"]
    result = run_train(train_dir, "evaluated", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "evaluated")
    assert 300000 <= summary["env_steps"] <= 300000 + 2048  # stops within one training batch of the limit
    # Training reaches the threshold within the budget (its return curve crosses 400), and the final policy holds it
    # (its evaluation at the end, below): a dip of the sampled-action return in the last episodes, which a run
    # without the evaluator shows too now and then, does not fail the test; a learner the evaluator slowed down does.
    curves = read_scalars(train_dir / "evaluated")
    assert max(p.value for p in curves["episodes/episode_return_mean"]) >= 400, summary
    evaluations = summary["eval"]
    assert len(evaluations) >= 4
    steps = [e["env_steps"] for e in evaluations]
    # One evaluation per 50k interval at most (asked when the learner crosses a multiple), in order.
    assert all(a // 50000 < b // 50000 for a, b in zip(steps, steps[1:])) and steps[0] >= 50000
    assert [e["policy_version"] for e in evaluations] == sorted(e["policy_version"] for e in evaluations)
    assert all(e["episodes"] == 10 for e in evaluations)  # --eval_episodes: seeds 0..9 each time
    assert evaluations[-1]["return"] >= 400 and evaluations[-1]["final"]  # the trained policy's mode balances it
    assert [p.step for p in curves["eval/return"]] == steps
    assert "evaluator" in result.stdout  # its CPU share in the status line's time split


def test_rloo_without_a_critic_learns_a_sparse_multitask_env(train_dir):
    # multitask_reach: 8 tasks x 10 init states, reward 1 on success (which terminates), about 17% at random. RLOO
    # judges each episode by its success against the other 7 of its (task, init state): no critic at all.
    args = ["--env=multitask_reach", "--advantage=rloo", "--task_group_size=8", "--group_outcome=success"]
    result = run_train(train_dir, "rloo", *args, f"--train_for_env_steps={RLOO_STEPS}", "--stop_at_success=0.8")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(train_dir, "rloo")
    assert reached_target(summary, "stop_at_success=0.8"), summary
    saved = torch.load(max((train_dir / "rloo" / "checkpoints").glob("*.pt")), weights_only=True)
    assert not [name for name in saved["model"] if "value" in name or "return_normalizer" in name]
