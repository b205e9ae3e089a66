"""Plain-loop reference for :mod:`rllib_ext.ops.gae` (tests only; O(N) Python iterations)."""

from __future__ import annotations

import numpy as np

__all__ = ["compute_advantages_reference", "compute_value_targets_reference"]


def compute_advantages_reference(
    values: np.ndarray,
    rewards: np.ndarray,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """GAE advantages by the textbook backward loop, float64. Shapes and flags as in
    :func:`rllib_ext.ops.gae.compute_advantages`."""
    n = len(values)
    advantages = np.zeros(n, dtype=np.float64)
    next_advantage = 0.0
    for t in reversed(range(n)):
        next_non_terminal = 0.0 if terminateds[t] else 1.0
        next_value = float(values[t + 1]) if t + 1 < n else 0.0
        delta = float(rewards[t]) + gamma * next_non_terminal * next_value - float(values[t])
        # A truncated step keeps its bootstrap (delta above) but starts a new recursion.
        carry = 0.0 if (terminateds[t] or truncateds[t]) else next_advantage
        next_advantage = delta + gamma * lambda_ * carry
        advantages[t] = next_advantage
    return advantages


def compute_value_targets_reference(
    values: np.ndarray,
    rewards: np.ndarray,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """``advantages + values`` as float32 (rounding as RLlib: advantages to float32 first)."""
    adv = compute_advantages_reference(values, rewards, terminateds, truncateds, gamma, lambda_)
    return adv.astype(np.float32) + np.asarray(values, dtype=np.float32)
