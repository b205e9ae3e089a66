"""Checkpoints that cross between stock RLlib and rllib_ext (``PPOExtTorchLearner``'s state).

* Our metrics (every key under ``rllib_ext/``: ``<module>/rllib_ext/gae/...``, ...) are saved
  under our own state key instead of inside RLlib's ``metrics_logger`` state, so a stock learner
  restoring an rllib_ext checkpoint never reports them; our learner puts them back when it
  restores. The algorithm's logger holds the same metrics under ``learners/`` (plus the env
  runners' ``rllib_ext/...``): ``rllib_ext.PPO`` saves them apart the same way. Checkpoints
  written before our keys moved under ``rllib_ext/`` hold them under their old names
  (:data:`LEGACY_METRIC_GROUPS`, :data:`LEGACY_ENV_RUNNER_METRICS`), recognised alike.
* A stock checkpoint's optimizer state carries RLlib's plain Adam flags, which torch's
  ``load_state_dict`` copies over ours: the lean update is made fused/foreach again
  (:func:`rllib_ext.learners.lean.keep_lean`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllib_ext import _rllib_private as private

__all__ = ["METRICS_STATE_KEY", "OUR_PREFIX", "is_our_metric", "split_metrics_state"]

METRICS_STATE_KEY = "rllib_ext_metrics"
"""The learner-state key holding our metrics' stats (flat keys, as RLlib's logger saves them)."""

OUR_PREFIX = "rllib_ext/"
"""Every result key rllib_ext adds starts its name with this (``env_runners/rllib_ext/...``,
``learners/<module>/rllib_ext/...``)."""

LEGACY_METRIC_GROUPS = ("gae", "batching", "death_mask", "value_norm", "amp", "comm")
"""Per-module metric groups of older checkpoints (``<module>/<group>/<name>``)."""

LEGACY_ENV_RUNNER_METRICS = (
    "fused_sampling",
    "smax_batched_envs",
    "smax_fused_sampling",
    "smax_fused_groups",
)
"""``env_runners/<name>`` metrics of older checkpoints (the algorithm's logger)."""


def is_our_metric(flat_key: str) -> bool:
    """Whether a logger state key is one of our metrics: a learner's
    (``"default_policy--rllib_ext/gae/time_ms"``) or the algorithm's
    (``"learners--default_policy--rllib_ext/gae/time_ms"``, ``"env_runners--rllib_ext/win_rate"``),
    or one of the names older checkpoints used (``"default_policy--gae/time_ms"``,
    ``"env_runners--fused_sampling"``)."""
    parts = flat_key.split("--")
    if any(part.startswith(OUR_PREFIX) for part in parts):
        return True
    if parts[0] == "env_runners":
        return len(parts) == 2 and parts[1] in LEGACY_ENV_RUNNER_METRICS
    if parts[0] == "learners":
        parts = parts[1:]
    if len(parts) < 2:
        return False
    group, slash, _ = parts[1].partition("/")
    return group in LEGACY_METRIC_GROUPS and bool(slash or len(parts) > 2)


def split_metrics_state(metrics_state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(RLlib's metrics state without ours, our stats by flat key)``."""
    stats = private.metrics_state_stats(metrics_state)
    ours = {k: v for k, v in stats.items() if is_our_metric(k)}
    theirs = {k: v for k, v in stats.items() if k not in ours}
    return private.with_metrics_state_stats(metrics_state, theirs), ours


def merged_metrics_state(
    metrics_state: Mapping[str, Any], ours: Mapping[str, Any]
) -> dict[str, Any]:
    """``metrics_state`` with ``ours`` (from :func:`split_metrics_state`) added back."""
    stats = private.metrics_state_stats(metrics_state)
    return private.with_metrics_state_stats(metrics_state, {**stats, **ours})
