"""The numpy backend: MLP policies acting (``policy.NumpyPolicy``, for the inference workers and rollout workers
that act themselves) and learning (``step.NumpyStep``, PPO's minibatch step) without torch's per-op overhead.

Both compute the built-in ``ActorCritic``'s function exactly (the Gaussian's constants and formulas come from
``sfengine.models.distributions``, as the torch model's do), and one check decides what they run:
``policy.numpy_unsupported_reason`` (image keys, registered models, ...), to which the learner adds what its step
has no gradient for (``step.numpy_learner_unsupported_reason``). Torch runs whatever they do not.
"""
