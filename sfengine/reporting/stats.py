"""Run statistics, owned by the runner: FPS windows, episodes, learner figures and where the time goes."""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from sfengine.engine.messages import EpisodeStats, EvaluatorReport, InferenceReport, LearnerReport, WorkerReport

FPS_WINDOWS = (10, 60, 300)


class EnvCost:
    """Time inside env.step and env.reset, summed over rollout workers."""

    def __init__(self):
        self.steps = self.resets = 0
        self.step_sec = self.reset_sec = 0.0

    def add(self, report: WorkerReport) -> None:
        self.steps += report.env_steps
        self.resets += report.env_resets
        self.step_sec += report.env_step_sec - report.env_reset_sec
        self.reset_sec += report.env_reset_sec

    def means_ms(self) -> dict[str, float]:
        """``env_step_ms`` and ``env_reset_ms``, for those that happened."""
        means = {}
        if self.steps:
            means["env_step_ms"] = round(1000 * self.step_sec / self.steps, 3)
        if self.resets:
            means["env_reset_ms"] = round(1000 * self.reset_sec / self.resets, 3)
        return means


BAD_WINDOW_STEPS = 1000  # env steps over which the share of non-finite or failed ones is judged


class EnvHealth:
    """The env steps that raised (the env rebuilt, its episode dropped) or returned NaN or infinite values, from the
    rollout workers' reports: in all, and judged window by window (training and evaluation both stop on them)."""

    def __init__(self):
        self.failures = self.nonfinite = self.steps = 0
        self.window = [0, 0, 0]  # (non-finite steps, failed ones, env steps) since the last check of their share

    def add(self, report: WorkerReport) -> None:
        self.failures += report.env_failures
        self.nonfinite += report.nonfinite_steps
        self.steps += report.env_steps
        self.window = [
            self.window[0] + report.nonfinite_steps,
            self.window[1] + report.env_failures,
            self.window[2] + report.env_steps,
        ]

    def dominate(self, at_least: int = BAD_WINDOW_STEPS) -> str | None:
        """Why the run should stop, once at least ``at_least`` env steps show more than half of them non-finite, or
        more than half of them failed (the env raised): nothing is learned from them, no episode is played through;
        None otherwise (each window of that many steps is judged on its own)."""
        nonfinite, failed, steps = self.window
        if steps < at_least:
            return None
        self.window = [0, 0, 0]
        if failed > steps / 2:
            return f"the env raised in {failed:,} of its last {steps:,} steps ({REBUILT}): fix the env"
        if nonfinite > steps / 2:
            return (
                f"the env returned NaN or infinite observations or rewards in {nonfinite:,} of its last {steps:,} "
                "steps (their episodes are not learned from): fix the env, or clean its values in a wrapper"
            )
        return None

    def dropped(self) -> str | None:
        """What the env's failures dropped in all, in words, or None where none failed."""
        if not self.failures:
            return None
        return f"the env raised in {self.failures:,} of {self.steps:,} steps ({REBUILT})"


REBUILT = "each time it was rebuilt and its episode dropped; the first tracebacks are above"


