"""What a person reads in the terminal: the start block, the progress towards the stop condition, the end.

sfengine: PPO on CartPole-v1 (GAE), asynchronous (policy lag allowed)
  layout: 2 rollout workers x 8 envs (2 splits), 1 inference worker, learner on cpu; 1024 x 2 samples a batch
  stops at 300,000 env steps
  files:  train_dir/cartpole (config.json, checkpoints/, tensorboard/, summary.json)
  watch:  tensorboard --logdir train_dir/cartpole/tensorboard
... status lines: "steps 120,000 (40%, ETA 12s)" ...
done: reached 300,000 env steps in 21.4 s (14,020 FPS); return 487.20 over the last 100 episodes
  curves: python -m sfengine.plot --train_dir=train_dir --experiment=cartpole
"""

from __future__ import annotations

import math

from sfengine.algorithms import algorithm_for
from sfengine.config import Config


def start_block(cfg: Config, resumed_env_steps: int = 0, world_size: int = 1) -> str:
    s, lrn, run = cfg.sampler, cfg.learner, cfg.run
    algorithm = algorithm_for(cfg)
    details = f" ({algorithm.describe(cfg)})" if algorithm.describe else ""
    mode = (
        "serial mode (one process)"
        if s.serial_mode
        else (
            "asynchronous (policy lag allowed)"
            if s.async_rl
            else "synchronous (the envs wait for each update: policy lag 0)"
        )
    )
    stops = [f"{run.train_for_env_steps:,} env steps"]
    if run.train_for_seconds:
        stops.append(f"{run.train_for_seconds:g} s")
    if run.stop_at_return != math.inf:
        stops.append(f"a mean return of {run.stop_at_return:g}")
    if run.stop_at_success != math.inf:
        stops.append(f"a success rate of {run.stop_at_success:g}")
    ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
    lines = [
        f"sfengine: {algorithm.title or algorithm.name} on {cfg.env.env}{details}, {mode}",
        f"  layout: {s.num_workers} rollout workers x {s.num_envs_per_worker} envs ({s.worker_num_splits} splits), "
        f"{inference_layout(s.num_inference_workers)}, learner on "
        f"{lrn.device}{ranks}; {lrn.batch_size} x {lrn.num_batches_per_epoch} samples a batch, {lrn.num_epochs} epochs",
        f"  stops at {' or '.join(stops)}" + (f" (resumed at {resumed_env_steps:,})" if resumed_env_steps else ""),
        f"  files:  {cfg.experiment_dir} (config.json, checkpoints/, tensorboard/, summary.json)",
        f"  watch:  tensorboard --logdir {cfg.experiment_dir / 'tensorboard'}",
    ]
    if cfg.eval.eval_every_env_steps:
        lines.insert(3, f"  evaluates every {cfg.eval.eval_every_env_steps:,} env steps in a separate process")
    return "\n".join(lines)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress(cfg: Config, env_steps: int, initial_env_steps: int, elapsed: float, fps: float) -> str:
    """``40%, ETA 12s``: towards whichever stop condition comes first at the current speed."""
    run = cfg.run
    to_go = max(run.train_for_env_steps - env_steps, 0)
    fraction = env_steps / run.train_for_env_steps
    eta = to_go / fps if fps > 0 else math.inf
    if run.train_for_seconds:
        fraction = max(fraction, elapsed / run.train_for_seconds)
        eta = min(eta, max(run.train_for_seconds - elapsed, 0.0))
    return f"{100 * min(fraction, 1.0):.0f}%, ETA {format_duration(eta)}"


def end_summary(cfg: Config, summary: dict) -> str:
    """Two or three lines for a person, printed before the JSON line."""
    line = (
        f"done: {summary.get('stop_reason') or 'stopped'} in {summary['wall_seconds']:.1f} s "
        f"({summary['fps']:,.0f} FPS this run)"
    )
    if summary.get("episode_return_mean") is not None:
        line += f"; return {summary['episode_return_mean']:.2f}"
        if summary.get("success_rate") is not None:
            line += f", success {summary['success_rate']:.2f}"
        line += f" over the last {cfg.run.stats_window} episodes"
    if summary.get("exit_code"):
        line += f"; exit code {summary['exit_code']}"
    lines = [line]
    if "eval" in summary and summary["eval"]:
        last = summary["eval"][-1]
        lines.append(
            f"  {'final' if last.get('final') else 'last'} evaluation at {last['env_steps']:,} env steps: "
            + (f"success {last['success']:.2f}" if last.get("success") is not None else f"return {last['return']:.2f}")
        )
    lines.append(
        f"  curves: python -m sfengine.plot --train_dir={cfg.run.train_dir} --experiment={cfg.run.experiment}; "
        f"evaluate: python -m sfengine.evaluate --train_dir={cfg.run.train_dir} --experiment={cfg.run.experiment}"
    )
    return "\n".join(lines)


def inference_layout(num_inference_workers: int) -> str:
    if num_inference_workers == 0:
        return "each rollout worker acting itself"
    return f"{num_inference_workers} inference worker{'s' if num_inference_workers > 1 else ''}"
