"""A group of envs stepped side by side: the one env-stepping loop of training, evaluation and the training evaluator.

    EnvGroup.reset(i) --> source.next(i, ...) --> EpisodeStart (seed, options, task, init state, video) or None
    EnvGroup.step(actions) --> each active env plays its action (a chunk: its env actions in turn) -->
        rewards, terminated, truncated, steps per env; next_obs; the episodes that ended (stats, videos written,
        the source told of successes), each replaced by the source's next; a failing simulator rebuilt

Where episodes come from is the strategy: an ``EpisodeSource``. Training's rollout workers take free-running resets
(``SeedSource``) or the run's task sequence (``SequenceSource``: multi-task envs and group advantages); an
evaluation's workers draw from the shared episode queue (``QueueSource``); the training evaluator plays a list
(``ListSource``). A source that has no episode left for an env stops it (``active[i]`` is False).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any, NamedTuple

import numpy as np

from sfengine.engine.buffers import NO_ENV
from sfengine.engine.messages import EpisodeStats
from sfengine.env.check import EnvHang, time_limit
from sfengine.env.registry import EnvContext, EnvFactory
from sfengine.env.spaces import obs_as_dict
from sfengine.evaluation.episode_queue import SINGLE_TASK, EvalEpisode, SharedEpisodeQueue
from sfengine.evaluation.video import EpisodeVideo, EvalOutput
from sfengine.tasks.scheduler import Assignment
from sfengine.tasks.sequence import SharedTaskSequence, single_task_group_seed

log = logging.getLogger(__name__)

NO_SUCCESS = math.nan  # an episode whose env reports no 'success'


class EpisodeStart(NamedTuple):
    """How an env begins its next episode."""

    seed: int | None
    options: dict[str, Any] | None = None
    task: int = SINGLE_TASK
    init_state: int = -1  # multi-task: the init state; a single-task evaluation: the episode's seed
    position: int = -1  # the episode's position in the task sequence (group advantages) or the evaluation's queue
    video: bool = False


class EpisodeSource:
    """Where an env's episodes come from: the strategy ``EnvGroup`` asks at every reset."""

    def next(self, env: int, task: int, default_seed: int | None) -> EpisodeStart | None:
        """Env ``env`` (playing ``task``) resets: its next episode, or None when there is none left for it.
        ``default_seed``: the env's own seed at its first reset, None afterwards."""
        raise NotImplementedError

    def record(self, task: int, success: bool) -> None:
        """An episode of ``task`` ended with a known success."""


class SeedSource(EpisodeSource):
    """Free-running: the env's own seed at its first reset, none after (the env's RNG carries on)."""

    def next(self, env: int, task: int, default_seed: int | None) -> EpisodeStart | None:
        return EpisodeStart(default_seed)


class SequenceSource(EpisodeSource):
    """Training with a task sequence: every reset draws the run's next (task, init state) and its position, and
    records the draw where a respawned worker finds it (row ``row`` of the split arrays)."""

    def __init__(self, sequence: SharedTaskSequence, row: int, splits_np: dict[str, np.ndarray], base_seed: int):
        self.sequence, self.row, self.base_seed = sequence, row, base_seed
        self.assignments, self.positions, self.drawing = (
            splits_np["assignments"],
            splits_np["positions"],
            splits_np["drawing"],
        )

    def next(self, env: int, task: int, default_seed: int | None) -> EpisodeStart | None:
        episode, position = self.sequence.next_with_position(functools.partial(self._record_draw, env))
        self.assignments[self.row, env] = (episode.task, episode.init_state)
        self.positions[self.row, env] = position
        if episode.task != SINGLE_TASK:
            options = {"task": episode.task, "init_state": episode.init_state}
            return EpisodeStart(default_seed, options, episode.task, episode.init_state, position)
        # Single-task groups: the G episodes of a group start from the same seed.
        seed = single_task_group_seed(self.base_seed, episode.init_state)
        return EpisodeStart(seed, None, episode.task, episode.init_state, position)

    def _record_draw(self, env: int, assignment: Assignment, position: int) -> None:
        """Where a respawn finds the draw if this process dies before the env takes it: the position last, so the
        record is whole once its position is there."""
        self.drawing[self.row, env, :2] = assignment
        self.drawing[self.row, env, 2] = position

    def record(self, task: int, success: bool) -> None:
        self.sequence.record(task, success)


