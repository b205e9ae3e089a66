"""rllib_ext: plug-ins for Ray RLlib's PPO (new API stack).

``import rllib_ext`` is cheap apart from importing RLlib itself: optional backends
(JAX, StarCraft II) load only when used. It registers the env names ``"smac_v2"``,
``"smac"`` and ``"smax"`` with RLlib (see :mod:`rllib_ext.envs`).
"""

from __future__ import annotations

from rllib_ext.config import PPO, PPOConfig
from rllib_ext.envs import register_envs
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.settings import ExtensionSettings, GAESettings

__version__ = "0.1.0"

register_envs()

__all__ = [
    "PPO",
    "ExtensionSettings",
    "GAESettings",
    "PPOConfig",
    "PPOExtTorchLearner",
    "__version__",
]
