"""EnvGroup, the one env-stepping loop of training, evaluation and the training evaluator: what a step reports for
episode ends, chunks and a simulator that raises, and where each reset's episode comes from (real envs of a small
gymnasium class; the failing one raises on purpose, the fault no real env gives on demand)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sfengine.env.registry import EnvContext
from sfengine.evaluation.episode_queue import EvalEpisode
from sfengine.rollout.env_group import EnvGroup, ListSource, SeedSource

GAMMA = 0.9


class Counter(gym.Env):
    """Obs = the step count of the episode; reward 1 a step; the episode ends after ``length`` steps (terminated),
    or raises at step ``fail_at`` of its first episode when asked."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, length: int, fail_at: int = 0, truncate: bool = False):
        self.length, self.fail_at, self.truncate = length, fail_at, truncate
        self.t, self.resets, self.seeds = 0, 0, []

    def reset(self, seed=None, options=None):
        self.t, self.resets = 0, self.resets + 1
        self.seeds.append(seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.fail_at and self.resets == 1:
            raise RuntimeError("the simulator diverged")
        end = self.t >= self.length
        return np.full(1, self.t, np.float32), 1.0, end and not self.truncate, end and self.truncate, {"success": 1.0}


def group_of(envs: list[Counter], source=None, chunk: int = 1) -> tuple[EnvGroup, list[int]]:
    built = []

    def factory(ctx: EnvContext) -> Counter:
        built.append(ctx.env_index)
        return envs[ctx.env_index] if built.count(ctx.env_index) == 1 else Counter(envs[ctx.env_index].length)

    contexts = [EnvContext("counter", 0, i, seed=100 + i) for i in range(len(envs))]
    group = EnvGroup(factory, contexts, source or SeedSource(), chunk, GAMMA)
    for i in range(len(envs)):
        group.reset(i)
    return group, built


def test_a_simulator_that_raises_drops_its_episode_cuts_it_for_learning_and_is_rebuilt():
    group, built = group_of([Counter(5, fail_at=2), Counter(5)])
    group.step(np.zeros((2, 1), np.float32))
    group.step(np.zeros((2, 1), np.float32))
    assert group.ended == [(0, None)]  # dropped: no statistics
    assert group.truncated[0] and not group.terminated[0]  # a cut: the learner bootstraps, no episode runs on
    assert group.rewards[0] == 0.0 and group.failures == 1
    assert built == [0, 1, 0]  # env 0 built again
    assert next(iter(group.obs[0].values()))[0] == 0  # the new episode's first obs
    assert group.take_finished() == []


@pytest.mark.parametrize("truncate", [False, True])
def test_an_episode_that_ends_inside_a_chunk_drops_the_rest_and_discounts_what_it_earned(truncate):
    group, _ = group_of([Counter(3, truncate=truncate)], chunk=2)
    group.step(np.zeros((1, 2, 1), np.float32))  # steps 1, 2
    group.step(np.zeros((1, 2, 1), np.float32))  # step 3 ends the episode; the chunk's second action is dropped
    assert group.chunk_steps[0] == 1 and group.rewards[0] == pytest.approx(1.0)
    assert (group.terminated[0], group.truncated[0]) == (not truncate, truncate)
    [(env, episode)] = group.ended
    assert env == 0 and episode.episode_return == 3.0 and episode.length == 3 and episode.success == 1.0
    if truncate:  # the final obs is 1 step after the chunk's start, a successor is 2: its value scales by gamma^-1
        [(env, final_obs, scale)] = group.cut
        assert next(iter(final_obs.values()))[0] == 3 and scale == pytest.approx(GAMMA**-1)
    assert group.steps_taken == 3


def test_a_list_of_episodes_is_played_once_each_then_the_envs_stop():
    source = ListSource()
    source.pending = [EvalEpisode(-1, seed, False) for seed in (7, 8, 9)]
    envs = [Counter(2), Counter(2)]
    group, _ = group_of(envs, source)
    while group.active.any():
        group.step(np.zeros((2, 1), np.float32))
    assert sorted(episode.init_state for episode in group.take_finished()) == [7, 8, 9]
    assert sorted(envs[0].seeds + envs[1].seeds) == [7, 8, 9]  # a single-task evaluation resets with its seed
    assert group.obs == [None, None]


def test_free_running_envs_take_their_own_seed_once():
    envs = [Counter(1), Counter(1)]
    group, _ = group_of(envs)
    group.step(np.zeros((2, 1), np.float32))
    assert envs[0].seeds == [100, None] and envs[1].seeds == [101, None]
