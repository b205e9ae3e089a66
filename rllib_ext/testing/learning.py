"""Does a config learn? Train until a mean episode return, count the env steps it took.

A check for your own configs (and the AMP and compression learning comparisons of
rllib-ext): ``steps_to_return(config, target=450.0, max_env_steps=200_000)`` builds the
algorithm, calls ``train()`` until ``env_runners/episode_return_mean >= target`` or the env-step
budget is spent, stops the algorithm and reports what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_RETURN_MEAN,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)

__all__ = ["LearningReport", "steps_to_return"]


@dataclass(frozen=True)
class LearningReport:
    """What a :func:`steps_to_return` run reached."""

    reached: bool
    """The mean episode return got to the target within the budget."""
    episode_return: float
    """``env_runners/episode_return_mean`` of the last iteration (NaN before any episode ended)."""
    env_steps: int
    """Env steps sampled until the target was reached or the budget spent."""
    iterations: int
    wall_s: float
    learners: dict[str, Any]
    """``result["learners"]`` of the last iteration (per-module metrics such as ``rllib_ext/amp/...``)."""


def steps_to_return(config: Any, *, target: float, max_env_steps: int) -> LearningReport:
    """Trains ``config.build_algo()`` until the mean episode return reaches ``target``.

    Args:
        config: an RLlib ``AlgorithmConfig`` (``rllib_ext.PPOConfig`` or RLlib's own).
        target: mean episode return to reach (e.g. 450 on CartPole-v1).
        max_env_steps: stop after this many sampled env steps, reached or not.

    Raises:
        ValueError: ``max_env_steps`` is not positive.
    """
    if max_env_steps <= 0:
        raise ValueError(
            f"max_env_steps={max_env_steps!r} must be positive. Fix: pass the env-step budget, "
            "e.g. max_env_steps=200_000."
        )
    algo = config.build_algo()
    start = time.perf_counter()
    iterations = 0
    try:
        while True:
            result = algo.train()
            iterations += 1
            steps = int(result[NUM_ENV_STEPS_SAMPLED_LIFETIME])
            episode_return = float(
                result[ENV_RUNNER_RESULTS].get(EPISODE_RETURN_MEAN, float("nan"))
            )
            if episode_return >= target or steps >= max_env_steps:
                break
        return LearningReport(
            reached=episode_return >= target,
            episode_return=episode_return,
            env_steps=steps,
            iterations=iterations,
            wall_s=time.perf_counter() - start,
            learners=dict(result.get(LEARNER_RESULTS, {})),
        )
    finally:
        algo.stop()
