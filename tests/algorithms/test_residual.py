"""Residual policies over a frozen base (``--residual_over``): the first actions are exactly the base's, the
correction stays within its bound and only the actor learns, a base that does not fit the env is a one-line error
before anything starts, IBRL's rule (``--ibrl``) acts and bootstraps with the proposal its critics value more, and
TD3's correction of a weak clone of sparse_reach learns the task, and a run with that rule saves and evaluates
the critics it chose with."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import evaluate, reached_target, read_summary, registered_base, run_train, scripted_demos
from sfengine.algorithms.offpolicy.residual import base_identity, load_base
from sfengine.config import ConfigError, parse_config, save_config
from sfengine.demos import write_demos
from sfengine.engine.checkpoint import list_checkpoints, load_latest_checkpoint
from sfengine.env.registry import resolve_env_factory
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.reporting.events import read_scalars
from sfengine.train import probe_env

OBS_SPEC = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
ACTION_SPEC = ActionSpec(discrete=False, dim=2, low=(-2.0, 0.0), high=(2.0, 1.0))


@pytest.fixture
def base_model():
    """A registered model as the base: a Gaussian policy with weights of its own (seeded)."""
    with registered_base("test_base", 123) as factory:
        yield factory


# A chunk of 2 of those actions a decision (--action_chunk=2).
CHUNK_SPEC = ActionSpec(discrete=False, dim=4, low=(-2.0, 0.0) * 2, high=(2.0, 1.0) * 2, chunk=2)


def residual(
    algo: str, base_action: str = "mode", scale: float = 0.1, action_spec: ActionSpec = ACTION_SPEC, *args: str
):
    cfg = parse_config(
        [f"--algo={algo}", "--env=Pendulum-v1", "--residual_over=test_base", "--hidden_sizes=16,16"]
        + [f"--action_chunk={action_spec.chunk}", *args]
    )
    cfg.set("residual_base_action", base_action)
    cfg.set("residual_scale", scale)
    from sfengine.algorithms import algorithm_for

    return algorithm_for(cfg).model(cfg, OBS_SPEC, action_spec), cfg


@pytest.mark.parametrize("action_spec", [ACTION_SPEC, CHUNK_SPEC], ids=["one action", "chunks of 2"])
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_first_actions_are_exactly_the_bases_and_corrections_stay_within_their_bound(base_model, algo, action_spec):
    model, cfg = residual(algo, action_spec=action_spec)
    base = load_base(cfg, OBS_SPEC, action_spec)
    obs = {"obs": torch.randn(64, 3) * 3}
    low, high = torch.tensor(action_spec.low), torch.tensor(action_spec.high)
    with torch.inference_mode():
        expected = torch.maximum(torch.minimum(base.act(obs, deterministic=True).actions, high), low)
        assert expected.shape == (64, action_spec.dim)
        assert torch.equal(model.act(obs, deterministic=True).actions, expected)
        # Sampled, the correction adds its noise within +-0.1 half-ranges (0.2 and 0.05 here) of the base's action.
        sampled = model.act(obs).actions
    gap = (sampled - expected).abs()
    assert (gap <= (high - low) / 2 * 0.1 + 1e-6).all() and gap.max() > 0
    # Only the correction learns: the base is frozen and in the checkpoint (the model's own base.* weights).
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(name.startswith("base.") for name in trainable)
    assert any(name.startswith("base.") for name in model.state_dict())
    assert base_identity(model) == "registered model 'test_base'"


def test_with_the_bases_sampled_action_the_policy_acts_as_the_base_samples(base_model):
    model, cfg = residual("td3", base_action="sample")
    base = load_base(cfg, OBS_SPEC, ACTION_SPEC)
    obs = {"obs": torch.randn(64, 3)}
    with torch.inference_mode():
        torch.manual_seed(5)
        expected = base.act(obs).actions
        torch.manual_seed(5)
        acted = model.act(obs, deterministic=True).actions  # the correction's mode over the base's sample
    inside = torch.maximum(torch.minimum(expected, torch.tensor([2.0, 1.0])), torch.tensor([-2.0, 0.0]))
    assert torch.equal(acted, inside)


def test_a_residual_over_demonstrations_pays_for_leaving_them_unless_told_otherwise():
    assert parse_config(["--algo=td3", "--residual_over=x", "--demos=d.hdf5"]).algorithm_options.bc_weight == 0.4
    assert parse_config(["--algo=td3", "--residual_over=x", "--demos=d", "--bc_weight=0"]).get("bc_weight") == 0
    assert parse_config(["--algo=td3", "--demos=d.hdf5"]).algorithm_options.bc_weight == 0  # no residual: none


def test_residual_options_are_checked():
    with pytest.raises(ConfigError, match="--residual_scale=0.0 must lie in"):
        parse_config(["--algo=td3", "--residual_scale=0"])
    with pytest.raises(ConfigError, match="--bc_weight pulls the actor toward the demonstrations"):
        parse_config(["--algo=td3", "--bc_weight=0.4"])
    with pytest.raises(ConfigError, match="residual_over"):
        parse_config(["--algo=ppo", "--residual_over=x"])  # another algorithm's option


def test_a_demo_ratio_without_demonstrations_is_refused_unless_it_is_a_resumed_runs_own(tmp_path):
    # It was accepted, and the run learned from no demonstration while its command said a share of each minibatch.
    with pytest.raises(ConfigError, match=r"--demo_ratio=0.3 is the demonstrations' share .* give them with --demos"):
        parse_config(["--algo=sac", "--demo_ratio=0.3"])
    assert parse_config(["--algo=sac", "--demo_ratio=0.3", "--demos=d.hdf5"]).get("demo_ratio") == 0.3
    # A resumed run's saved config holds every option, demo_ratio's default among them: not a request.
    (tmp_path / "run").mkdir()
    save_config(
        parse_config(["--algo=sac", f"--train_dir={tmp_path}", "--experiment=run"]), tmp_path / "run/config.json"
    )
    assert parse_config(["--algo=sac", f"--train_dir={tmp_path}", "--experiment=run"]).get("demo_ratio") == 0.5


@pytest.fixture(scope="module")
def cloned_once(tmp_path_factory):
    """A weak clone of sparse_reach: sfengine.pretrain for a few epochs on 10 noisy scripted demonstrations, made
    once for the module: (its demonstrations, its train_dir)."""
    folder = tmp_path_factory.mktemp("reach_clone")
    demos = folder / "reach.hdf5"
    write_demos(demos, scripted_demos(10, noise=0.3))
    command = [sys.executable, "-m", "sfengine.pretrain", f"--demos={demos}", f"--train_dir={folder / 'runs'}"]
    result = subprocess.run([*command, "--experiment=clone", "--pretrain_epochs=20"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return demos, folder / "runs"


@pytest.fixture
def reach_clone(cloned_once, train_dir):
    """The clone as experiment ``clone`` of this test's train_dir (a copy of its own); returns its demonstrations."""
    demos, runs = cloned_once
    shutil.copytree(runs / "clone", train_dir / "clone")
    return demos


