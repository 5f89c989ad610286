import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from helpers import run_train
from sfengine.config import Config, ConfigError, option, parse_config, save_config
from sfengine.env.registry import make_gymnasium_env, register_env


def test_preset_overrides_defaults_and_command_line_overrides_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("num_workers: 3\nnum_envs_per_worker: 6\nworker_num_splits: 3\n")
    cfg = parse_config([f"--cfg={preset}", "--num_envs_per_worker=9", f"--train_dir={tmp_path}"])
    assert cfg.sampler.num_workers == 3  # from the preset
    assert cfg.sampler.num_envs_per_worker == 9  # the command line wins
    assert cfg.learner.gamma == 0.99  # default


def test_preset_with_a_base_starts_from_it_and_overrides_it(tmp_path):
    (tmp_path / "own.yaml").write_text("base: mujoco\nenv: Hopper-v5\ninitial_log_std: -2.0\n")
    cfg = parse_config([f"--cfg={tmp_path / 'own.yaml'}", "--num_epochs=3", f"--train_dir={tmp_path}"])
    assert cfg.model.actor_critic == "separate"  # from the shipped base
    assert cfg.model.initial_log_std == -2.0  # the preset over its base
    assert cfg.learner.num_epochs == 3  # the command line over both
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")  # a base path is relative to the preset naming it
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="form a cycle .*remove one base"):
        parse_config([f"--cfg={tmp_path / 'a.yaml'}", f"--train_dir={tmp_path}"])


