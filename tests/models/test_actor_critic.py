"""The policy's action draws: the distribution the learner assumes is the one the inference worker samples."""

import gymnasium as gym
import numpy as np
import torch

from sfengine.config import ModelConfig
from sfengine.models.actor_critic import ActorCritic
from sfengine.spaces import action_spec_from_space, obs_spec_from_space

DRAWS = 200_000


def make_model(action_space: gym.Space) -> ActorCritic:
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    return ActorCritic(obs_spec_from_space(obs_space), action_spec_from_space(action_space), ModelConfig())


def test_discrete_draws_follow_the_policy_probabilities():
    torch.manual_seed(0)
    model = make_model(gym.spaces.Discrete(4))
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(DRAWS, 4)
    actions, log_probs = model.sample(logits)
    frequencies = torch.bincount(actions, minlength=4).double() / DRAWS
    # Binomial standard error at p = 0.4 and 200k draws is about 0.0011: 0.005 is over 4 sigma.
    assert torch.allclose(frequencies, probs.double(), atol=0.005), frequencies
    assert torch.allclose(log_probs, probs.log()[actions])


def test_discrete_log_probs_of_a_draw_match_the_learner_side():
    torch.manual_seed(1)
    model = make_model(gym.spaces.Discrete(3))
    logits = torch.randn(64, 3)
    actions, log_probs = model.sample(logits)
    recomputed, _ = model.log_prob_entropy(logits, actions)
    assert torch.allclose(log_probs, recomputed)


def test_a_near_certain_action_is_always_drawn():
    model = make_model(gym.spaces.Discrete(5))
    logits = torch.full((10_000, 5), -30.0)
    logits[:, 2] = 30.0
    actions, _ = model.sample(logits)
    assert bool((actions == 2).all())


def test_gaussian_draws_have_the_policy_mean_and_std_and_matching_log_probs():
    torch.manual_seed(2)
    model = make_model(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with torch.no_grad():
        model.log_std.fill_(np.log(0.5))
    mean = torch.tensor([0.3, -0.2]).expand(DRAWS, 2)
    actions, log_probs = model.sample(mean)
    assert torch.allclose(actions.mean(0), mean[0], atol=0.01)
    assert torch.allclose(actions.std(0), torch.tensor([0.5, 0.5]), atol=0.01)
    recomputed, _ = model.log_prob_entropy(mean[:64], actions[:64])
    assert torch.allclose(log_probs[:64], recomputed, atol=1e-5)


def test_a_bfloat16_inference_copy_acts_like_the_float32_policy():
    torch.manual_seed(3)
    obs_spec = obs_spec_from_space(gym.spaces.Box(0, 255, (84, 84, 3), np.uint8))
    action_spec = action_spec_from_space(gym.spaces.Discrete(4))
    learner = ActorCritic(obs_spec, action_spec, ModelConfig())
    actor = ActorCritic(obs_spec, action_spec, ModelConfig()).for_inference(torch.bfloat16)
    with torch.no_grad():
        for name, tensor in actor.state_dict().items():
            tensor.copy_(learner.state_dict()[name])  # as SharedWeights.pull does
    images = {key: torch.randint(0, 256, (32, 84, 84, 3), dtype=torch.uint8) for key in obs_spec.shapes}
    with torch.inference_mode():
        logits, values = learner(images)
        bf16_logits, bf16_values = actor(images)
    assert next(actor.encoders.parameters()).dtype == torch.bfloat16
    assert bf16_logits.dtype == torch.float32 and bf16_values.dtype == torch.float32
    assert torch.allclose(bf16_logits, logits, atol=0.02) and torch.allclose(bf16_values, values, atol=0.05)
