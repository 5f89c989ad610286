"""What the runner reports: the status line every --report_every_sec (progress, FPS, return and success, where
the time goes, the learner's losses), TensorBoard's scalars, and at the end summary.json.

``Reporting`` is a part of the ``Runner`` (sfengine.engine.runner), kept apart so that each reads as one job: it reads
the runner's statistics (``RunStats``) and writer."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os

from sfengine.reporting.progress import progress
from sfengine.reporting.stats import FPS_WINDOWS

log = logging.getLogger(__name__)


class Reporting:
    """The status line and the run's summary (mixed into ``Runner``)."""

    def algorithm_status(self, learner: dict[str, float]) -> str | None:
        """The algorithm's own words on its last update (``Algorithm.status``), or None."""
        from sfengine.algorithms import algorithm_for

        status = algorithm_for(self.cfg).status
        return status(self.cfg, learner) if status is not None and learner else None

    def learner_busy_since(self) -> float:
        """When the learner's update (or save) under way began, from its clock in shared memory; 0: none (or a serial
        run, whose status line never prints during an update)."""
        watch = getattr(self, "hang_watch", None)
        if watch is None or watch.learner_clock is None:
            return 0.0
        return float(watch.learner_clock[0])

    def _status(self) -> None:
        if not self.leads:
            return
        stats, summary = self.stats, self.stats.summary()
        fps = {w: stats.fps(w) for w in FPS_WINDOWS}
        requests_per_batch = stats.inference_requests_per_batch()
        env_cost = stats.env_cost_ms()
        split = stats.time_split(self.learner_busy_since())
        learner = stats.take_learner_means()
        ret = summary["episode_return_mean"]
        done = progress(self.cfg, stats.env_steps, stats.initial_env_steps, summary["wall_seconds"], fps[60] or fps[10])
        line = (
            f"[{summary['wall_seconds']:7.1f}s] steps {stats.env_steps:>10,} ({done})  FPS "
            + "/".join(f"{fps[w]:.0f}" for w in FPS_WINDOWS)
            # "-" until measured: no episode finished yet, no batch trained since the last line.
            + f" (10/60/300s)  return {'-' if ret is None else round(ret, 2)}"
            + (f"  success {summary['success_rate']:.2f}" if "success_rate" in summary else "")
            + (f"  lag {learner['policy_lag_mean']:.1f}" if "policy_lag_mean" in learner else "  lag -")
            + (f"  env failures {stats.env_health.failures}" if stats.env_health.failures else "")
            + (f"  non-finite env steps {stats.env_health.nonfinite:,}" if stats.env_health.nonfinite else "")
            + (f"  respawns {self.respawner.stats.total}" if self.respawner and self.respawner.stats.total else "")
            + (f"  tensorboard off ({self.writer.dropped:,} dropped)" if self.writer and self.writer.failure else "")
            + (
                f"  checkpoints failing ({learner['checkpoint_save_failures']:.0f})"
                if learner.get("checkpoint_save_failures")
                else ""
            )
            + "".join(
                f"  env {name.removeprefix('env_').removesuffix('_ms')} {value:{'.1f' if value >= 1 else '.3g'}} ms"
                for name, value in env_cost.items()
            )
            + "  time: "
            + " ".join(f"{name} {100 * value:.0f}%" for name, value in split.items())
        )
        print(line, flush=True)
        if stats.task_successes:
            print(f"           success per task: {stats.per_task_success_line()}", flush=True)
        if (words := self.algorithm_status(learner)) is not None:
            print(f"           learner: {words}", flush=True)
        if self.writer is None:
            return
        step = stats.env_steps
        for w in FPS_WINDOWS:
            self.writer.add_scalar(f"perf/fps_{w}s", fps[w], step)
        for name, value in split.items():
            self.writer.add_scalar(f"perf/time_{name}", value, step)
        self.writer.add_scalar("perf/inference_requests_per_batch", requests_per_batch, step)
        for name, value in env_cost.items():
            self.writer.add_scalar(f"perf/{name}", value, step)
        for name in ("episode_return_mean", "episode_len_mean", "success_rate", "env_failures"):
            if summary.get(name) is not None:
                self.writer.add_scalar(f"episodes/{name}", summary[name], step)
        for name, value in learner.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        for name, value in summary.get("per_task_success", {}).items():
            self.writer.add_scalar(f"tasks/{name}/success", value, step)
        if self.respawner is not None:
            respawns = self.respawner.stats
            self.writer.add_scalar("failures/respawns", respawns.total, step)
            self.writer.add_scalar("failures/respawn_dropped_trajectories", respawns.dropped_trajectories, step)
            self.writer.add_scalar("failures/respawn_seconds_lost", respawns.seconds_lost, step)

    def finish(self) -> dict:
        """Write summary.json (rank 0) and close TensorBoard; called once the loop has exited."""
        self.judge_progress()
        summary = self.stats.summary()
        summary.update(stop_reason=self.stop_reason, exit_code=self.exit_code, world_size=self.ranks.world_size)
        if self.respawner is not None:
            summary.update(self.respawner.stats.as_dict())
        if self.evaluations:
            summary["eval"] = self.evaluations
        if not self.leads:
            return summary
        if self.writer is not None:
            self._status()  # the learner's statistics since the last status, or a run shorter than one has none
            self.writer.close()
            if self.writer.failure is not None:
                summary.update(tensorboard_failure=self.writer.failure, tensorboard_dropped=self.writer.dropped)
        write_summary(self.cfg.experiment_dir / "summary.json", summary)
        return summary

    def judge_progress(self) -> None:
        """A run stopped by its clock (not by the user) that learned from no env step did not succeed, whatever
        kept it from them (workers that crashed at every start, an env too slow to fill one batch): exit code 1."""
        stats = self.stats
        if self.exit_code or self.interrupts or stats.env_steps > stats.initial_env_steps:
            return
        if stats.env_steps >= self.cfg.run.train_for_env_steps:
            return  # resumed at its step target: nothing was left to do
        if stats.env_health.steps == 0:
            why = "the rollout workers took no env step (the lines above say why)"
        else:
            why = (
                f"{stats.env_health.steps:,} env steps were sampled and no training batch "
                f"({self.cfg.samples_per_training_batch:,} samples) was complete: give it more time"
            )
        self.exit_code = 1
        self.stop_reason = f"{self.stop_reason or 'stopped'}; no env step was learned from: {why}"
        log.error("the run learned from no env step, exit code 1: %s", why)

    def forced_summary(self, reason: str, exit_code: int) -> None:
        """summary.json at a forced exit (a second SIGINT): what the statistics hold now, without waiting for
        anything (TensorBoard is not closed)."""
        if not self.leads:
            return
        summary = self.stats.summary()
        summary.update(stop_reason=reason, exit_code=exit_code, world_size=self.ranks.world_size)
        write_summary(self.cfg.experiment_dir / "summary.json", summary)


def json_text(data, indent: int | None = 2) -> str:
    """``data`` as strict JSON: a NaN or infinite number (a loss that diverged) becomes null, which every JSON
    reader takes, where Python's bare NaN is not JSON."""

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(data), indent=indent, allow_nan=False)


def write_summary(path, summary: dict) -> None:
    """summary.json through a temp file and a rename; a disk that refuses it is logged, not raised: the run's
    end (its exit code, its processes' cleanup) must not depend on it."""
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json_text(summary))
        os.replace(tmp, path)
    except OSError as exc:
        log.error(
            "summary.json not written in %s (%s); the run's figures are in its last status line", path.parent, exc
        )
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
