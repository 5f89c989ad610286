"""``python -m sfengine.evaluate``: how good is this checkpoint?

    python -m sfengine.evaluate --experiment=spatial                   # latest checkpoint, every (task, init) once
    python -m sfengine.evaluate --checkpoint=PATH --env=libero_object --video_per_task=2
    torchrun --nproc_per_node=2 -m sfengine.evaluate --experiment=spatial
    python -m sfengine.evaluate --experiment=spatial_rl --compare_to=spatial  # McNemar's test against its evaluation

The checkpoint's policy acts through the engine's own rollout and inference workers (``sfengine.evaluation``),
with the distribution's mode unless ``--eval_deterministic=false``. The run's saved ``config.json`` supplies the
env and model settings; the command line overrides them. The worker layout (the options that take ``auto``) is
chosen afresh for the evaluation unless given here. Multi-task envs run
every (task, init state) of the rank's shard ``--episodes_per_init`` times; single-task envs run
``--eval_episodes`` episodes with seeds 0..N-1. Results go to ``<experiment>/eval/<checkpoint>/`` (see
``sfengine.evaluation.report``), videos to its ``videos/``.

Exit codes: 0 every episode ran, 1 the evaluation failed or was interrupted (the episodes that finished are
still written, and the same command with ``--resume`` plays only the missing ones: sfengine.evaluation.resume), 2
bad input, reported on one line before anything is written.
"""

from __future__ import annotations

import sys

from sfengine.config import check_command_line
from sfengine.engine.fork_server import start_early
from sfengine.evaluation.options import EvaluateOptions, evaluate_parser

if __name__ == "__main__":
    # --help and a misspelt option are answered from the option names (sfengine.train's way); then this process
    # imports torch and forks the server that starts the workers from itself.
    check_command_line(sys.argv[1:], "sfengine.evaluate", evaluate_parser())
    start_early(sys.argv[1:])

import argparse
import datetime
import time
from pathlib import Path

import numpy as np

from sfengine.config import (
    AUTO,
    Config,
    ConfigError,
    auto_capable_options,
    command_options,
    parse_config,
)
from sfengine.engine.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from sfengine.engine.cpu_threads import set_cpu_threads
from sfengine.engine.distributed import RankInfo
from sfengine.engine.event_loop import end_process_now, start_command
from sfengine.engine.fork_server import component_context, stops_its_fork_server
from sfengine.engine.messages import EpisodeStats
from sfengine.engine.sizing import Machine, resolve_auto_options
from sfengine.env.multitask import TaskInfo
from sfengine.env.registry import EnvFactory, env_context, env_sizer, resolve_env_factory
from sfengine.evaluation.compare import SAMPLED_SUFFIX, comparison_line, find_results, paired_test
from sfengine.evaluation.episode_queue import EvalEpisode, evaluated_init_states, evaluation_episodes
from sfengine.evaluation.evaluator import run_evaluation
from sfengine.evaluation.report import EvalReport, write_atomic
from sfengine.evaluation.resume import (
    check_fits,
    load_partial,
    progress_files,
    progress_path,
    remove_progress,
    still_to_play,
)
from sfengine.evaluation.video import EvalOutput
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.policy import choose_inference_backend
from sfengine.reporting.reporter import json_text
from sfengine.train import probe_env

GATHER_TIMEOUT = datetime.timedelta(hours=12)  # ranks finish their shards at different times


