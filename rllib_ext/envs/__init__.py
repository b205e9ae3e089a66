"""Environments shipped with rllib_ext, registered under RLlib names by :func:`register_envs`.

=========  ===============================  ==========================================
name       default ``backend``              notes
=========  ===============================  ==========================================
smac_v2    ``"auto"`` (SMACv2 first)        StarCraft II if installed, else SMAX
smac       ``"auto"`` (SMAC v1 first)       StarCraft II if installed, else SMAX
smax       ``"smax"``                       JaxMARL's SMAX, never StarCraft II
=========  ===============================  ==========================================

``env_config`` keys override the defaults (``{"backend": "smacv2"}`` forces the game).

A name the user registered first stays the user's: :func:`register_envs` only takes free names
(or ones holding its own creator), and :func:`is_smac_env` answers for the env a name runs, so a
user's env registered as ``"smax"`` gets none of rllib_ext's SMAC handling.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from rllib_ext.envs.names import SMAC_CREATOR_MARK, SMAC_ENV_DEFAULTS, is_smac_env, names_our_env

__all__ = ["SMAC_ENV_DEFAULTS", "is_smac_env", "make_smac_env", "names_our_env", "register_envs"]

logger = logging.getLogger(__name__)


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


setattr(make_smac_env, SMAC_CREATOR_MARK, True)  # what names.is_our_creator looks for

_kept_user_names: set[str] = set()
"""Names :func:`register_envs` found taken by the user (logged once each)."""


def register_envs() -> None:
    """Registers ``smac_v2``, ``smac`` and ``smax`` with Ray Tune's env registry where the name is
    free (or already ours); a name the user registered is left as it is (logged once).

    Cheap and idempotent: it imports no backend (the creators import lazily, in the process
    that builds the env).
    """
    from ray.tune.registry import register_env  # lazy: keeps Ray out of import rllib_ext

    for name in SMAC_ENV_DEFAULTS:
        if names_our_env(name):
            register_env(name, functools.partial(make_smac_env, name))
        elif name not in _kept_user_names:
            _kept_user_names.add(name)
            logger.info(
                "env name %r is registered by you: rllib_ext keeps your env under it (its SMAC "
                "env stays reachable as rllib_ext.envs.smac.SMACEnv).",
                name,
            )