def test_shipped_preset_found_by_name(tmp_path):
    cfg = parse_config(["--cfg=cartpole", f"--train_dir={tmp_path}"])
    assert cfg.env.env == "CartPole-v1"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_envs_per_worker=7", "--worker_num_splits=2"], "not divisible by --worker_num_splits"),
        (["--num_workers=-1"], "--num_workers=-1 must be at least 1"),
        (["--num_workers=0"], "--num_workers=0 must be at least 1"),  # 0 is not a spelling of auto
        (["--num_inference_workers=-1"], "--num_inference_workers=-1 is negative; use 0 for rollout workers"),
        (["--serial_mode=true", "--num_inference_workers=0"], "leave --num_inference_workers at 1"),
        (["--gamma=abc"], "--gamma='abc' is not a valid float"),
        (["--batch_size=1000", "--rollout=32"], "not a multiple of --rollout=32"),
        (["--cfg=no_such_preset"], "no such preset"),
        (["--restart_behavior=maybe"], "is not one of resume, restart, overwrite"),
        (["--stop_at_success=80"], "--stop_at_success=80.0 is a success rate: give one in (0, 1], e.g. 0.8"),
        # Env options belong to their env, are validated by it, and are refused for another env.
        (["--env=synthetic", "--synthetic_obs=image:84"], "--synthetic_obs: synthetic observation 'image:84'"),
        (["--env=libero_goal", "--libero_sim_cache=0"], "--libero_sim_cache=0 must be at least 1, or auto"),
        (["--env=libero_goal", "--libero_obs_mode=depth"], "--libero_obs_mode='depth' is not one of state, rgb"),
        (
            ["--env=CartPole-v1", "--libero_obs_mode=rgb"],
            "--libero_obs_mode (in the command line) is an option of --env=libero_spatial, libero_object, "
            "libero_goal, libero_10, libero_90, not of --env=CartPole-v1; drop it or change --env",
        ),
        (
            ["--async_rl=false", "--num_workers=3", "--num_envs_per_worker=4"],
            "--async_rl=False needs batch_size x num_batches_per_epoch (2048) to be a multiple of num_workers x "
            "num_envs_per_worker x rollout (384)",
        ),
        # Algorithms: registered names only, and group advantages need groups.
        (["--clip_mode=ppo"], "--clip_mode='ppo' is not one of ppo_clip, soft_clip, sapo, ce_gppo, cispo"),
        (["--advantage=reinforce"], "--advantage='reinforce' is not one of gae, vtrace, rloo, grpo"),
        (["--advantage=rloo"], "--task_group_size=1 makes groups of one: use --task_group_size=2 or more"),
        (["--advantage=grpo", "--task_group_size=4", "--async_rl=false"], "use --async_rl=true"),
        (["--group_loss_weighting=episode"], "--advantage=gae has no groups: use --advantage=rloo or grpo"),
        (["--sapo_tau_neg=0"], "--sapo_tau_neg=0.0 must be positive"),
        (["--cispo_eps_low=1.5"], "--cispo_eps_low=1.5 must be in [0, 1]"),
        (["--ce_gppo_dual_clip=0.9"], "--ce_gppo_dual_clip=0.9 must be above 1"),
        # Non-finite numbers: NaN compares false with every bound, inf passes "must be positive".
        (["--learning_rate=inf"], "--learning_rate='inf' is not a finite number"),
        (["--learning_rate=nan"], "--learning_rate='nan' is not a finite number"),
        (["--ppo_clip_ratio=nan"], "--ppo_clip_ratio='nan' is not a finite number"),
        (["--train_for_seconds=nan"], "--train_for_seconds='nan' is not a finite number"),
        (["--stop_at_return=-inf"], "--stop_at_return='-inf' is not a finite number: give a finite value; inf"),
        # Values that run but do harm: healthy workers named hung, a limit that means nothing, kills never healed.
        (["--hang_timeout_sec=0.5"], "--hang_timeout_sec=0.5 is within the workers' own pace"),
        (["--max_episode_steps=-3"], "--max_episode_steps=-3 must not be negative (0: the env's own)"),
        (["--chaos_kill_every_sec=1", "--max_respawns=0"], "give --max_respawns of 1 or more"),
        # Whole option names only, and a near miss named.
        (["--num_worker=2"], "unknown option --num_worker=2 (did you mean --num_workers?); see --help"),
        (["--no_such_option=1"], "unknown option --no_such_option=1; see --help"),
    ],
)
def test_invalid_values_raise_one_line_errors(tmp_path, args, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_config([*args, f"--train_dir={tmp_path}"])
    assert "\n" not in str(info.value)


def test_inf_stays_the_never_of_the_stop_conditions(tmp_path):
    assert parse_config(["--stop_at_return=inf", f"--train_dir={tmp_path}"]).run.stop_at_return == float("inf")


def test_synchronous_mode_accepts_a_batch_that_every_env_fills_equally(tmp_path):
    # 4 workers x 16 envs x 32 steps = 2048 = batch_size x num_batches_per_epoch: one rollout per env per update.
    cfg = parse_config(["--async_rl=false", "--num_workers=4", "--num_envs_per_worker=16", f"--train_dir={tmp_path}"])
    assert cfg.samples_per_training_batch == 4 * 16 * 32


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--env=CartPol-v1"], "unknown env 'CartPol-v1': did you mean CartPole-v1"),
        (["--num_envs_per_worker=5", "--worker_num_splits=2"], "is not divisible by --worker_num_splits=2"),
        (["--train_for_env_steps=-5"], "--train_for_env_steps=-5 must be at least 1"),
        (["--lerning_rate=1e-3"], "unknown option --lerning_rate=1e-3 (did you mean --learning_rate?)"),
        (
            ["--env=multitask_reach", "--advantage=rloo", "--task_group_size=64"],
            "a group of --task_group_size=64 episodes of up to 40 steps (2560 samples) does not fit a training "
            "batch of --batch_size x --num_batches_per_epoch = 2048: use --num_batches_per_epoch=3 or more",
        ),
    ],
)
@pytest.mark.slow
def test_cli_bad_input_exits_2_with_a_clear_message(train_dir, args, expected):
    result = run_train(train_dir, "bad", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command, own_option",
    [
        ("sfengine.train", "--replay_ratio"),
        ("sfengine.evaluate", "--video_per_task"),
        ("sfengine.pretrain", "--keep_weights"),
        ("sfengine.demos", "--demos_per_task"),
    ],
)
def test_help_and_a_misspelt_option_are_answered_before_torch_is_imported(tmp_path, command, own_option):
    # Importing torch takes seconds: the built-in envs and algorithms register their parts by name, so reading the
    # option names needs none of it, and the commands answer --help and a misspelt option from the names alone.
    for args, code in ((["--help"], 0), (["--num_worker=2"], 2)):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", command, *args], cwd=tmp_path, capture_output=True, text=True
        )
        modules = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
        assert result.returncode == code and "sfengine.config" in modules and "torch" not in modules, result.stderr[
            -500:
        ]
        assert code or own_option in result.stdout  # the whole help: the algorithms' groups, the command's own
    assert f"{command}: error: unknown option --num_worker=2 (did you mean --num_workers?)" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo=sac", "--replay_size=-1"], "--replay_size=-1 must hold at least one trajectory"),
        (["--clip_mode=ppo"], "--clip_mode='ppo' is not one of ppo_clip, soft_clip, sapo, ce_gppo, cispo"),
        (["--advantage=rloo", "--task_group_size=1"], "--task_group_size=1 makes groups of one"),
    ],
)
def test_a_value_that_breaks_a_rule_is_answered_before_torch_is_imported(tmp_path, args, message):
    # The rules (an algorithm's, the clip modes' and group advantages' names) need no torch either: the one line
    # comes in a fraction of a second, not after the seconds a run's start takes.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sfengine.train", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    modules = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time")]
    assert result.returncode == 2 and "torch" not in modules, result.stderr[-500:]
    assert len(errors) == 1 and errors[0].startswith("sfengine.train: error: ") and message in errors[0], errors


