"""rllib_ext: plug-ins for Ray RLlib's PPO (new API stack).

``import rllib_ext`` is cheap apart from importing RLlib itself: optional backends
(JAX, StarCraft II) load only when used.
"""

from __future__ import annotations

from rllib_ext.config import PPO, PPOConfig
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.settings import ExtensionSettings, GAESettings

__version__ = "0.1.0"

__all__ = [
    "PPO",
    "ExtensionSettings",
    "GAESettings",
    "PPOConfig",
    "PPOExtTorchLearner",
    "__version__",
]