def locate_checkpoint(argv: list[str]) -> list[str]:
    """With ``--checkpoint=PATH`` and no ``--experiment``, the run is the one the checkpoint belongs to
    (``<train_dir>/<experiment>/checkpoints/<file>``), so its saved config applies (an off-policy checkpoint
    builds no policy without it), whatever ``--train_dir`` says. A file outside a run's checkpoints/ folder is
    evaluated in ``--train_dir``'s default experiment, or beside itself."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("--checkpoint", "--experiment", "--train_dir"):
        pre.add_argument(name)
    known, _ = pre.parse_known_args(argv)
    if not known.checkpoint or known.experiment:
        return argv
    path = Path(known.checkpoint).resolve()
    in_a_run = path.parent.name == "checkpoints" and (path.parent.parent / "config.json").is_file()
    if known.train_dir and not in_a_run:
        return argv
    experiment_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return [*argv, f"--train_dir={experiment_dir.parent}", f"--experiment={experiment_dir.name}"]


def acting(cfg: Config) -> str:
    """How the evaluated policy acts, for the header: its mode or samples; a residual policy over a base's sampled
    action draws that sample in every episode, so its evaluations differ by that draw even in mode."""
    kind = "mode" if cfg.eval.eval_deterministic else "sampled"
    options = cfg.algorithm_options
    if getattr(options, "residual_over", "") and options.residual_base_action == "sample":
        return f"the base's sampled action plus the correction's {'mean' if kind == 'mode' else 'sample'}"
    return kind


def relayout(cfg: Config, given: set[str]) -> None:
    """The training run's worker layout was sized for training (a learner beside the workers, every env cycling
    through all tasks); an evaluation sizes its own, so the ``auto`` options not given on this command line go
    back to ``auto``. Training's ``--tasks`` goes too: ``--eval_tasks`` chooses what is evaluated, and an env
    would build the simulators of training's tasks at start."""
    for name in auto_capable_options(cfg):
        if name not in given:
            cfg.set(name, AUTO)
    cfg.env.tasks = []


def resolve_checkpoint(cfg: Config, options: EvaluateOptions) -> Path:
    if options.checkpoint:
        path = Path(options.checkpoint)
        if not path.is_file():
            raise CheckpointError(f"--checkpoint={path}: no such file")
        return path
    checkpoints = list_checkpoints(cfg.experiment_dir)
    if not checkpoints:
        raise CheckpointError(
            f"experiment '{cfg.run.experiment}' has no checkpoint in {cfg.experiment_dir / 'checkpoints'}; train it "
            "first, or give --checkpoint=PATH (and --train_dir= where the experiment lives)"
        )
    return checkpoints[-1]


def load_policy(cfg: Config, path: Path, obs_spec, action_spec) -> tuple[ActorCritic, dict]:
    state = load_checkpoint(path)
    model = ActorCritic.for_config(cfg, obs_spec, action_spec)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        detail = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).splitlines()[0])
        raise CheckpointError(
            f"checkpoint {path} does not fit env '{cfg.env.env}' with these model settings ({detail}); evaluate "
            "it on the env and settings it was trained with"
        ) from None
    return model, state


def check_renderer(cfg: Config, factory: EnvFactory, tasks: TaskInfo | None, video_size: int) -> None:
    """--video_per_task needs frames: build one env as the workers will, reset it, and render once."""
    ctx = env_context(cfg, -1, 0, cfg.env.seed, video_size)
    try:
        env = factory(ctx)
        try:
            env.reset(seed=0, options={"task": 0, "init_state": 0} if tasks else None)
            frame = env.render()
        finally:
            env.close()
    except Exception as exc:  # noqa: BLE001  (whatever fails here, the fix is the same)
        frame, reason = None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    else:
        reason = "render() returned no rgb frame"
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] >= 3):
        raise ConfigError(
            f"--video_per_task: env '{cfg.env.env}' cannot render frames ({reason}); install a renderer (LIBERO: "
            "Mesa EGL, apt-get install libegl1) or use an env with render_mode rgb_array, or drop --video_per_task"
        )


def join_ranks(ranks: RankInfo) -> None:
    """Under torchrun, the ranks' group, joined as the evaluation starts, while torchrun's store answers: a torchrun
    killed alone leaves its ranks running, and a group joined at the end would wait hours for a store that is gone.
    Joined, the ranks reach each other directly, so they finish and gather their episodes (gather_episodes)."""
    if ranks.world_size > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=GATHER_TIMEOUT)


def start_over(out_dir: Path, empty: EvalReport, settings: dict) -> None:
    """A new evaluation (not --resume) takes ``out_dir`` over at once: an empty results.json of its settings, and no
    ranks' progress files of the one before, so that whatever it leaves if killed is its own for --resume (an older
    results.json left beside its ranks' first progress files would not merge with them). A failed write is said
    and the evaluation goes on: its progress lines try again."""
    remove_progress(progress_files(out_dir))
    try:
        empty.write(out_dir, {**settings, "complete": False, "wall_sec": 0.0})
    except OSError as exc:
        print(f"sfengine.evaluate: {out_dir} could not be started over ({exc}); going on", file=sys.stderr)


