"""SMACMetricsCallback: what it logs from an episode's last info."""

from __future__ import annotations

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ext.envs.smac import SMAC_METRIC_KEYS, SMACMetricsCallback


class _Episode:
    def __init__(self, info):
        self._infos = {"agent_0": dict(info), "agent_1": dict(info)}

    def get_infos(self, index):
        assert index == -1
        return self._infos


def _info(won=False, dead_allies=0, dead_enemies=0, limit=False, crashed=False, restarts=0):
    return {
        "battle_won": won,
        "dead_allies": dead_allies,
        "dead_enemies": dead_enemies,
        "episode_limit": limit,
        "sc2_crashed": crashed,
        "sc2_restarts": restarts,
    }


def test_logs_win_rate_and_battle_stats():
    logger = MetricsLogger()
    callback = SMACMetricsCallback()
    episodes = [
        _info(won=True, dead_allies=1, dead_enemies=3),
        _info(won=False, dead_allies=3, dead_enemies=2),
        _info(won=False, dead_allies=0, dead_enemies=1, limit=True, restarts=2),
        _info(won=True, dead_allies=0, dead_enemies=3),
        _info(crashed=True, restarts=1),  # excluded from the rates, counted as restart
    ]
    for info in episodes:
        callback.on_episode_end(episode=_Episode(info), metrics_logger=logger, env_index=0)
    assert logger.peek("rllib_ext/win_rate") == pytest.approx(0.5)
    assert logger.peek("rllib_ext/dead_allies") == pytest.approx(1.0)
    assert logger.peek("rllib_ext/dead_enemies") == pytest.approx(9 / 4)
    assert logger.peek("rllib_ext/timeout_rate") == pytest.approx(0.25)
    assert logger.peek("rllib_ext/sc2_restarts") == 3
    assert set(SMAC_METRIC_KEYS) <= set(logger.reduce())


def test_ignores_episodes_without_smac_info():
    logger = MetricsLogger()
    SMACMetricsCallback().on_episode_end(
        episode=_Episode({"other": 1}), metrics_logger=logger, env_index=0
    )
    assert "rllib_ext/win_rate" not in logger.reduce()