class RunStats:
    def __init__(self, stats_window: int, initial_env_steps: int, task_names: list[str] | None = None):
        self.started = time.time()
        self.initial_env_steps = initial_env_steps
        self.env_steps = initial_env_steps
        self.policy_version = 0
        self.episodes = 0
        self.env_health = EnvHealth()
        self.returns: deque[float] = deque(maxlen=stats_window)
        self.lengths: deque[int] = deque(maxlen=stats_window)
        self.successes: deque[float] = deque(maxlen=stats_window)
        self.task_names = task_names or []
        self.task_successes: dict[int, deque[float]] = {}
        self.stats_window = stats_window
        self.windows_frozen = False  # the windows that reached a stop target, kept as they were (freeze_windows)
        self.step_history: deque[tuple[float, int]] = deque([(self.started, initial_env_steps)])
        self.learner_stats: dict[str, list[float]] = {}
        self.lag_sum = self.lag_count = 0.0
        self.final_learner_report = False
        self.env_cost_total = EnvCost()
        self.rank_env_steps: tuple[int, ...] = ()  # multi-rank: each rank's env steps in this run
        self.ranks_in_sync = True  # every exchange found the same weights on every rank
        self.first_batch: tuple[float, int] | None = None  # (time, env steps) of the first training batch
        self.last_batch: tuple[float, int] | None = None
        self._reset_time_split()

    def _reset_time_split(self) -> None:
        self.split_started = time.time()
        self.worker_env = self.worker_busy = self.worker_wall = 0.0
        self.inference_busy = self.inference_wall = 0.0
        self.inference_requests = self.inference_batches = 0
        self.learner_busy = self.batcher_busy = 0.0
        self.evaluator_busy = self.evaluator_wall = 0.0
        self.env_cost = EnvCost()

    def add_worker_report(self, report: WorkerReport) -> None:
        self.add_episodes(report.episodes)
        self.env_health.add(report)
        for cost in (self.env_cost, self.env_cost_total):
            cost.add(report)
        self.worker_env += report.env_step_sec
        self.worker_busy += report.busy_sec
        self.worker_wall += report.wall_sec

    def add_episodes(self, episodes: list[EpisodeStats]) -> None:
        for episode in episodes:
            self.episodes += 1
            if self.windows_frozen:
                continue
            self.returns.append(episode.episode_return)
            self.lengths.append(episode.length)
            if not math.isnan(episode.success):
                self.successes.append(episode.success)
                if episode.task >= 0:
                    per_task = self.task_successes.setdefault(episode.task, deque(maxlen=self.stats_window))
                    per_task.append(episode.success)

    def target_reached(self, stop_at_return: float, stop_at_success: float) -> str | None:
        """Why the run may stop early (``--stop_at_return``, ``--stop_at_success``), or None. Only a full window
        counts, so that a few lucky first episodes do not end a run."""
        window = self.stats_window
        for name, values, target, shown in (
            ("return", self.returns, stop_at_return, ".1f"),
            ("success", self.successes, stop_at_success, ".3f"),
        ):
            if len(values) == window and (mean := float(np.mean(values))) >= target:
                return f"the mean {name} of the last {window} episodes, {mean:{shown}}, reached --stop_at_{name}={target:g}"
        return None

    def freeze_windows(self) -> None:
        """Keep the episode windows as they are: the run stops at the target they reached, and its end line and
        summary.json report the windows that reached it, not those moved on by the episodes that finish while the
        run stops (a run stopped at a mean success of 0.800 would otherwise end saying 0.78). Episodes are still
        counted."""
        self.windows_frozen = True

    def add_inference_report(self, report: InferenceReport) -> None:
        self.inference_busy += report.busy_sec
        self.inference_wall += report.wall_sec
        self.inference_requests += report.requests
        self.inference_batches += report.batches

    def add_evaluator_report(self, report: EvaluatorReport) -> None:
        self.evaluator_busy += report.busy_sec
        self.evaluator_wall += report.wall_sec

    def add_learner_report(self, report: LearnerReport) -> None:
        self.add_episodes(report.other_ranks_episodes)
        self.rank_env_steps = report.rank_env_steps or self.rank_env_steps
        self.ranks_in_sync = self.ranks_in_sync and report.ranks_in_sync
        self.env_steps = report.env_steps
        self.policy_version = report.policy_version
        now = time.time()
        # The part of the update inside this status window: the part before it was counted, as an update under
        # way, in the windows it spanned (``time_split``).
        self.learner_busy += min(report.train_sec, now - self.split_started)
        self.batcher_busy += report.batcher_sec
        if report.env_steps > self.initial_env_steps and not report.final:
            self.first_batch = self.first_batch or (now, report.env_steps)
            self.last_batch = (now, report.env_steps)
        self.step_history.append((now, report.env_steps))
        while len(self.step_history) > 2 and self.step_history[1][0] < time.time() - max(FPS_WINDOWS):
            self.step_history.popleft()
        for name, value in report.stats.items():
            self.learner_stats.setdefault(name, []).append(value)
        if "policy_lag_mean" in report.stats:
            self.lag_sum += report.stats["policy_lag_mean"]
            self.lag_count += 1
        self.final_learner_report |= report.final

    def fps(self, window: float) -> float:
        now, steps = time.time(), self.env_steps
        past = [(t, s) for t, s in self.step_history if t >= now - window]
        t0, s0 = past[0] if past else self.step_history[-1]
        if len(past) < 2 and self.step_history:
            t0, s0 = self.step_history[0]
        return (steps - s0) / max(now - t0, 1e-6) if steps > s0 else 0.0

    def time_split(self, learner_busy_since: float = 0.0) -> dict[str, float]:
        """Fractions of wall time since the last call: rollout workers stepping envs / waiting for actions,
        inference and learner busy. ``learner_busy_since``: when the learner's update under way began (0: none), so
        that an update longer than a status window counts in every window it spans, not all in the one it ends in
        (an image critic's update on a CPU can take a minute)."""
        now = time.time()
        wall = max(now - self.split_started, 1e-6)
        if learner_busy_since > 0:
            self.learner_busy += now - max(learner_busy_since, self.split_started)
        worker_wall = max(self.worker_wall, 1e-6)
        split = {
            "env_step": self.worker_env / worker_wall,
            "wait_actions": max(0.0, 1.0 - self.worker_busy / worker_wall) if self.worker_wall else 0.0,
            "inference": self.inference_busy / max(self.inference_wall, 1e-6),
            "learner": min(1.0, self.learner_busy / wall),
            "batcher": self.batcher_busy / wall,
        }
        if self.evaluator_wall:
            split["evaluator"] = self.evaluator_busy / self.evaluator_wall
        self._reset_time_split()
        return split

    def env_cost_ms(self) -> dict[str, float]:
        """Mean time of one env.step and one env.reset, in ms, since the last time split: what the simulator
        costs, apart from the engine."""
        return self.env_cost.means_ms()

    def inference_requests_per_batch(self) -> float:
        """How well inference batches: split requests served per forward pass since the last time split."""
        return self.inference_requests / self.inference_batches if self.inference_batches else 0.0

    def take_learner_means(self) -> dict[str, float]:
        means = {name: float(np.mean(values)) for name, values in self.learner_stats.items() if values}
        self.learner_stats = {}
        return means

    def _steady_fps(self) -> float | None:
        """FPS from the first training batch to the last: the sampler's speed without start-up and shutdown."""
        if self.first_batch is None or self.last_batch is None or self.last_batch[0] <= self.first_batch[0]:
            return None
        return round((self.last_batch[1] - self.first_batch[1]) / (self.last_batch[0] - self.first_batch[0]), 1)

    def summary(self) -> dict:
        wall = time.time() - self.started
        summary = {
            "env_steps": int(self.env_steps),
            "env_steps_this_run": int(self.env_steps - self.initial_env_steps),
            "wall_seconds": round(wall, 3),
            "fps": round((self.env_steps - self.initial_env_steps) / max(wall, 1e-6), 1),
            "fps_steady": self._steady_fps(),
            "episodes": self.episodes,
            "env_failures": self.env_health.failures,
            "nonfinite_env_steps": self.env_health.nonfinite,
            "episode_return_mean": float(np.mean(self.returns)) if self.returns else None,
            "episode_len_mean": float(np.mean(self.lengths)) if self.lengths else None,
            "policy_lag_mean": self.lag_sum / self.lag_count if self.lag_count else None,
            "policy_version": self.policy_version,
            **self.env_cost_total.means_ms(),
        }
        if len(self.rank_env_steps) > 1:
            summary.update(rank_env_steps=list(self.rank_env_steps), ranks_in_sync=self.ranks_in_sync)
        if self.successes:
            summary["success_rate"] = float(np.mean(self.successes))
        if self.task_successes:
            summary["per_task_success"] = self.per_task_success()
        return summary

    def per_task_success_line(self) -> str:
        """Every task's recent success rate by task index, for the status line: ``0:0.40 1:0.10 2:- ...``
        (``-``: no episode of that task finished yet)."""
        num_tasks = max(len(self.task_names), max(self.task_successes, default=-1) + 1)
        return " ".join(
            f"{task}:{np.mean(self.task_successes[task]):.2f}" if task in self.task_successes else f"{task}:-"
            for task in range(num_tasks)
        )

    def per_task_success(self) -> dict[str, float]:
        """Success rate of the last ``stats_window`` episodes of each visited task, keyed by task name."""
        names = self.task_names
        return {
            (names[task] if task < len(names) else f"task_{task}"): float(np.mean(values))
            for task, values in sorted(self.task_successes.items())
        }
