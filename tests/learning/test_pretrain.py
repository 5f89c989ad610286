"""sfengine.pretrain (behavioural cloning) and sfengine.train --init_from, end to end on sparse_reach.

The demonstrations come from sparse_reach's scripted demonstrator, with noise on its actions, written to an HDF5
file as ``python -m sfengine.demos`` writes them. The engine's untrained Gaussian policy succeeds in 27% of 200
episodes when it samples, never with its mode (0 everywhere).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import demo, evaluate, run_train, scripted_demos, start
from sfengine import pretrain, train
from sfengine.demos.dataset import write_demos
from sfengine.engine.checkpoint import list_checkpoints
from sfengine.learning.behavior_cloning import demo_samples, split_by_episode
from sfengine.models.actor_critic import is_critic_key
from sfengine.reporting.events import read_scalars

NUM_DEMOS = 40
TRAINING_CHECKPOINT_KEYS = {"format_version", "model", "optimizer", "env_steps", "policy_version", "task_sequence"}
FAST_BC = ["--pretrain_epochs=150", "--pretrain_batch_size=32", "--pretrain_learning_rate=3e-3"]


def run_pretrain(train_dir: Path, experiment: str, demos: Path, *args: str) -> int:
    return pretrain.main([f"--demos={demos}", f"--train_dir={train_dir}", f"--experiment={experiment}", *args])


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("demos") / "sparse_reach_state.hdf5"
    write_demos(path, scripted_demos(NUM_DEMOS))
    return path


@pytest.fixture(scope="module")
def cloned(tmp_path_factory, demo_file) -> Path:
    """The train_dir of a behavioural-cloning run 'bc' (Gaussian head)."""
    train_dir = tmp_path_factory.mktemp("bc") / "train_dir"
    assert run_pretrain(train_dir, "bc", demo_file, *FAST_BC) == 0
    return train_dir


def test_chunks_run_past_the_episode_end_with_its_last_action_repeated():
    samples = demo_samples([demo([np.zeros(4)] * 3, [np.full(2, 1.0), np.full(2, 2.0), np.full(2, 3.0)])], chunk=2)
    assert samples.actions.tolist() == [[1, 1, 2, 2], [2, 2, 3, 3], [3, 3, 3, 3]]


def test_validation_holds_out_whole_episodes():
    samples = demo_samples(scripted_demos(10).demos, chunk=1)
    train_episodes, held_out = split_by_episode(10, 0.2, seed=0)
    assert len(held_out) == 2 and sorted(train_episodes + held_out) == list(range(10))
    assert len(samples.of_episodes(train_episodes)) + len(samples.of_episodes(held_out)) == len(samples)
    assert not set(samples.of_episodes(held_out).episodes.tolist()) & set(train_episodes)


def test_cloning_lowers_the_validation_loss_and_writes_a_training_runs_files(cloned):
    experiment_dir = cloned / "bc"
    summary = read_json(experiment_dir / "summary.json")
    assert summary["validation_episodes"] == 4 and summary["train_episodes"] == 36
    assert summary["validation_loss"][-1] < summary["validation_loss"][0] - 1.0, summary["validation_loss"]
    curves = read_scalars(experiment_dir)
    assert len(curves["pretrain/train_loss"]) == 150 and len(curves["pretrain/validation_loss"]) == 151
    config = read_json(experiment_dir / "config.json")
    assert config["env"]["env"] == "sparse_reach"  # from the demonstrations

    (path,) = list_checkpoints(experiment_dir)
    state = torch.load(path, weights_only=True)
    assert TRAINING_CHECKPOINT_KEYS <= set(state) and state["env_steps"] == 0 and state["policy_version"] == 0
    # The observation statistics are the training demonstrations'; the value head is as initialised (zero).
    demos = scripted_demos(NUM_DEMOS).demos
    train_episodes, _ = split_by_episode(NUM_DEMOS, 0.1, seed=0)
    train_obs = np.concatenate([demos[i].obs["obs"] for i in train_episodes])
    torch.testing.assert_close(
        state["model"]["normalizers.obs.mean"], torch.tensor(train_obs.mean(0)), atol=1e-5, rtol=0
    )
    assert not state["model"]["value_head.weight"].any()
    # The log-std is the spread of the demonstrated actions around the clone's mean: the demonstrator's noise
    # (0.2, less where the clip to [-1, 1] cuts it) plus what the mean misses; gradient steps left it near its start.
    std = state["model"]["log_std"].exp()
    torch.testing.assert_close(std, torch.tensor(summary["action_std"]), atol=1e-4, rtol=0)
    assert all(0.05 < s < 0.3 for s in std.tolist()), std


@pytest.mark.slow
def test_the_clone_evaluates_far_above_a_random_policy(cloned):
    result = evaluate(f"--train_dir={cloned}", "--experiment=bc", "--eval_episodes=40", "--num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    (eval_dir,) = (cloned / "bc" / "eval").iterdir()
    success = read_json(eval_dir / "results.json")["overall"]["success_rate"]
    assert success >= 0.8, success  # a random policy: 0.27


@pytest.mark.slow
def test_training_from_the_clone_keeps_its_policy_bit_identical_through_critic_warmup(cloned):
    # Warm-up outlasts the run: only the critic learns, so the policy the workers act with from step 0 is the
    # clone's, weights and observation statistics alike, on every batch.
    args = [
        "--init_from=bc",
        "--env=sparse_reach",
        "--critic_warmup_batches=1000",
        "--num_workers=1",
        "--num_envs_per_worker=4",
        "--rollout=16",
        "--batch_size=128",
        "--train_for_env_steps=1024",
    ]
    result = run_train(cloned, "finetune", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starting from the weights of" in result.stdout and "critic warm-up" in result.stdout
    clone = torch.load(list_checkpoints(cloned / "bc")[-1], weights_only=True)
    tuned = torch.load(list_checkpoints(cloned / "finetune")[-1], weights_only=True)
    assert tuned["policy_version"] >= 2 and tuned["env_steps"] <= 1024 + 256  # counted from 0
    for name, tensor in tuned["model"].items():
        if not is_critic_key(name):
            assert torch.equal(tensor, clone["model"][name]), name
    assert not torch.equal(tuned["model"]["value_head.weight"], clone["model"]["value_head.weight"])
    # A fresh optimiser: the policy's parameters have no Adam state at all, the critic's count this run's steps.
    assert len(tuned["optimizer"]["state"]) == 2  # the value head's weight and bias
    assert all(curve.value == 1.0 for curve in read_scalars(cloned / "finetune")["train/critic_warmup"])

    # The same command again resumes the run's own checkpoint; --init_from applies to fresh starts only.
    result = run_train(cloned, "finetune", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--init_from=bc ignored: 'finetune' resumes from its own checkpoint" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "(its run was on --env=sparse_reach)"),  # the default env, CartPole-v1
        (["--env=sparse_reach", "--hidden_sizes=32"], "does not fit env 'sparse_reach'"),
        (["--env=sparse_reach", "--init_from=no_such_run"], "no checkpoint file, and no experiment"),
        (["--env=sparse_reach", "--init_from=diverged"], "holds NaN or infinite weights (policy_head.weight)"),
        (["--env=sparse_reach", "--init_from=noise.pt"], "(not a checkpoint file: damaged, cut short, or never one)"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_a_one_line_error(cloned, capsys, args, message):
    # A clone whose weights went NaN, and a file of random bytes named as a checkpoint.
    state = torch.load(list_checkpoints(cloned / "bc")[-1], weights_only=True)
    state["model"]["policy_head.weight"][0, 0] = float("nan")
    (cloned / "diverged" / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(state, cloned / "diverged" / "checkpoints" / "checkpoint_000000001_1.pt")
    (cloned / "diverged" / "config.json").write_text((cloned / "bc" / "config.json").read_text())
    (cloned / "noise.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    args = [arg.replace("noise.pt", str(cloned / "noise.pt")) for arg in args]
    code = train.main([f"--train_dir={cloned}", "--experiment=misfit", "--init_from=bc", *args])
    err = capsys.readouterr().err
    assert code == 2 and "weights_only" not in err
    assert err.startswith("sfengine.train: error: --init_from") and err.count("\n") == 1 and message in err, err
    assert not (cloned / "misfit").exists()


@pytest.mark.slow
def test_a_flow_head_clones_chunks_of_two_and_evaluates(demo_file, train_dir):
    command = [sys.executable, "-m", "sfengine.pretrain", f"--demos={demo_file}", f"--train_dir={train_dir}"]
    args = ["--experiment=flow", "--policy_head=flow", "--action_chunk=2", *FAST_BC]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "epoch 150/150: train loss" in result.stderr  # the progress line, one line per epoch off a terminal
    summary = read_json(train_dir / "flow" / "summary.json")
    assert summary["validation_loss"][-1] < summary["validation_loss"][0] / 2, summary["validation_loss"]
    config = read_json(train_dir / "flow" / "config.json")  # what FlowSAR fine-tunes, and evaluation builds
    assert config["learner"]["algo"] == "flow_sar" and config["model"]["action_chunk"] == 2
    result = evaluate(f"--train_dir={train_dir}", "--experiment=flow", "--eval_episodes=8", "--num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_a_sigterm_stops_cloning_after_a_whole_step_and_saves_what_it_learned(demo_file, tmp_path):
    command = [sys.executable, "-m", "sfengine.pretrain", f"--demos={demo_file}", f"--train_dir={tmp_path}"]
    command += ["--experiment=stopped", "--pretrain_epochs=1000000", "--pretrain_batch_size=32"]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # killed if the test fails
    for line in process.stderr:  # not a terminal: one line per epoch
        if line.startswith("epoch 2/"):
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    summary = read_json(tmp_path / "stopped" / "summary.json")
    assert summary["stop_reason"] == f"interrupted by SIGTERM after {summary['epochs']} epochs", summary
    assert 2 <= summary["epochs"] < 1000000 and len(summary["train_loss"]) == summary["epochs"]
    assert summary["validation_loss"][-1] < summary["validation_loss"][0]
    checkpoint = torch.load(list_checkpoints(tmp_path / "stopped")[-1], weights_only=False)
    assert checkpoint["pretrain"]["demos"] == str(demo_file) and "done: interrupted by SIGTERM" in out


def test_bad_demonstrations_or_a_taken_experiment_exit_2_with_one_line(demo_file, tmp_path, train_dir, capsys):
    wrong_actions = scripted_demos(4)
    wrong_actions.demos[2].actions = wrong_actions.demos[2].actions[:, :1]
    write_demos(tmp_path / "wrong.hdf5", wrong_actions)
    nan_action = scripted_demos(4)
    nan_action.demos[1].actions[2, 0] = np.nan  # one NaN would make every weight of the clone NaN
    write_demos(tmp_path / "nan.hdf5", nan_action)
    cases = [
        (tmp_path / "nan.hdf5", [], "demonstration 1 has a NaN or infinite value in its actions at step 2"),
        (
            tmp_path / "wrong.hdf5",
            [],
            "demonstration 2 (task 0, init state 2): actions are (3, 1), expected steps of 2",
        ),
        (demo_file, ["--env=Pendulum-v1"], "holds demos of sparse_reach, not Pendulum-v1"),
        (tmp_path / "missing.hdf5", [], "no such file"),
        (demo_file, ["--validation_fraction=0.99"], "leaves none to train on"),
    ]
    for path, args, message in cases:
        assert run_pretrain(train_dir, "bad", path, *args) == 2
        err = capsys.readouterr().err
        assert err.startswith("sfengine.pretrain: error: ") and err.count("\n") == 1 and message in err, err
    assert not (train_dir / "bad").exists()
    assert run_pretrain(train_dir, "taken", demo_file, "--pretrain_epochs=1") == 0
    capsys.readouterr()
    assert run_pretrain(train_dir, "taken", demo_file, "--pretrain_epochs=1") == 2
    err = capsys.readouterr().err
    assert "already has checkpoints" in err and err.count("\n") == 1


def test_help_lists_the_pretrain_group(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pretrain.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "pretrain:" in out and "--validation_fraction" in out and "--critic_warmup_batches" in out


@pytest.mark.slow
def test_the_checkpoint_keeps_the_epoch_of_the_lowest_validation_loss(demo_file, tmp_path, capsys):
    # Few demonstrations, a high learning rate and many epochs: the validation loss turns up long before the end.
    args = ["--pretrain_batch_size=16", "--pretrain_learning_rate=1e-2", "--validation_fraction=0.25"]
    assert run_pretrain(tmp_path, "best", demo_file, "--pretrain_epochs=60", *args) == 0
    summary = read_json(tmp_path / "best" / "summary.json")
    validation = summary["validation_loss"]
    kept = summary["kept_epoch"]
    assert kept == 1 + int(np.argmin(validation[1:])) and kept < summary["epochs"] == 60, validation
    assert validation[-1] > validation[kept]  # it overfit: the last epoch was the worse choice
    # The last line gives the kept epoch's loss beside the last one's, not the last alone.
    assert f"(the last epoch's); {validation[kept]:.4f} at epoch {kept}, the one kept" in capsys.readouterr().out
    # The same training stopped at that epoch holds the same weights (training is deterministic on the CPU).
    assert run_pretrain(tmp_path, "stopped", demo_file, f"--pretrain_epochs={kept}", "--keep_weights=last", *args) == 0
    (best,), (stopped,) = list_checkpoints(tmp_path / "best"), list_checkpoints(tmp_path / "stopped")
    best_model, stopped_model = (
        torch.load(best, weights_only=True)["model"],
        torch.load(stopped, weights_only=True)["model"],
    )
    for name, tensor in best_model.items():
        torch.testing.assert_close(tensor, stopped_model[name], rtol=0, atol=0, msg=name)
    # --pretrain_patience stops once that many epochs pass without a better one.
    assert run_pretrain(tmp_path, "patient", demo_file, "--pretrain_epochs=60", "--pretrain_patience=5", *args) == 0
    patient = read_json(tmp_path / "patient" / "summary.json")
    assert patient["epochs"] == patient["kept_epoch"] + 5 < 60 and "--pretrain_patience" in patient["stop_reason"]
