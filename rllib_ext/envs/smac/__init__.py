"""SMAC multi-agent battles for RLlib: SMACv2 / SMAC on StarCraft II, or SMAX without it.

``SMACEnv`` is the RLlib ``MultiAgentEnv`` (contract in :mod:`rllib_ext.envs.smac.env`);
``parallel_env`` the PettingZoo view; ``SMACMetricsCallback`` puts ``rllib_ext/win_rate`` into the
results. Importing this package imports no backend: JAX / JaxMARL and smac / smacv2 load when
an env is built.
"""

from __future__ import annotations

from rllib_ext.envs.smac.backend import BackendSpec, check_actions
from rllib_ext.envs.smac.callbacks import SMAC_METRIC_KEYS, SMACMetricsCallback, battle_info
from rllib_ext.envs.smac.env import MaskedDiscrete, SMACEnv
from rllib_ext.envs.smac.parallel import SMACParallelEnv, parallel_env
from rllib_ext.envs.smac.settings import BACKENDS, REWARD_MODES, STATE_MODES, SMACEnvSettings

__all__ = [
    "BACKENDS",
    "REWARD_MODES",
    "SMAC_METRIC_KEYS",
    "STATE_MODES",
    "BackendSpec",
    "MaskedDiscrete",
    "SMACEnv",
    "SMACEnvSettings",
    "SMACMetricsCallback",
    "SMACParallelEnv",
    "battle_info",
    "check_actions",
    "parallel_env",
]
