"""Tiny CartPole configs shared by the conformance tests (2-core machine: seconds per build)."""

from __future__ import annotations

from typing import Any


def tiny(config: Any, *, env: Any = "CartPole-v1") -> Any:
    """``config`` shrunk to one local env runner and a 200-step batch, seeded."""
    return (
        config.environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
        .debugging(seed=0)
    )


def on_learner(algo: Any, fn: Any) -> Any:
    """``fn(learner)`` on the (only, local) learner, through RLlib's public ``foreach_learner``."""
    results = algo.learner_group.foreach_learner(fn)
    return [r.get() if hasattr(r, "get") else r for r in results][0]
