"""``python -m sfengine.train``: parse the config, prepare the experiment directory, and run.

Exit codes: 0 finished (including a clean stop on SIGINT/SIGTERM), 1 the run failed, 2 bad input (configuration,
env name, checkpoint). Bad input is reported on one line.
"""

from __future__ import annotations

import sys

from sfengine.config import check_command_line, check_option_values
from sfengine.engine.fork_server import start_early

if __name__ == "__main__":
    # --help, a misspelt option and a bad value are answered from the declarations and rules alone, in a fraction of
    # a second; then this process imports torch and the components' modules, and forks the server that starts the
    # components from itself.
    check_command_line(sys.argv[1:], "sfengine.train")
    check_option_values(sys.argv[1:], "sfengine.train")
    start_early(sys.argv[1:])

import contextlib
import errno
import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sfengine.algorithms import Algorithm, algorithm_for
from sfengine.config import (
    Config,
    ConfigError,
    check_group_layout,
    env_defaults_preset,
    option_table,
    parse_config,
    save_config,
    validate,
)
from sfengine.engine.checkpoint import (
    CheckpointError,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    write_failure,
)
from sfengine.engine.distributed import RankInfo
from sfengine.engine.event_loop import end_process_now, start_command
from sfengine.engine.fork_server import component_context, stops_its_fork_server
from sfengine.engine.sizing import SAMPLER_LAYOUT, Machine, env_step_seconds, resolve_auto_options
from sfengine.env.check import EnvAPIError, EnvHang, check_env_api, first_line, time_limit
from sfengine.env.multitask import TaskInfo, selected_init_states, task_info
from sfengine.env.registry import EnvFactory, env_context, env_sizer, resolve_env_factory
from sfengine.env.spaces import ActionSpec, ObsSpec, UnsupportedSpaceError, action_spec_from_space, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.policy import choose_inference_backend
from sfengine.numpy_backend.step import choose_learner_backend
from sfengine.reporting.progress import start_block

log = logging.getLogger("sfengine")
MIN_FREE_MIB = 16  # a run's config, first checkpoints and event files


def checkpoint_to_resume(cfg: Config) -> dict | None:
    """The latest checkpoint of the experiment under --restart_behavior=resume (None: a fresh start)."""
    return load_latest_checkpoint(cfg.experiment_dir) if cfg.run.restart_behavior == "resume" else None


def prepare_experiment_dir(cfg: Config, ranks: RankInfo) -> None:
    """Apply --restart_behavior and write the run's config.json. Only rank 0 changes the directory. Called once
    the run's settings are known to fit what it resumes: a refused resume leaves config.json as it was."""
    directory = cfg.experiment_dir
    behavior = cfg.run.restart_behavior
    if ranks.rank != 0:
        return
    if directory.exists() and behavior == "overwrite":
        shutil.rmtree(directory)
    elif directory.exists() and behavior == "restart":
        aside = directory.with_name(f"{directory.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        directory.rename(aside)
        print(f"previous run of '{cfg.run.experiment}' moved to {aside}", flush=True)
    existed = directory.is_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        save_config(cfg, directory / "config.json")
        check_room(directory)
    except OSError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)  # nothing of a run that did not start stays behind
        raise ConfigError(
            f"--train_dir={cfg.run.train_dir}: cannot write the run's files in {directory} ({write_failure(exc, directory)}); "
            "give a directory you can write to, on a disk with room"
        ) from None


def check_room(directory) -> None:
    """A run needs room for its checkpoints: a disk with under MIN_FREE_MIB free is refused at start."""
    free = shutil.disk_usage(directory).free
    if free < MIN_FREE_MIB * 2**20:
        raise OSError(errno.ENOSPC, f"{free / 2**20:.1f} MiB free")