def evaluation_start(episode: EvalEpisode | None, default_seed: int | None) -> EpisodeStart | None:
    """An evaluation episode's start: a multi-task env gets its (task, init state), a single-task env resets with
    the episode's seed."""
    if episode is None:
        return None
    if episode.task == SINGLE_TASK:
        return EpisodeStart(episode.init_state, None, SINGLE_TASK, episode.init_state, episode.position, episode.video)
    options = {"task": episode.task, "init_state": episode.init_state}
    return EpisodeStart(default_seed, options, episode.task, episode.init_state, episode.position, episode.video)


class QueueSource(EpisodeSource):
    """An evaluation's workers: the shared queue's next episode, drawn in the name of rollout worker ``worker`` (what
    a respawn hands out again); each env keeps to its task while it has episodes left (one simulator a task)."""

    def __init__(self, queue: SharedEpisodeQueue, worker: int):
        self.queue, self.worker = queue, worker

    def next(self, env: int, task: int, default_seed: int | None) -> EpisodeStart | None:
        return evaluation_start(self.queue.next(task, self.worker), default_seed)

    def record(self, task: int, success: bool) -> None:
        self.queue.record(task, success)


class ListSource(EpisodeSource):
    """The training evaluator: the episodes of its evaluation under way, in order (``pending``, refilled per
    evaluation)."""

    def __init__(self):
        self.pending: list[EvalEpisode] = []

    def next(self, env: int, task: int, default_seed: int | None) -> EpisodeStart | None:
        # Its multi-task envs reset with no seed: the (task, init state) fixes the start.
        return evaluation_start(self.pending.pop(0), None) if self.pending else None


NONFINITE_LOGGED = 3  # lines an EnvGroup logs about non-finite values; the rest are counted
ENV_CLOSE_TIMEOUT_SEC = 10.0  # a process's envs' close() at the stop, all together; past it, they are left to its exit
FAILURES_LOGGED = 3  # tracebacks an EnvGroup logs of resets and steps that raised; the rest are counted


def all_finite(obs) -> bool:
    """No NaN or infinity in a (dict) observation's float arrays. A small array is checked as a Python list (cheaper
    than numpy's isfinite at a handful of values: this runs at every env step)."""
    if isinstance(obs, dict):
        return all(all_finite(value) for value in obs.values())
    array = obs if isinstance(obs, np.ndarray) else np.asarray(obs)
    if array.dtype.kind != "f":
        return True
    if array.size <= 64:
        return all(map(math.isfinite, (array if array.ndim == 1 else array.ravel()).tolist()))
    return bool(np.isfinite(array).all())


