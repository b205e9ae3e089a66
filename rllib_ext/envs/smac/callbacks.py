"""``SMACMetricsCallback``: win rate and battle statistics in the training results.

Logged on the env runners at every finished episode, so they appear in the results as
``env_runners/rllib_ext/<key>`` (:data:`SMAC_METRIC_KEYS`, :data:`WIN_RATE`):

* ``win_rate``: mean of ``battle_won`` over the last ``metrics_num_episodes_for_smoothing``
  episodes (RLlib's window for ``episode_return_mean``);
* ``dead_allies``, ``dead_enemies``: means over the same window;
* ``timeout_rate``: fraction of those episodes cut by the time limit (truncated);
* ``sc2_restarts``: StarCraft II restarts after crashes, summed over the run.

Episodes cut by a StarCraft II crash count only in ``sc2_restarts``: they were decided by the
crash, not by the policy, and would bias the win rate.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils.annotations import override

__all__ = ["SMAC_METRIC_KEYS", "WIN_RATE", "SMACMetricsCallback", "battle_info"]

WIN_RATE = "rllib_ext/win_rate"
"""``env_runners/<this>``: the win rate (what ``rllib-ext train --stop-win-rate`` reads)."""
DEAD_ALLIES = "rllib_ext/dead_allies"
DEAD_ENEMIES = "rllib_ext/dead_enemies"
TIMEOUT_RATE = "rllib_ext/timeout_rate"
SC2_RESTARTS = "rllib_ext/sc2_restarts"
SMAC_METRIC_KEYS: tuple[str, ...] = (
    WIN_RATE,
    DEAD_ALLIES,
    DEAD_ENEMIES,
    TIMEOUT_RATE,
    SC2_RESTARTS,
)
"""The ``env_runners/<key>`` this callback logs."""

_DEFAULT_WINDOW = 100


def battle_info(episode: Any) -> dict[str, Any] | None:
    """The SMAC ``info`` of an episode's last step (``battle_won``, ...), ``None`` if absent.

    Works on RLlib ``MultiAgentEpisode`` / ``SingleAgentEpisode`` objects (``get_infos(-1)``).
    """
    infos = episode.get_infos(-1)
    if not infos:
        return None
    if isinstance(infos, dict) and "battle_won" in infos:  # single-agent episode
        return infos
    for info in infos.values():
        if isinstance(info, dict) and "battle_won" in info:
            return info
    return None


class SMACMetricsCallback(RLlibCallback):
    """Logs SMAC battle outcomes (see module docstring) from the episodes' last ``info``."""

    @override(RLlibCallback)
    def on_episode_end(
        self,
        *,
        episode: Any,
        env_runner: Any = None,
        metrics_logger: Any = None,
        **kwargs: Any,
    ) -> None:
        if metrics_logger is None:
            return
        info = battle_info(episode)
        if info is None:
            return
        window = getattr(
            getattr(env_runner, "config", None),
            "metrics_num_episodes_for_smoothing",
            _DEFAULT_WINDOW,
        )
        metrics_logger.log_value(
            SC2_RESTARTS, int(info.get("sc2_restarts", 0)), reduce="lifetime_sum"
        )
        if info.get("sc2_crashed", False):
            return
        metrics_logger.log_value(WIN_RATE, float(info["battle_won"]), window=window)
        metrics_logger.log_value(DEAD_ALLIES, float(info["dead_allies"]), window=window)
        metrics_logger.log_value(DEAD_ENEMIES, float(info["dead_enemies"]), window=window)
        metrics_logger.log_value(
            TIMEOUT_RATE, float(info.get("episode_limit", False)), window=window
        )
