"""rllib_ext: plug-ins for Ray RLlib's PPO (new API stack).

``import rllib_ext`` imports neither Ray nor torch: the public names load on first use (so the
``rllib-ext`` command answers ``--help`` at once). Using :class:`PPOConfig`, :class:`PPO` or
:class:`PPOExtTorchLearner` registers the env names ``"smac_v2"``, ``"smac"`` and ``"smax"`` with
RLlib (see :mod:`rllib_ext.envs`; :func:`rllib_ext.envs.register_envs` does it explicitly, e.g.
for ``tune.Tuner("PPO", param_space={"env": "smax", ...})``). Optional backends (JAX,
StarCraft II) load only when an env is built. Importing it sets no environment variable and no
thread setting; the CPU thread policy is applied where a learner or env runner of ours is built
(:mod:`rllib_ext._threads`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rllib_ext._versions import warn_if_untested
from rllib_ext.envs import register_envs

__version__ = "0.1.0"

__all__ = [
    "PPO",
    "ExtensionSettings",
    "GAESettings",
    "PPOConfig",
    "PPOExtTorchLearner",
    "__version__",
]

if TYPE_CHECKING:
    from rllib_ext.config import PPO, PPOConfig
    from rllib_ext.learners.ppo import PPOExtTorchLearner
    from rllib_ext.settings import ExtensionSettings, GAESettings

_HOMES = {
    "PPO": "rllib_ext.config",
    "PPOConfig": "rllib_ext.config",
    "PPOExtTorchLearner": "rllib_ext.learners.ppo",
    "ExtensionSettings": "rllib_ext.settings",
    "GAESettings": "rllib_ext.settings",
}
_REGISTERS_ENVS = ("PPO", "PPOConfig", "PPOExtTorchLearner")


def __getattr__(name: str) -> Any:
    """Loads a public name on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rllib_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    if name in _REGISTERS_ENVS:
        warn_if_untested()
        register_envs()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