def gather_episodes(episodes: list[EpisodeStats], ranks: RankInfo) -> list[EpisodeStats]:
    """Every rank's episodes on rank 0 (the others get theirs back), through the group join_ranks joined."""
    if ranks.world_size == 1:
        return episodes
    import torch.distributed as dist

    try:
        gathered: list[list[EpisodeStats] | None] = [None] * ranks.world_size
        dist.all_gather_object(gathered, episodes)
    finally:
        dist.destroy_process_group()
    return [episode for rank_episodes in gathered for episode in rank_episodes]


@stops_its_fork_server
def main(argv: list[str] | None = None) -> int:
    ranks = RankInfo.from_environment()
    start_command()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = evaluate_parser()
        options, rest = command_options(EvaluateOptions, locate_checkpoint(argv))
        cfg = parse_config(rest, parser)
        relayout(cfg, given=set(vars(parser.parse_args(rest))))
        checkpoint = resolve_checkpoint(cfg, options)
        if not cfg.sampler.serial_mode:
            component_context()  # the fork server, if the command's start did not fork it (main() called by a script)
        factory = resolve_env_factory(cfg.env.env)
        obs_spec, action_spec, tasks = probe_env(cfg, factory)
        if options.video_per_task:
            check_renderer(cfg, factory, tasks, options.video_size)
        machine = Machine.here(ranks.local_world_size)
        sizing = resolve_auto_options(cfg, env_sizer(cfg.env.env), tasks, machine, evaluation=True)
        model, state = load_policy(cfg, checkpoint, obs_spec, action_spec)
        choose_inference_backend(cfg, model)
        pairs = evaluated_init_states(tasks, options.eval_tasks, options.eval_init_states) if tasks else None
        if options.compare_to:  # every rank: one that refused alone would leave the others waiting for it
            baseline = find_results(options.compare_to, cfg.run.train_dir, cfg.eval.eval_deterministic, cfg.env.env)
        ev = cfg.eval
        # Sampled actions give other figures than the mode: each keeps its own folder, so neither overwrites the
        # other.
        out_dir = cfg.experiment_dir / "eval" / (checkpoint.stem + ("" if ev.eval_deterministic else SAMPLED_SUFFIX))

        def episodes_of(rank: int) -> list[EvalEpisode]:
            return evaluation_episodes(
                tasks,
                rank,
                ranks.world_size,
                options.episodes_per_init,
                ev.eval_episodes,
                options.video_per_task,
                options.eval_tasks,
                options.eval_init_states,
            )

        episodes, kept, wall_before, stale = episodes_of(ranks.rank), [], 0.0, []
        if options.resume:  # every rank reads it: each plays what is missing of its own share
            settings = {"env": cfg.env.env, "policy_version": int(state["policy_version"])}
            settings |= {"deterministic": ev.eval_deterministic, "episodes_per_init": options.episodes_per_init}
            if not tasks:
                settings["episodes_per_init"] = None
            partial = load_partial(out_dir, settings)
            if partial.complete:
                if ranks.rank == 0:
                    print(f"the evaluation in {out_dir} is complete ({len(partial.episodes)} episodes): nothing to do")
                return 0
            check_fits(partial.episodes, [e for rank in range(ranks.world_size) for e in episodes_of(rank)])
            kept, wall_before, stale = partial.episodes, partial.wall_sec, partial.progress_files
            episodes = still_to_play(episodes, kept)
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"sfengine.evaluate: error: {exc}", file=sys.stderr)
        return 2
    expected = sum(pairs) * options.episodes_per_init if tasks else ev.eval_episodes
    settings = {
        "checkpoint": str(checkpoint),
        "env": cfg.env.env,
        "policy_version": int(state["policy_version"]),
        "env_steps": int(state["env_steps"]),
        "deterministic": ev.eval_deterministic,
        "episodes_per_init": options.episodes_per_init if tasks else None,
        "expected_episodes": expected,
        "world_size": ranks.world_size,
    }

    def report_of(finished: list[EpisodeStats]) -> EvalReport:
        return EvalReport(
            finished, tasks.task_names if tasks else None, tasks.instructions if tasks else None, cfg.env.env
        )

    if ranks.rank == 0 and not options.resume:
        start_over(out_dir, report_of([]), settings)
    join_ranks(ranks)  # no rank plays before rank 0 has started the folder over
    set_cpu_threads(1)
    output = EvalOutput(
        str(out_dir / "videos") if options.video_per_task else None,
        options.video_size,
        cfg.env.env,
        tasks.task_names if tasks else [],
    )
    s = cfg.sampler
    if ranks.rank == 0:
        what = (
            f"{sum(1 for count in pairs if count)} tasks, {sum(pairs)} (task, init state) pairs x "
            f"{options.episodes_per_init}"
            if tasks
            else f"{ev.eval_episodes} episodes (seeds 0..{ev.eval_episodes - 1})"
        )
        print(
            f"evaluating {checkpoint} (policy version {state['policy_version']}, {state['env_steps']:,} env steps)\n"
            f"  env {cfg.env.env}: {what}; actions: {acting(cfg)}\n"
            f"  {s.num_workers} rollout workers x {s.num_envs_per_worker} envs ({s.worker_num_splits} splits)"
            + (f", {ranks.world_size} ranks" if ranks.world_size > 1 else "")
            + (f"; {sizing}" if sizing else "")
            + (f"\n  resuming: {len(kept)} episodes kept from the evaluation cut short" if options.resume else "")
            + f"\n  results: {out_dir}",
            flush=True,
        )
    started = time.time()

    progress_failed = False

    def write_progress(played: list[EpisodeStats]) -> None:
        """The results so far, rewritten at each progress line: what a killed evaluation leaves for --resume (rank 0:
        results.json; any other rank: its progress file, the episodes it played). A failed write (a full
        disk) is said once and the evaluation goes on: its end tries again."""
        nonlocal progress_failed
        so_far = {**settings, "complete": False, "wall_sec": round(time.time() - started + wall_before, 2)}
        try:
            if ranks.rank == 0:
                report_of(kept + played).write(out_dir, so_far)
                remove_progress(stale)
                stale.clear()
            else:
                out_dir.mkdir(parents=True, exist_ok=True)
                rows = report_of(played).rows()
                write_atomic(progress_path(out_dir, ranks.rank, started), json_text(so_far | {"episodes": rows}))
        except OSError as exc:
            if not progress_failed:
                print(f"sfengine.evaluate: the results so far could not be written ({exc}); going on", file=sys.stderr)
            progress_failed = True

    finished, error = [], None
    if episodes:  # a resumed rank may have nothing left of its share
        finished, error = run_evaluation(
            cfg,
            factory,
            obs_spec,
            action_spec,
            model,
            int(state["policy_version"]),
            episodes,
            output,
            ranks.rank == 0,
            write_progress,
        )
    wall = time.time() - started + wall_before
    if error is None and len(finished) != len(episodes):
        error = f"{len(finished)} episodes finished of {len(episodes)}"
    finished = kept + gather_episodes(finished, ranks)
    if ranks.rank != 0:
        return 0 if error is None else 1
    report = report_of(finished)
    settings |= {"complete": error is None and len(finished) == expected, "wall_sec": round(wall, 2)}
    comparison = None
    if options.compare_to:
        test = paired_test(baseline[1], {"episodes": report.rows()})
        settings["compared_to"] = {"results": str(baseline[0]), **test}
        comparison = comparison_line(baseline[0], test)
    report.write(out_dir, settings)
    remove_progress(progress_files(out_dir))  # every rank's episodes are in results.json now
    print(f"\n{report.markdown()}\n", flush=True)
    if comparison:
        print(comparison, flush=True)
    overall = report.overall
    rate = f"success {overall.success_rate:.3f}, " if overall.success_rate is not None else ""
    print(
        f"{len(finished)} episodes in {wall:.1f} s: {rate}mean return {overall.return_mean:.2f}; written to {out_dir}",
        flush=True,
    )
    if error is not None:
        print(
            f"sfengine.evaluate: the evaluation did not complete: {error}; the same command with --resume plays "
            "only the missing episodes",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    end_process_now(main())