def check_trained_tasks(cfg: Config, tasks: TaskInfo | None, ranks: RankInfo) -> None:
    """``--tasks`` names tasks the env has, and every rank gets at least one (task, init state) pair of them."""
    if tasks is None:
        if cfg.env.tasks:
            raise ConfigError(f"--tasks={cfg.env.tasks}: '{cfg.env.env}' is not a multi-task env; drop --tasks")
        return
    try:
        pairs = sum(selected_init_states(tasks, cfg.env.tasks, "--tasks"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if ranks.world_size > pairs:
        raise ConfigError(
            f"{ranks.world_size} ranks but only {pairs} (task, init state) pairs to train on in '{cfg.env.env}': "
            "every rank needs one; run fewer ranks"
        )


def probe_env(
    cfg: Config, factory: EnvFactory, checked: Callable[[Any, dict | None], None] | None = None
) -> tuple[ObsSpec, ActionSpec, TaskInfo | None]:
    """Build one env in this process to learn its spaces (and tasks, for a multi-task env), reset it and play one
    step to check it keeps gymnasium's API and its spaces (sfengine.env.check), then close it. ``checked(env,
    reset_options)`` is called with the env once it has passed (train times its step there). Each of these must
    return within --startup_timeout_sec."""
    limit = cfg.run.startup_timeout_sec
    stage = "its factory"
    try:
        with time_limit(limit):
            env = factory(env_context(cfg, -1, 0, cfg.env.seed))
            stage = "its first reset and step (the start's check of the env)"
            spaces = check_probed_env(cfg, env, checked)
            stage = "close()"
            closed = close_env(env)
    except EnvHang:
        raise ConfigError(
            f"env '{cfg.env.env}': {stage} did not return within {limit:g} s (--startup_timeout_sec; the stack it "
            "was in is above): fix the hang, or raise --startup_timeout_sec if the env takes that long"
        ) from None
    except Exception as exc:  # noqa: BLE001  (any failure here is a failure to build the user's env)
        if stage != "its factory":
            raise
        raise ConfigError(f"env '{cfg.env.env}' could not be created: {type(exc).__name__}: {exc}") from None
    if closed is not None:  # (after the checks' own error, which says more, where there was one)
        raise ConfigError(f"env '{cfg.env.env}': close() raised {closed}; the workers close their envs too")
    return spaces


def check_probed_env(
    cfg: Config, env, checked: Callable[[Any, dict | None], None] | None
) -> tuple[ObsSpec, ActionSpec, TaskInfo | None]:
    """``probe_env``'s checks of a built env: its spaces, one reset and one step; closed where one fails."""
    if not (hasattr(env, "action_space") and hasattr(env, "observation_space")):
        raise ConfigError(
            f"env '{cfg.env.env}': its factory returned {type(env).__name__}, not an env with an action_space and an "
            "observation_space: return the env from it"
        )
    if algorithm_for(cfg).grouped(cfg) and not cfg.env.max_episode_steps:
        # Groups are batched whole, so their size in samples must be known: take the env's own step limit.
        cfg.env.max_episode_steps = episode_step_limit(env)
    try:
        action_spec = action_spec_from_space(env.action_space, cfg.model.action_chunk)
        if cfg.model.policy_head == "flow" and action_spec.discrete:
            raise UnsupportedSpaceError(
                f"--policy_head=flow generates continuous actions; this env's are {env.action_space}: use a Box env"
            )
        obs_spec, tasks = obs_spec_from_space(env.observation_space), task_info(env)
        first = {"task": cfg.env.tasks[0] if cfg.env.tasks else 0, "init_state": 0} if tasks is not None else None
        check_env_api(env, obs_spec, cfg.env.seed, first)
        if checked is not None:
            checked(env, first)
    except (UnsupportedSpaceError, EnvAPIError) as exc:
        close_env(env)
        raise ConfigError(f"env '{cfg.env.env}': {exc}") from None
    return obs_spec, action_spec, tasks


def close_env(env) -> str | None:
    """Close ``env``; what its close() raised, in one line, or None."""
    try:
        env.close()
    except Exception as exc:  # noqa: BLE001 - the env's own code
        return first_line(exc)
    return None


def episode_step_limit(env) -> int:
    """The env's step limit: gymnasium's registered one, or a ``max_episode_steps`` attribute; 0 if it has none."""
    spec = getattr(env, "spec", None)
    if spec is not None and spec.max_episode_steps:
        return int(spec.max_episode_steps)
    return int(getattr(env.unwrapped, "max_episode_steps", 0) or 0)


def build_model(
    cfg: Config,
    obs_spec: ObsSpec,
    action_spec: ActionSpec,
    resume_state: dict | None,
    init_from: tuple[Path, dict] | None = None,
) -> ActorCritic:
    """The run's model: seeded from --seed, then the checkpoint it resumes, or the one of --init_from."""
    torch.manual_seed(cfg.env.seed)
    model = ActorCritic.for_config(cfg, obs_spec, action_spec)
    if resume_state is not None:
        try:
            model.load_state_dict(resume_state["model"])
        except RuntimeError as exc:
            raise resume_misfit(cfg, "policy", exc) from None
    elif init_from is not None:
        path, state = init_from
        try:
            critic = model.load_initial_state(state["model"])
        except ValueError as exc:
            raise CheckpointError(
                f"--init_from: {path} does not fit env '{cfg.env.env}' with these model settings ({exc}); give the "
                "env and observations it was trained with, and drop the network options that differ from its run's "
                "(a checkpoint in its run's checkpoints/ folder brings them)" + init_from_env_hint(path, cfg.env.env)
            ) from None
        critic_note = "" if model.value_head is None else " and critic" if critic else "; the critic starts afresh"
        print(
            f"starting from the weights of {path} (--init_from): policy, observation statistics{critic_note}; a "
            "fresh optimiser at step 0",
            flush=True,
        )
    return model


def check_resumed_algorithm(cfg: Config, algorithm: Algorithm, resume_state: dict | None) -> None:
    """A run resumes with the algorithm it was trained with (another would start its trainer afresh over the
    other's policy): checked before the policy is loaded, so the refusal names the cause."""
    trained_with = saved_settings(cfg).get("algo", algorithm.name) if resume_state is not None else algorithm.name
    if trained_with != algorithm.name:
        raise CheckpointError(
            f"'{cfg.run.experiment}' was trained with --algo={trained_with}, and this run asks --algo="
            f"{algorithm.name}: resume it with --algo={trained_with}, or start a new --experiment from its "
            "checkpoint with --init_from"
        )


def check_trainer_fits(cfg: Config, algorithm: Algorithm, model: ActorCritic, resume_state: dict | None) -> None:
    """The trainer's part of the checkpoint a run resumes fits the run's settings (SAC's and TD3's critics):
    checked here, before anything starts, rather than in the learner's process once every worker runs."""
    if resume_state is None or algorithm.check_resume is None or algorithm.name not in resume_state:
        return
    try:
        algorithm.check_resume(cfg, model, resume_state[algorithm.name])
    except (RuntimeError, KeyError) as exc:
        raise resume_misfit(cfg, f"{algorithm.title or algorithm.name} trainer", exc) from None


def resume_misfit(cfg: Config, part: str, exc: Exception) -> CheckpointError:
    """A one-line refusal of a checkpoint that does not fit: its first mismatch, and the settings this run changes
    from the run's own config.json (the usual cause)."""
    changed = changed_settings(cfg)
    cause = f"; this run changes {changed} from its config.json" if changed else ""
    return CheckpointError(
        f"the latest checkpoint of '{cfg.run.experiment}' does not fit this run's {part} ({load_mismatch(exc)})"
        f"{cause}: resume with the run's settings, or start afresh with --restart_behavior=restart"
    )


def load_mismatch(exc: Exception) -> str:
    """The first mismatch of a failed ``load_state_dict``, short: ``net.0.weight is [2, 4, 256] in the checkpoint,
    [4, 4, 256] here`` or ``not in the checkpoint: "value_head.weight", ...``."""
    if isinstance(exc, KeyError):
        return f"it keeps no {exc}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if not line.startswith("Error(s) in loading")), lines[0] if lines else "")
    shapes = re.match(
        r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[.*?\])\) from "
        r"checkpoint, the shape in current model is torch\.Size\((\[.*?\])\)",
        detail,
    )
    if shapes:
        name, saved, here = shapes.groups()
        return f"{name} is {saved} in the checkpoint, {here} here"
    detail = detail.replace("Missing key(s) in state_dict:", "not in the checkpoint:").replace(
        "Unexpected key(s) in state_dict:", "only in the checkpoint:"
    )
    return detail if len(detail) <= 160 else detail[:157] + "..."