def test_a_base_that_does_not_fit_the_env_is_a_one_line_error_before_anything_starts(reach_clone, train_dir):
    for args, message in [
        (["--env=Pendulum-v1", "--residual_over=clone"], "--residual_over=clone: its policy (trained on --env="),
        (["--env=sparse_reach", "--residual_over=nothing"], "--residual_over=nothing: no checkpoint file"),
        (
            ["--env=sparse_reach", "--residual_over=clone", "--action_chunk=2"],
            "--residual_over=clone: its policy was trained with --action_chunk=1 and this run has --action_chunk=2",
        ),
    ]:
        result = run_train(train_dir, "bad_base", "--algo=td3", *args, timeout=120)
        errors = [line for line in result.stderr.splitlines() if line.startswith("sfengine.train: error")]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
        assert not (train_dir / "bad_base").exists()


RESIDUAL_REACH = ["--env=sparse_reach", "--algo=td3", "--residual_over=clone", "--residual_scale=0.3"]


@pytest.mark.slow
def test_td3s_correction_of_a_weak_clone_learns_sparse_reach_with_the_residual_preset(reach_clone, train_dir):
    # The clone succeeds in about 0.4 of its episodes (sampled). Through the LIBERO recipe (--cfg=residual_td3: the
    # critics alone until 9k env steps, then half a gradient step per env step), with a bound that fits this task,
    # the corrected policy reaches 0.9 within 20k env steps: with critics of 64-64, seeds 1-3 stopped at 11.3k,
    # 13.1k and 11.5k (32-40 s alone); of 256-256, the default, seeds 1-2 at 11.5k and 12.0k (51-52 s).
    args = ["--env=sparse_reach", "--cfg=residual_td3", "--residual_over=clone", "--residual_scale=0.3"]
    args += ["--critic_hidden_sizes=64,64"]
    args += [f"--demos={reach_clone}", "--train_for_env_steps=20000", "--stop_at_success=0.9"]
    result = run_train(train_dir, "residual", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert reached_target(read_summary(train_dir, "residual"), "stop_at_success=0.9")
    # sfengine.evaluate evaluates the pair as it is saved: the base's sampled action plus the correction's mean. Over
    # 20 episodes a policy at 0.9 scores under 0.9 one time in three; the clone alone would score about 0.4.
    result = evaluate(f"--train_dir={train_dir}", "--experiment=residual", "--eval_episodes=20")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "actions: the base's sampled action plus the correction's mean" in result.stdout  # not "mode"
    rate = re.search(r"success (\d\.\d+)", result.stdout)
    assert rate and float(rate.group(1)) >= 0.8, result.stdout[-1000:]


@pytest.mark.slow
def test_an_ibrl_run_saves_the_critics_it_chose_with_and_evaluates_by_them(reach_clone, train_dir, tmp_path):
    # Through the engine: the critics choose from the first gradient step on (train/target_base_share), the
    # checkpoint's policy carries the critics as they were last synced (its chooser), and sfengine.evaluate acts
    # with that pair. (Choosing itself is checked against hand-computed values above.)
    args = [*RESIDUAL_REACH, "--ibrl=True", f"--demos={reach_clone}", "--learning_starts=1000"]
    args += ["--critic_warmup_updates=100", "--replay_ratio=0.25", "--train_for_env_steps=3000"]
    result = run_train(train_dir, "ibrl", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    shares = [p.value for p in read_scalars(train_dir / "ibrl")["train/target_base_share"]]
    assert shares and all(0 <= share <= 1 for share in shares)
    checkpoint = load_latest_checkpoint(train_dir / "ibrl")
    chooser = {name[len("chooser.") :]: t for name, t in checkpoint["model"].items() if name.startswith("chooser.")}
    critics = checkpoint["td3"]["critics"]
    assert chooser.keys() == critics.keys() and all(torch.equal(chooser[k], critics[k]) for k in critics)
    # Given by its file (and --train_dir), the checkpoint is evaluated in its own run: its config builds the policy.
    latest = list_checkpoints(train_dir / "ibrl")[-1]
    result = evaluate(f"--train_dir={train_dir}", f"--checkpoint={latest}", "--eval_episodes=10")
    assert result.returncode == 0 and "success" in result.stdout, result.stderr[-2000:]
    assert (train_dir / "ibrl" / "eval" / latest.stem / "results.json").is_file()
    # The run copied where its base is not (another machine): it evaluates alike, with the base its checkpoint keeps.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(train_dir / "ibrl", elsewhere / "ibrl")
    moved = evaluate(f"--train_dir={elsewhere}", "--experiment=ibrl", "--eval_episodes=2")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert moved.stderr.count("not found; the base is this run's own copy") == 1  # said once, not by each process
    assert "success" in moved.stdout
    here, there = (
        parse_config([f"--train_dir={d}", "--experiment=ibrl", *RESIDUAL_REACH]) for d in (train_dir, elsewhere)
    )
    obs_spec, action_spec, _ = probe_env(here, resolve_env_factory("sparse_reach"))
    original, copy = (load_base(cfg, obs_spec, action_spec).state_dict() for cfg in (here, there))
    assert original.keys() == copy.keys() and all(torch.equal(original[k], copy[k]) for k in original)
    # The copy stands in only for the base the run was over: a run over another that is not there is an error.
    there.set("residual_over", "another_clone")
    with pytest.raises(ConfigError, match="--residual_over=another_clone: no checkpoint file"):
        load_base(there, obs_spec, action_spec)


def test_a_base_on_a_device_of_its_own_stays_there_when_the_policy_moves(base_model):
    model, cfg = residual("td3")
    placed, _ = residual("td3", "mode", 0.1, ACTION_SPEC, "--residual_base_device=cpu")
    obs = {"obs": torch.randn(16, 3)}
    with torch.inference_mode():
        assert torch.equal(placed.act(obs, deterministic=True).actions, model.act(obs, deterministic=True).actions)
    placed.to("meta")  # the policy moves; its base does not
    assert all(p.device.type == "meta" for name, p in placed.named_parameters() if not name.startswith("base."))
    assert all(p.device.type == "cpu" for p in placed.base.parameters())
    assert placed.env_center.device.type == "meta" and [*placed.state_dict()][0] == [*model.state_dict()][0]


def test_the_base_device_is_checked_where_it_is_given():
    for args, message in [
        (["--residual_over=x", "--residual_base_device=cuda:7"], "--residual_base_device=cuda:7: torch sees"),
        (["--residual_over=x", "--residual_base_device=gpu"], "is not a device torch knows"),
        (["--residual_base_device=cpu"], "places the base of --residual_over, and none is given"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config(["--algo=td3", *args])


def ibrl_pair(*args: str):
    """A residual TD3 policy with --ibrl whose correction is not zero, and its trainer (critics of 2 members)."""
    from sfengine.algorithms.td3.trainer import TD3Trainer

    model, cfg = residual(
        "td3", "mode", 0.5, ACTION_SPEC, "--ibrl=True", "--critic_hidden_sizes=16,16", "--rollout=8", *args
    )
    cfg.set("learning_starts", 0)
    cfg.set("batch_size", 32)
    torch.manual_seed(7)
    with torch.no_grad():
        model.policy_head.weight.normal_()
        for p in model.chooser.parameters():
            p.normal_()
    return model, TD3Trainer(model, cfg)


def test_with_ibrl_the_policy_acts_with_the_action_its_critics_value_more(base_model):
    model, _ = ibrl_pair()
    obs = {"obs": torch.randn(256, 3) * 3}
    with torch.inference_mode():
        params = model.policy_params(obs)
        corrected, base = model.action(params), model.split(params)[1]
        features = model.critic_features(obs)
        q_corrected = model.chooser(features, model.unit_actions(corrected)).mean(0)
        q_base = model.chooser(features, model.unit_actions(base)).mean(0)
        acted = model.act(obs, deterministic=True).actions
    take_base = (q_base > q_corrected).unsqueeze(-1)
    assert torch.equal(acted, torch.where(take_base, base, corrected))
    assert 0 < take_base.float().mean() < 1  # both proposals won somewhere: the choice is per row
    # The chooser travels with the policy (shared weights, checkpoints) and never learns from the actor's loss.
    assert any(name.startswith("chooser.") for name in model.state_dict())
    assert not any(p.requires_grad for p in model.chooser.parameters())


def test_with_ibrl_the_critics_bootstrap_from_the_better_proposal_and_the_policy_acts_by_them(base_model):
    model, trainer = ibrl_pair()
    trainer.options.target_noise = 0.0
    obs = {"obs": torch.randn(256, 3)}
    with torch.no_grad():
        for p in trainer.target_critics.parameters():
            p.normal_()
        features = trainer.features(obs)
        value = trainer.target_value(obs, features)
        params = trainer.target_actor.policy_params(obs)
        corrected, base = trainer.target_actor.action(params), trainer.target_actor.split(params)[1]
        q_corrected = trainer.target_critics(features, model.unit_actions(corrected)).min(0).values
        q_base = trainer.target_critics(features, model.unit_actions(base)).min(0).values
    assert torch.allclose(value, torch.maximum(q_corrected, q_base))
    assert 0 < trainer.target_stats["target_base_share"] < 1
    # After a round of learning the policy's chooser holds the critics it will be published with.
    from test_offpolicy import batch

    stats = trainer.train(batch(0), 0, 0)
    assert stats["gradient_steps"] > 0 and 0 <= stats["target_base_share"] <= 1
    for mine, theirs in zip(model.chooser.parameters(), trainer.critics.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_a_residual_sacs_temperature_holds_a_target_its_correction_can_reach(base_model):
    # The correction's log-density is measured in its own box, 0.1 of the env's: -1 a dimension, the plain
    # policy's target, lies above any entropy it can have, and its temperature grew tenfold every few seconds.
    from test_offpolicy import batch

    from sfengine.algorithms.sac import check_target_entropy, most_entropy
    from sfengine.algorithms.sac.trainer import SACTrainer

    model, cfg = residual("sac", "mode", 0.1, ACTION_SPEC, "--critic_hidden_sizes=16,16", "--rollout=8")
    cfg.set("learning_starts", 0)
    cfg.set("batch_size", 32)
    torch.manual_seed(3)
    trainer = SACTrainer(model, cfg)
    assert trainer.target_entropy < most_entropy(model.action_half_range.tolist()) < -ACTION_SPEC.dim
    start = float(trainer.alpha)
    for seed in range(4):
        trainer.train(batch(seed), 0, 0)
    assert trainer.critic_steps > 20 and float(trainer.alpha) < start
    # A target given above the reachable is refused before anything starts, naming the bound.
    check_target_entropy(cfg, OBS_SPEC, ACTION_SPEC)
    cfg.set("target_entropy", -3.0)
    with pytest.raises(ConfigError, match=r"--target_entropy=-3 is more than .* at most -3.22.*below -3.22"):
        check_target_entropy(cfg, OBS_SPEC, ACTION_SPEC)


def test_td3s_target_actor_holds_the_frozen_base_by_reference_and_saves_only_its_own_weights(base_model):
    from test_offpolicy import batch

    model, trainer = ibrl_pair()
    target = trainer.target_actor
    assert target.base is model.base and target.chooser is model.chooser  # no copy of a base of any size
    saved = {name: t.clone() for name, t in trainer.extra_state()["target_actor"].items()}
    assert saved and not any(name.startswith(("base.", "chooser.")) for name in saved)
    base_weights = [p.detach().clone() for p in model.base.parameters()]
    trainer.train(batch(0), 0, 0)
    assert all(torch.equal(a, b) for a, b in zip(base_weights, model.base.parameters(), strict=True))
    moved = trainer.extra_state()["target_actor"]
    assert any(not torch.equal(saved[name], moved[name]) for name in saved)  # its own weights follow the actor
    # A checkpoint written when the target held copies: they are not loaded over the model's base.
    old = {name: t.clone() for name, t in target.state_dict().items()}
    old |= {f"base.{name}": torch.zeros_like(t) for name, t in model.base.state_dict().items()}
    trainer.load_extra_state({"target_actor": old})
    assert all(torch.equal(a, b) for a, b in zip(base_weights, model.base.parameters(), strict=True))
    with pytest.raises(RuntimeError, match="target actor does not fit"):
        trainer.load_extra_state({"target_actor": {**old, "extra.weight": torch.zeros(1)}})


def test_ibrl_needs_td3_over_a_base():
    for args in (["--algo=td3", "--ibrl=True"], ["--algo=sac", "--residual_over=x", "--ibrl=True"]):
        with pytest.raises(ConfigError, match="--ibrl lets the critics choose .* needs --algo=td3 and --residual_over"):
            parse_config(args)
