"""Environments shipped with rllib_ext, registered under RLlib names by :func:`register_envs`.

=========  ===============================  ==========================================
name       default ``backend``              notes
=========  ===============================  ==========================================
smac_v2    ``"auto"`` (SMACv2 first)        StarCraft II if installed, else SMAX
smac       ``"auto"`` (SMAC v1 first)       StarCraft II if installed, else SMAX
smax       ``"smax"``                       JaxMARL's SMAX, never StarCraft II
=========  ===============================  ==========================================

``env_config`` keys override the defaults (``{"backend": "smacv2"}`` forces the game).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

__all__ = ["SMAC_ENV_DEFAULTS", "is_smac_env", "make_smac_env", "register_envs"]

SMAC_ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "smac_v2": {"backend": "auto", "prefer_sc2": "smacv2"},
    "smac": {"backend": "auto", "prefer_sc2": "smac"},
    "smax": {"backend": "smax"},
}

_SMAC_CLASSPATHS = ("rllib_ext.envs.smac.SMACEnv", "rllib_ext.envs.smac.env.SMACEnv")


def make_smac_env(name: str, env_config: Mapping[str, Any] | None = None) -> Any:
    """Builds the env registered as ``name`` (its defaults, then ``env_config`` on top).

    An RLlib ``EnvContext`` keeps its ``worker_index`` / ``vector_index`` (used for seeding).
    """
    from rllib_ext.envs.smac import SMACEnv  # lazy: keeps Ray out of --help and import rllib_ext

    config = env_config if env_config is not None else {}
    merged = {**SMAC_ENV_DEFAULTS[name], **config}
    if hasattr(config, "copy_with_overrides"):  # RLlib EnvContext
        merged = config.copy_with_overrides(env_config=merged)
    return SMACEnv(merged)


def register_envs() -> None:
    """Registers ``smac_v2``, ``smac`` and ``smax`` with Ray Tune's env registry.

    Cheap and idempotent: it imports no backend (the creators import lazily, in the process
    that builds the env).
    """
    from ray.tune.registry import register_env  # lazy: keeps Ray out of import rllib_ext

    for name in SMAC_ENV_DEFAULTS:
        register_env(name, functools.partial(make_smac_env, name))


def is_smac_env(env: Any) -> bool:
    """True for the registered SMAC names, ``SMACEnv`` (or a subclass) and its class path."""
    if isinstance(env, str):
        return env in SMAC_ENV_DEFAULTS or env in _SMAC_CLASSPATHS
    if isinstance(env, type):
        from rllib_ext.envs.smac.env import SMACEnv  # lazy: keeps Ray out of --help

        return issubclass(env, SMACEnv)
    return False