def test_what_reading_the_options_prints_comes_once_and_before_the_error(tmp_path):
    # The options are read twice, before torch and again by the run; a saved run's retired option is named once.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps({"learner": {"an_option_since_removed": 1}}))
    command = [sys.executable, "-m", "sfengine.train", f"--train_dir={tmp_path}", "--experiment=old"]
    result = subprocess.run([*command, "--algo=sac", "--replay_size=-1"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("ignoring an_option_since_removed") == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith("sfengine.train: error: --replay_size=-1"), result.stderr


@pytest.mark.slow
def test_what_reading_the_options_prints_comes_once_in_a_run(tmp_path, train_dir):
    (train_dir / "old").mkdir(parents=True)
    (train_dir / "old" / "config.json").write_text(json.dumps({"learner": {"an_option_since_removed": 1}}))
    result = run_train(train_dir, "old", "--env=CartPole-v1", "--train_for_env_steps=512", "--rollout=16")
    assert result.returncode == 0 and result.stderr.count("ignoring an_option_since_removed") == 1, result.stderr


def test_help_works_outside_the_repository(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sfengine.train", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0
    for group in ("sampler:", "learner:", "model:", "run:"):
        assert group in result.stdout
    # Each env's own options form a group under the env's name, naming the envs that take them.
    words = " ".join(result.stdout.split())
    assert "synthetic: options of --env=synthetic --synthetic_step_ms FLOAT" in words
    assert "libero: options of --env=libero_spatial, libero_object, libero_goal, libero_10, libero_90" in words
    # --cfg lists the shipped presets with what each is for.
    assert "mujoco: Continuous control with dense rewards" in words and "pendulum: Pendulum-v1" in words


def test_continuous_control_preset_runs_the_reference_ppo_shape(tmp_path):
    cfg = parse_config(["--cfg=mujoco", "--env=Hopper-v5", f"--train_dir={tmp_path}"])
    assert cfg.model.actor_critic == "separate" and cfg.model.normalize_returns
    assert (cfg.learner.num_epochs, cfg.samples_per_training_batch, cfg.learner.entropy_coeff) == (10, 2048, 0.0)
    # HalfCheetah's preset is that one with a narrower start and twice the optimiser steps per sample.
    cheetah = parse_config(["--cfg=halfcheetah", f"--train_dir={tmp_path}"])
    assert cheetah.env.env == "HalfCheetah-v5" and cheetah.model.actor_critic == "separate"
    assert (cheetah.model.initial_log_std, cheetah.samples_per_training_batch, cheetah.learner.batch_size) == (
        -1.5,
        1024,
        256,
    )


def test_env_options_are_saved_with_the_run_and_kept_on_resume(tmp_path):
    cfg = parse_config(["--env=synthetic", "--synthetic_step_ms=3", f"--train_dir={tmp_path}"])
    assert cfg.own_env_options.synthetic_step_ms == 3.0
    assert "libero" not in cfg.to_dict()  # only the run's own env's options
    cfg.experiment_dir.mkdir()
    save_config(cfg, cfg.experiment_dir / "config.json")
    resumed = parse_config(["--env=synthetic", f"--train_dir={tmp_path}"])
    assert resumed.own_env_options.synthetic_step_ms == 3.0


def test_a_config_saved_when_every_env_option_was_in_the_env_group_still_resumes(tmp_path):
    # Before envs declared their own options, config.json held all of them, of every env, under "env".
    old = Config().to_dict()
    old["env"].update(env="synthetic", synthetic_step_ms=3.0, libero_obs_mode="state", libero_sim_cache=1)
    (tmp_path / "default_experiment").mkdir()
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    cfg = parse_config([f"--train_dir={tmp_path}"])
    assert cfg.env.env == "synthetic" and cfg.own_env_options.synthetic_step_ms == 3.0


def test_a_config_saved_before_the_advantage_option_resumes_with_the_same_estimator(tmp_path):
    old = Config().to_dict()
    del old["ppo"]["advantage"]
    old["learner"]["with_vtrace"] = True
    (tmp_path / "default_experiment").mkdir()
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    assert parse_config([f"--train_dir={tmp_path}"]).get("advantage") == "vtrace"


def test_a_saved_config_with_an_option_this_version_lacks_still_resumes_and_names_it(tmp_path, capsys):
    old = Config().to_dict()
    old["learner"].update(learning_rate=0.123, retired_option=1.0)
    (tmp_path / "default_experiment").mkdir()
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    assert parse_config([f"--train_dir={tmp_path}"]).learner.learning_rate == 0.123
    assert "ignoring retired_option" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown option 'retired_option'"):  # a user's own file still fails
        (tmp_path / "preset.yaml").write_text("retired_option: 1.0\n")
        parse_config([f"--cfg={tmp_path / 'preset.yaml'}", "--experiment=other", f"--train_dir={tmp_path}"])


@pytest.mark.parametrize("name", ["kl_coeff", "target_kl"])
def test_kl_options_must_be_non_negative_and_have_no_meaning_for_flow_sar(name):
    with pytest.raises(ConfigError, match=f"--{name}=-1.0 must not be negative"):
        parse_config([f"--{name}=-1"])
    with pytest.raises(ConfigError, match=f"--{name} .* is an option of --algo=ppo, not of --algo=flow_sar"):
        parse_config(
            [
                "--env=multitask_reach",
                "--algo=flow_sar",
                "--policy_head=flow",
                "--task_group_size=4",
                "--group_outcome=success",
                f"--{name}=0.1",
            ]
        )


@pytest.mark.parametrize("reference", ["name", "directory", "checkpoint file"])
def test_a_run_from_init_from_builds_the_network_its_weights_were_trained_in(tmp_path, reference):
    # A clone trained on 32-32 ReLU layers: fine-tuning it names neither, yet builds that network.
    clone = parse_config(
        ["--env=sparse_reach", "--activation=relu", "--hidden_sizes=32,32", "--learning_rate=0.1", "--experiment=bc"]
        + [f"--train_dir={tmp_path}"]
    )
    (tmp_path / "bc" / "checkpoints").mkdir(parents=True)
    save_config(clone, tmp_path / "bc" / "config.json")
    (tmp_path / "bc/checkpoints/c.pt").touch()
    source = {"name": "bc", "directory": tmp_path / "bc", "checkpoint file": tmp_path / "bc/checkpoints/c.pt"}
    args = ["--env=sparse_reach", f"--init_from={source[reference]}", "--experiment=tune", f"--train_dir={tmp_path}"]
    tuned = parse_config(args)
    assert tuned.model.activation == "relu" and tuned.model.hidden_sizes == clone.model.hidden_sizes
    assert tuned.learner.learning_rate == Config().learner.learning_rate  # only the network's options carry over
    assert parse_config([*args, "--hidden_sizes=64,64"]).model.hidden_sizes != clone.model.hidden_sizes  # CLI wins


def test_env_options_that_clash_with_existing_ones_are_refused_at_registration():
    @dataclass
    class Clashing:
        num_workers: int = option(1, "clashes with the engine's option")

    with pytest.raises(TypeError, match="num_workers already exist"):
        register_env("clashing_env", make_gymnasium_env, options=Clashing)


def test_auto_is_held_as_a_marker_that_survives_a_saved_config_and_a_process_boundary(tmp_path):
    import pickle

    from sfengine.config import AUTO

    cfg = parse_config(["--env=CartPole-v1", "--num_workers=auto", "--num_inference_workers=auto"])
    assert cfg.sampler.num_workers is AUTO and cfg.sampler.num_inference_workers is AUTO
    assert AUTO != -(2**31) and pickle.loads(pickle.dumps(cfg)).sampler.num_workers is AUTO  # spawned workers
    with pytest.raises(TypeError):
        cfg.sampler.num_workers + 1  # an unchosen value takes part in no arithmetic
    save_config(cfg, tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["sampler"]["num_workers"] == "auto"


def test_each_clip_mode_brings_its_own_target_kl_unless_the_run_sets_one(tmp_path):
    def target_kl(*args: str) -> float:
        return parse_config(["--cfg=cartpole", f"--train_dir={tmp_path}", *args]).get("target_kl")

    assert target_kl() == 0.0  # ppo_clip's clip is its trust region
    for mode in ("soft_clip", "sapo", "ce_gppo", "cispo"):
        assert target_kl(f"--clip_mode={mode}") == 0.01
    assert target_kl("--clip_mode=cispo", "--target_kl=0") == 0.0  # set by the run: kept, even to off
    assert target_kl("--clip_mode=sapo", "--target_kl=0.05") == 0.05
    saved = parse_config(["--cfg=cartpole", "--clip_mode=cispo", "--target_kl=0", f"--train_dir={tmp_path}"])
    saved.experiment_dir.mkdir(parents=True)
    save_config(saved, saved.experiment_dir / "config.json")
    assert target_kl("--clip_mode=cispo") == 0.0  # a resumed run keeps its saved setting


def test_a_run_resumed_with_another_algorithm_is_refused_by_that_not_by_an_option_it_never_gave(tmp_path):
    # The saved PPO run's --num_epochs=4 met SAC's rules first: "--num_epochs is PPO's: drop it", of an option the
    # user never passed.
    saved = parse_config(["--env=Pendulum-v1", f"--train_dir={tmp_path}", "--experiment=run"])
    saved.experiment_dir.mkdir(parents=True)
    save_config(saved, saved.experiment_dir / "config.json")
    with pytest.raises(ConfigError, match=r"'run' was trained with --algo=ppo, and this run asks --algo=sac: resume"):
        parse_config(["--algo=sac", f"--train_dir={tmp_path}", "--experiment=run"])
    assert parse_config([f"--train_dir={tmp_path}", "--experiment=run"]).learner.algo == "ppo"  # not given: kept
    restarted = parse_config(
        ["--algo=sac", f"--train_dir={tmp_path}", "--experiment=run", "--restart_behavior=restart"]
    )
    assert restarted.learner.algo == "sac"


def test_help_gives_each_default_once_and_each_presets_purpose_whole():
    from sfengine.config import build_parser
    from sfengine.config.files import preset_purpose, shipped_presets

    words = " ".join(build_parser().format_help().split())
    assert "(default: )" not in words  # an unset option says none, or its help says what unset means
    assert "(default: all) (default:" not in words and "(default: every task) (default:" not in words
    for path in shipped_presets().glob("*.yaml"):
        purpose = preset_purpose(path)
        assert purpose and "Defaults of" in purpose or f"{path.stem}: {purpose}" in words
        assert purpose.count("(") == purpose.count(")"), purpose  # a sentence, not a line cut in its middle


def test_evaluate_only_options_leave_the_training_command_and_old_saved_runs_resume_quietly(tmp_path, capsys):
    from sfengine.config import build_parser

    train_help = build_parser().format_help()
    for name in ("--checkpoint", "--video_per_task", "--episodes_per_init", "--eval_tasks", "--video_size"):
        assert f"{name} " not in train_help, name  # sfengine.evaluate's own (its --help's evaluate group)
    with pytest.raises(ConfigError):
        parse_config(["--video_per_task=1"])
    old = Config().to_dict()
    old["eval"].update(checkpoint="", video_per_task=0, video_size=256, episodes_per_init=1, eval_tasks=[])
    (tmp_path / "default_experiment").mkdir()
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    parse_config([f"--train_dir={tmp_path}"])
    assert "ignoring" not in capsys.readouterr().err


def test_ppo_settings_saved_in_the_learner_group_resume_into_ppos_own(tmp_path, capsys):
    # Until 2026-11-27 --ppo_clip_ratio, --target_kl, ... were the learner group's, and every run saved them there.
    old = Config().to_dict()
    moved = {"ppo_clip_ratio": 0.1, "ppo_clip_value": 0.0, "value_loss_coeff": 0.25, "kl_coeff": 0.5, "target_kl": 0.02}
    moved |= {"normalize_advantage": False, "vtrace_rho": 0.9, "vtrace_c": 0.8, "critic_warmup_batches": 3}
    for name in moved:
        del old["ppo"][name]
    old["learner"].update(moved)
    (tmp_path / "default_experiment").mkdir()
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    cfg = parse_config([f"--train_dir={tmp_path}"])
    assert {name: cfg.get(name) for name in moved} == moved
    assert all(name in cfg.to_dict()["ppo"] and name not in cfg.to_dict()["learner"] for name in moved)
    assert "ignoring" not in capsys.readouterr().err
    # A FlowSAR run saved then held them too (at their defaults): it resumes, they are not its options.
    old["learner"].update(algo="flow_sar", kl_coeff=0.0, target_kl=0.0, critic_warmup_batches=0)
    old["env"].update(env="sparse_reach", group_outcome="success", task_group_size=1)
    old["model"].update(policy_head="flow")
    (tmp_path / "default_experiment" / "config.json").write_text(json.dumps(old))
    assert parse_config([f"--train_dir={tmp_path}"]).own_groups() == ["flow_sar"]


def test_a_run_once_restarted_resumes_when_started_again_without_the_flag(tmp_path):
    cfg = parse_config([f"--train_dir={tmp_path}", "--restart_behavior=restart"])
    cfg.experiment_dir.mkdir()
    save_config(cfg, cfg.experiment_dir / "config.json")
    assert parse_config([f"--train_dir={tmp_path}"]).run.restart_behavior == "resume"
    assert parse_config([f"--train_dir={tmp_path}", "--restart_behavior=overwrite"]).run.restart_behavior == "overwrite"


def test_a_train_dir_that_cannot_hold_the_run_is_one_line_and_leaves_nothing(tmp_path, capsys):
    from sfengine import train

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    for train_dir, reason in [(a_file, "Not a directory"), (locked, "Permission denied")]:
        if reason == "Permission denied" and os.geteuid() == 0:
            continue  # root writes anywhere
        code = train.main(["--env=CartPole-v1", f"--train_dir={train_dir}", "--experiment=e"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"--train_dir={train_dir}: cannot write the run's files in {train_dir / 'e'} (" in err and reason in err
        assert "give a directory you can write to, on a disk with room" in err
    assert not (locked / "e").exists() and not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("name", ["hang_timeout_sec", "startup_timeout_sec", "respawn_window_sec"])
def test_the_watch_timeouts_must_be_non_negative(name):
    with pytest.raises(ConfigError, match=f"--{name}=-1.0 must not be negative"):
        parse_config([f"--{name}=-1"])
    assert getattr(parse_config([f"--{name}=0"]).run, name) == 0  # 0: that watch is off