class EnvGroup:
    """``len(contexts)`` envs, built by ``factory``, their episodes from ``source``. ``gamma`` discounts a chunk's
    rewards to its first step; ``videos``: where recorded episodes go (evaluation); ``stepping``: a one-element
    array that names the env being stepped (-1 between steps), for the hang watch; ``name``: for logs."""

    def __init__(
        self,
        factory: EnvFactory,
        contexts: list[EnvContext],
        source: EpisodeSource,
        chunk: int = 1,
        gamma: float = 1.0,
        videos: EvalOutput | None = None,
        stepping: np.ndarray | None = None,
        name: str = "worker",
    ):
        self.factory, self.contexts, self.source = factory, contexts, source
        self.chunk, self.gamma, self.output, self.stepping, self.name = chunk, gamma, videos, stepping, name
        self.envs = [factory(ctx) for ctx in contexts]
        n = len(self.envs)
        self.returns = np.zeros(n, dtype=np.float64)
        self.lengths = np.zeros(n, dtype=np.int64)
        self.tasks = np.full(n, SINGLE_TASK, dtype=np.int64)  # the task each env is playing
        self.init_states = np.full(n, -1, dtype=np.int64)  # and its init state (evaluation: or seed)
        self.positions = np.full(n, -1, dtype=np.int64)  # each episode's task-sequence position
        self.active = np.zeros(n, dtype=bool)  # False: the source had no episode left for the env
        self.started = np.zeros(n, dtype=bool)  # reset once (the env's own seed is used up)
        self.videos: dict[int, EpisodeVideo] = {}
        self.obs: list[dict | None] = [None] * n  # what each env shows now
        self.finished: list[EpisodeStats] = []  # since the owner last took them
        self.failures = self.steps_taken = self.resets = 0
        self.nonfinite = 0  # steps whose observation or reward was NaN or infinite (their episodes dropped)
        self.nonfinite_logged = 0
        self.failures_logged = 0
        self.step_sec = self.reset_sec = 0.0

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, i: int) -> dict | None:
        """Start env i's next episode: its first observation, or None if the source has none left (env stops)."""
        started = time.perf_counter()
        default_seed = None if self.started[i] else self.contexts[i].seed
        start = self.source.next(i, int(self.tasks[i]), default_seed)
        self.started[i] = True
        self.active[i] = start is not None
        if start is None:
            self.obs[i] = None
            return None
        self.tasks[i], self.init_states[i], self.positions[i] = start.task, start.init_state, start.position
        try:
            obs, info = self.envs[i].reset(seed=start.seed, options=start.options)
        except Exception:  # noqa: BLE001  (a failed reset is handled like a failed step: rebuild once)
            self._count_failure(i, "reset failed; rebuilding the env")
            self._rebuild(i)
            obs, info = self.envs[i].reset(seed=start.seed, options=start.options)
        if start.video and self.output is not None:
            caption = info.get("instruction") or self.output.task_label(start.task, start.init_state)
            self.videos[i] = EpisodeVideo(self.output.video_size, caption, self.envs[i].render())
        self.reset_sec += time.perf_counter() - started
        self.resets += 1
        self.obs[i] = obs = obs_as_dict(obs)
        if not all_finite(obs):  # nothing to drop yet: the values are masked, and counted
            self._count_nonfinite(i, "its reset")
            self.obs[i] = obs = {
                key: np.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0) for key, value in obs.items()
            }
        return obs

    def step(self, actions: np.ndarray) -> None:
        """Each active env plays its row of ``actions`` (a chunk: ``[chunk, ...]`` env actions in turn; an episode
        that ends inside it drops the rest). Results, per env: ``rewards`` (a chunk's, discounted to its first
        step), ``terminated``, ``truncated`` (a failed step counts as a cut), ``chunk_steps``; ``obs`` (the next
        episode's first after an end; None for an env that stopped); ``ended``: (env, episode stats or None for a
        failure); ``cut``: (env, final obs, the scale of its value) for truncated episodes."""
        n, chunk = len(self.envs), self.chunk
        self.rewards = np.zeros(n, dtype=np.float32)
        self.terminated = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.chunk_steps = np.zeros(n, dtype=np.int64)
        self.ended: list[tuple[int, EpisodeStats | None]] = []
        self.cut: list[tuple[int, dict, float]] = []
        env_started = time.perf_counter()
        for i, env in enumerate(self.envs):
            if not self.active[i]:
                continue
            if self.stepping is not None:
                self.stepping[0] = i
            discount, reward_sum, obs = 1.0, 0.0, None
            for j in range(chunk):
                self.chunk_steps[i] = j + 1
                try:
                    obs, reward, term, trunc, info = env.step(actions[i, j] if chunk > 1 else actions[i])
                except Exception:  # noqa: BLE001  (a simulator failure costs one episode, never the run)
                    obs = self._replace_failed(i)
                    self.truncated[i] = True
                    self.ended.append((i, None))
                    reward_sum = 0.0
                    break
                if not (math.isfinite(reward) and all_finite(obs)):
                    obs = self._drop_nonfinite(i, reward)
                    self.truncated[i] = True
                    self.ended.append((i, None))
                    reward_sum = 0.0
                    break
                reward_sum += discount * reward
                discount *= self.gamma
                if i in self.videos:
                    self.videos[i].add(env.render())
                if term or trunc:
                    self.terminated[i], self.truncated[i] = term, trunc and not term
                    self.ended.append((i, self._end_episode(i, float(reward), info)))
                    if self.truncated[i]:
                        # A chunk's successor is gamma^K away; one cut after j+1 steps is gamma^(j+1) away from the
                        # final observation, so its value is scaled by gamma^(j+1-K) to match.
                        self.cut.append((i, obs_as_dict(obs), self.gamma ** (j + 1 - chunk)))
                    obs = self.reset(i)
                    break
                self.returns[i] += reward
                self.lengths[i] += 1
            self.rewards[i] = reward_sum
            if obs is not None:
                self.obs[i] = obs_as_dict(obs)
        if self.stepping is not None:
            self.stepping[0] = NO_ENV
        self.step_sec += time.perf_counter() - env_started
        self.steps_taken += int(self.chunk_steps.sum())

    def _end_episode(self, i: int, last_reward: float, info: dict) -> EpisodeStats:
        success = info.get("success", info.get("is_success", NO_SUCCESS))
        if not math.isnan(success):
            self.source.record(int(self.tasks[i]), bool(success))
        episode = EpisodeStats(
            float(self.returns[i] + last_reward),
            int(self.lengths[i] + 1),
            float(success),
            int(self.tasks[i]),
            int(self.init_states[i]),
            int(self.positions[i]),
        )
        self.finished.append(episode)
        if i in self.videos:
            self.output.write_video(self.videos.pop(i), episode)
        self.returns[i], self.lengths[i] = 0.0, 0
        return episode

    def _drop_nonfinite(self, i: int, reward: float) -> dict | None:
        """A step whose observation or reward is NaN or infinite: its episode is dropped as a failed step's is
        (for learning, cut at the last good observation), and the env starts its next one."""
        self._count_nonfinite(i, f"a step (reward {reward})")
        self.returns[i], self.lengths[i] = 0.0, 0
        self.videos.pop(i, None)
        return self.reset(i)

    def _count_nonfinite(self, i: int, where: str) -> None:
        self.nonfinite += 1
        self.nonfinite_logged += 1
        if self.nonfinite_logged <= NONFINITE_LOGGED:
            log.warning(
                "%s: %s returned a NaN or infinite value; its episode is not learned from%s",
                self.describe(i),
                where,
                "" if self.nonfinite_logged < NONFINITE_LOGGED else " (further ones are counted, not logged)",
            )

    def _count_failure(self, i: int, what: str) -> None:
        """A reset or step that raised: counted, and logged with its traceback the first FAILURES_LOGGED times (an
        env that raises at every step would otherwise print a traceback a step; the run stops on it, see
        ``EnvHealth.dominate``)."""
        self.failures += 1
        self.failures_logged += 1
        if self.failures_logged <= FAILURES_LOGGED:
            further = " (further ones are counted, not logged)" if self.failures_logged == FAILURES_LOGGED else ""
            log.exception("%s: %s%s", self.describe(i), what, further)

    def _replace_failed(self, i: int) -> dict | None:
        """Rebuild an env whose step raised, drop its episode from the statistics, and start the next."""
        self._count_failure(i, "step failed; rebuilding the env and dropping its episode")
        self.returns[i], self.lengths[i] = 0.0, 0
        self.videos.pop(i, None)
        self._rebuild(i)
        return self.reset(i)

    def _rebuild(self, i: int) -> None:
        try:
            self.envs[i].close()
        except Exception:  # noqa: BLE001  (the env is already broken; closing it is best effort)
            pass
        self.envs[i] = self.factory(self.contexts[i])

    def describe(self, i: int) -> str:
        ctx = self.contexts[i]
        return f"{self.name}, env {ctx.env_index} ({ctx.name})"

    def take_finished(self) -> list[EpisodeStats]:
        finished, self.finished = self.finished, []
        return finished

    def close(self, deadline: float | None = None) -> None:
        """Close every env by ``deadline`` (``time.monotonic()``; default: ENV_CLOSE_TIMEOUT_SEC from now). One
        whose close() raises is logged; one still in it at the deadline is named with its stack, and it and the envs
        not yet closed are left to the process's exit (the stop would otherwise wait its whole timeout, unnamed)."""
        deadline = time.monotonic() + ENV_CLOSE_TIMEOUT_SEC if deadline is None else deadline
        for i, env in enumerate(self.envs):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise EnvHang  # (the time went to the envs before it)
                with time_limit(left):
                    env.close()
            except EnvHang:
                why = "close() did not return" if left > 0 else "not closed: the time for closing envs was spent"
                log.error(
                    "%s: %s within %.0f s of the stop (a stack it hung in is above); leaving it and the %d envs after "
                    "it to the process's exit",
                    self.describe(i),
                    why,
                    ENV_CLOSE_TIMEOUT_SEC,
                    len(self.envs) - i - 1,
                )
                return
            except Exception:  # noqa: BLE001  (a failing close must not block the shutdown of the others)
                log.exception("closing an env of %s failed", self.name)
