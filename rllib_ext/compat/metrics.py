"""The 2023 result names (``episode_reward_mean``...) as aliases of the new stack's metrics.

RLlib's new API stack reports ``env_runners/episode_return_mean`` where the tutorial's stop
rules read ``episode_reward_mean``; Tune only warns about a stop key that is never reported and
runs on. :func:`add_legacy_metrics` writes the old names into a result, copied from the new
ones, so ``stop={"episode_reward_mean": 450}`` fires on the same iteration as
``stop={"env_runners/episode_return_mean": 450}``.

Where the new stack has no value yet (no episode finished in the first iteration), the old
name reads ``nan``, as RLlib's old stack reported it; ``nan >= 450`` is false, so no stop rule
fires on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["LEGACY_METRICS", "add_legacy_metrics", "legacy_metrics_on_train_result"]

LEGACY_METRICS: dict[str, tuple[str, ...]] = {
    "episode_reward_mean": ("env_runners", "episode_return_mean"),
    "episode_reward_min": ("env_runners", "episode_return_min"),
    "episode_reward_max": ("env_runners", "episode_return_max"),
    "episode_len_mean": ("env_runners", "episode_len_mean"),
    "episodes_this_iter": ("env_runners", "num_episodes"),
    "episodes_total": ("env_runners", "num_episodes_lifetime"),
    "timesteps_total": ("num_env_steps_sampled_lifetime",),
}
"""Old top-level result key -> path of the new-stack value it copies."""


def _lookup(result: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            # Tune's flattened form (`env_runners/episode_return_mean`) as a fallback.
            return result.get("/".join(path), math.nan)
        node = node[key]
    return node


def add_legacy_metrics(result: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Writes the :data:`LEGACY_METRICS` aliases into ``result`` (in place; idempotent).

    The new-stack values are left as they are. ``timesteps_total``/``episodes_total`` are
    integers like the old stack's; a missing value becomes ``nan``.
    """
    for old, path in LEGACY_METRICS.items():
        value = _lookup(result, path)
        if old in ("timesteps_total", "episodes_total", "episodes_this_iter"):
            value = (
                int(value) if isinstance(value, (int, float)) and math.isfinite(value) else value
            )
        result[old] = value
    return result


def legacy_metrics_on_train_result(
    *, algorithm: Any = None, metrics_logger: Any = None, result: dict, **kwargs: Any
) -> None:
    """RLlib ``on_train_result`` callback form of :func:`add_legacy_metrics`.

    ``rllib_ext.compat.PPOConfig`` sets it as ``callbacks_on_train_result``, so a stock ``"PPO"``
    trainable built from the config's dict reports the old names too.
    """
    add_legacy_metrics(result)