def saved_settings(cfg: Config) -> dict:
    """The options in the run's saved config.json, flat, read quietly (parsing the config has already named what
    it ignores there); {} where there is none or it cannot be read."""
    try:
        nested = json.loads((cfg.experiment_dir / "config.json").read_text())
        return {name: value for group in nested.values() for name, value in group.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def changed_settings(cfg: Config) -> str:
    """``--num_critics 2 -> 4, ...``: the options that shape networks (the env, the algorithm, the model's and the
    algorithm's own options) whose value differs from the run's saved config.json; "" if none or none saved."""
    table = option_table()
    shaping = {"model", *cfg.own_groups()}
    changes = []
    for name, before in saved_settings(cfg).items():
        info = table.get(name)
        if info is None or (info.group not in shaping and name not in ("env", "algo")):
            continue
        now = cfg.get(name)
        if now != before and not (isinstance(now, (list, tuple)) and list(now) == before):
            changes.append(f"--{name} {format_value(before)} -> {format_value(now)}")
    return ", ".join(changes)


def format_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def init_from_env_hint(path: Path, env: str) -> str:
    """`` (it was trained on --env=X)`` when the checkpoint's run says so and X is not ``env``."""
    saved = path.parent.parent / "config.json"
    try:
        trained_on = json.loads(saved.read_text())["env"]["env"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f" (its run was on --env={trained_on})" if trained_on != env else ""


def load_init_from(cfg: Config, resuming: bool) -> tuple[Path, dict] | None:
    """The checkpoint of --init_from: a checkpoint file, or the latest of an experiment (a directory, or a name in
    --train_dir). A run that resumes from a checkpoint of its own ignores it, and says so: rerunning the command
    that started it continues it."""
    source = cfg.run.init_from
    if not source:
        return None
    if resuming:
        print(
            f"--init_from={source} ignored: '{cfg.run.experiment}' resumes from its own checkpoint "
            "(--restart_behavior=restart starts it over from --init_from)",
            flush=True,
        )
        return None
    path = find_checkpoint(source, cfg.run.train_dir, "--init_from")
    try:
        return path, load_checkpoint(path)
    except CheckpointError as exc:
        raise CheckpointError(f"--init_from: {exc}") from None


def wants_layout(cfg: Config, ranks: RankInfo) -> bool:
    """Whether the run's algorithm would choose its own sampler layout (``Algorithm.layout``) here: nothing gives
    one, and the run has one rank (ranks that timed their envs apart could choose apart)."""
    given = cfg.chosen.intersection(SAMPLER_LAYOUT)
    return algorithm_for(cfg).layout is not None and not given and ranks.world_size == 1


def algorithm_layout(cfg: Config, step_sec: float) -> str | None:
    """The algorithm's layout for an env step of ``step_sec``, and its line; the engine's where that layout would
    not fit the run's other options."""
    before = {name: value for group in cfg.to_dict().values() for name, value in group.items()}
    line = algorithm_for(cfg).layout(cfg, step_sec)
    try:
        validate(cfg)
    except ConfigError:
        for name, value in before.items():
            cfg.set(name, value)
        return None
    return line


def inference_dtype_warning(cfg: Config, obs_spec: ObsSpec) -> str | None:
    """Why --inference_dtype=bfloat16 would not help here, if it would not."""
    if cfg.sampler.inference_dtype != "bfloat16":
        return None
    if not any(obs_spec.is_image(key) for key in obs_spec.shapes):
        return (
            "--inference_dtype=bfloat16 changes nothing here: only CNN encoders use it, and no observation is an image"
        )
    if cfg.learner.device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "--inference_dtype=bfloat16: this CPU has no native bfloat16, so inference gets slower; use float32"
    return None


@stops_its_fork_server
def main(argv: list[str] | None = None) -> int:
    ranks = RankInfo.from_environment()
    start_command()
    try:
        cfg = parse_config(argv)
        if not cfg.sampler.serial_mode:
            component_context()  # the fork server, if the command's start did not fork it (main() called by a script)
        factory = resolve_env_factory(cfg.env.env)
        step_sec: list[float] = []

        def time_step(env, reset_options: dict | None) -> None:
            try:
                step_sec.append(env_step_seconds(env, reset_options))
            except Exception:  # noqa: BLE001  (the workers rebuild an env that fails; the engine's layout stays)
                log.warning("env '%s' failed in a timed step; keeping the engine's sampler layout", cfg.env.env)

        obs_spec, action_spec, tasks = probe_env(cfg, factory, time_step if wants_layout(cfg, ranks) else None)
        env_defaults = env_defaults_preset(cfg.env.env)
        resumed = cfg.run.restart_behavior == "resume" and (cfg.experiment_dir / "config.json").is_file()
        if env_defaults is not None and not resumed:
            print(f"defaults for --env={cfg.env.env} from {env_defaults}", flush=True)
        if step_sec and (layout := algorithm_layout(cfg, step_sec[0])):
            print(layout, flush=True)
        sizing = resolve_auto_options(cfg, env_sizer(cfg.env.env), tasks, Machine.here(ranks.local_world_size))
        if sizing:
            print(sizing, flush=True)
        check_group_layout(cfg)
        if warning := inference_dtype_warning(cfg, obs_spec):
            print(f"warning: {warning}", flush=True)
        check_trained_tasks(cfg, tasks, ranks)
        resuming = cfg.run.restart_behavior == "resume" and bool(list_checkpoints(cfg.experiment_dir))
        # --init_from is read and fitted before --restart_behavior moves or deletes a directory, and a checkpoint
        # that does not fit leaves every directory as it was. (A run that starts from it resumes nothing.)
        init_from = load_init_from(cfg, resuming)
        if init_from is not None:
            model = build_model(cfg, obs_spec, action_spec, None, init_from)
        algorithm = algorithm_for(cfg)
        if cfg.learner.demos and not algorithm.demos:
            raise ConfigError(
                f"--algo={cfg.learner.algo} does not learn from --demos: clone them first (python -m sfengine.pretrain "
                "--demos=...) and fine-tune the clone with --init_from, or keep them in the replay of --algo=sac or td3"
            )
        if algorithm.check is not None:
            algorithm.check(cfg, obs_spec, action_spec)  # its rules on the env's spaces (SAC: the replay fits)
        # What a resumed run loads must fit its settings before its directory (config.json) changes.
        resume_state = checkpoint_to_resume(cfg)
        if init_from is None:
            check_resumed_algorithm(cfg, algorithm, resume_state)
            model = build_model(cfg, obs_spec, action_spec, resume_state)
            check_trainer_fits(cfg, algorithm, model, resume_state)
        # --inference_backend=numpy or --learner_backend=numpy on a policy they cannot run: say so before any
        # directory is touched (the choice depends on the model's structure, not its weights).
        choose_inference_backend(cfg, model)
        choose_learner_backend(cfg, model)
        prepare_experiment_dir(cfg, ranks)
    except (ConfigError, CheckpointError) as exc:
        print(f"sfengine.train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in the checks: an env whose first reset or step does not return, say
        print(
            "sfengine.train: interrupted before the run started (in its checks of the env and options)", file=sys.stderr
        )
        return 130
    if resume_state is not None:  # said once the checkpoint has been fitted: a refused resume resumes nothing
        print(f"resuming '{cfg.run.experiment}' from {list_checkpoints(cfg.experiment_dir)[-1]}", flush=True)
    if resume_state is not None and resume_state["env_steps"] >= cfg.run.train_for_env_steps:
        print(
            f"'{cfg.run.experiment}' already has {resume_state['env_steps']} env steps >= --train_for_env_steps="
            f"{cfg.run.train_for_env_steps}; raise it to train further",
            flush=True,
        )
        return 0  # nothing to train: starting the workers would only wait for a batch the learner may not take
    from sfengine.engine.wiring import run

    if ranks.rank == 0:
        print(start_block(cfg, resume_state["env_steps"] if resume_state else 0, ranks.world_size), flush=True)
    return run(cfg, factory, obs_spec, action_spec, model, resume_state, tasks)


if __name__ == "__main__":
    end_process_now(main())
