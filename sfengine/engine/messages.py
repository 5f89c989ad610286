"""Named payloads of the signals between components. Each is small: indices, counters and stats, never data."""

from __future__ import annotations

from typing import NamedTuple


class InferenceRequest(NamedTuple):
    """rollout worker -> inference worker: split row ``split_row`` has observations at its current step."""

    split_row: int
    needs_final_values: bool  # some env truncated: also evaluate V(final_obs) for the bootstrap
    request: int = 0  # the split's request number (SplitState.requests), echoed with the outputs


class PolicyOutputs(NamedTuple):
    """inference worker -> rollout worker: the outputs of request ``request`` of split ``split`` are written."""

    split: int  # the split's index in its worker
    request: int


class TrajectoriesReady(NamedTuple):
    """rollout worker -> batcher: these buffers hold complete rollouts."""

    buffer_ids: tuple[int, ...]


class BuffersReleased(NamedTuple):
    """batcher -> the owning rollout worker: these buffers are free again."""

    buffer_ids: tuple[int, ...]
    lends: tuple[int, ...]  # each buffer's lend count (SharedBuffers.lends) when it was handed over


class EpisodeStats(NamedTuple):
    episode_return: float
    length: int
    success: float  # nan when the env does not report success
    task: int = -1  # the task of a multi-task env, -1 otherwise
    init_state: int = -1  # multi-task envs: the init state; single-task evaluation: the episode's seed
    position: int = -1  # its place in the task sequence (training) or the episode queue (evaluation), else -1


class InferenceReport(NamedTuple):
    worker: int
    busy_sec: float
    wall_sec: float
    requests: int
    batches: int


class WorkerReport(NamedTuple):
    """rollout worker -> runner, about once a second."""

    worker: int
    episodes: list[EpisodeStats]
    env_step_sec: float  # time inside env.step/reset
    busy_sec: float  # time in the worker's slots in total (bookkeeping included)
    wall_sec: float  # length of the reporting window
    env_failures: int = 0  # envs that raised and were rebuilt in this window
    env_steps: int = 0  # env.step calls in this window
    env_resets: int = 0  # env.reset calls in this window
    env_reset_sec: float = 0.0  # the part of env_step_sec spent in env.reset
    finished: bool = False  # evaluation: every env found the episode set exhausted and ended its last episode
    inference: InferenceReport | None = None  # --num_inference_workers=0: the worker's own acting in this window
    nonfinite_steps: int = 0  # env steps whose observation or reward was NaN or infinite (episodes dropped)


class LearnerReport(NamedTuple):
    """learner -> runner after every training step (a few per second)."""

    env_steps: int  # env steps consumed by the learner, across resumes
    policy_version: int
    train_sec: float
    batcher_sec: float
    stats: dict[str, float]
    final: bool = False  # the last report: the learner has saved its checkpoint and is stopping
    rank_env_steps: tuple[int, ...] = ()  # multi-rank: env steps of each rank in this run
    other_ranks_episodes: list[EpisodeStats] = []  # multi-rank, on rank 0: episodes the other ranks finished
    ranks_in_sync: bool = True  # every rank held the same weights at the last exchange
    stop_agreed: bool = False  # a rank asked to stop, and every rank stops now


class EvaluationRequest(NamedTuple):
    """runner -> training evaluator: evaluate the weights published now."""

    env_steps: int  # env steps trained so far
    # Evaluations the run has completed (a resumed run counts those of its env steps before): which init states
    # this one plays, so that a respawned or resumed evaluator goes on cycling where its predecessor stopped.
    index: int


class EvalResult(NamedTuple):
    """training evaluator -> runner: one evaluation of the weights of ``policy_version``."""

    env_steps: int  # env steps trained when the evaluation was asked for
    policy_version: int
    episodes: list[EpisodeStats]
    wall_sec: float
    final: bool = False  # the run's end-of-training evaluation (--eval_at_end)


class EvaluatorReport(NamedTuple):
    """training evaluator -> runner, about once a second: its CPU share."""

    busy_sec: float
    wall_sec: float
