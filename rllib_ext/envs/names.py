"""The env names rllib_ext registers, and how its SMAC env is told apart from a user's (no Ray import).

A leaf of :mod:`rllib_ext.envs`: the SMAC package (``envs/smac/``) and the package's registration
both read it, and it imports neither, so no import goes up from ``envs/smac/`` to ``envs``. Ours
is recognised by markers rather than identity: the registered creator is a ``functools.partial``
of a function carrying :data:`SMAC_CREATOR_MARK` (``rllib_ext.envs.make_smac_env``), and the env
class (and its subclasses) carries :data:`SMAC_ENV_MARK` (``SMACEnv``).
"""

from __future__ import annotations

import functools
from typing import Any

from rllib_ext import _rllib_private as private

__all__ = [
    "SMAC_CLASSPATHS",
    "SMAC_CREATOR_MARK",
    "SMAC_ENV_DEFAULTS",
    "SMAC_ENV_MARK",
    "is_our_creator",
    "is_smac_env",
    "names_our_env",
]

SMAC_ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "smac_v2": {"backend": "auto", "prefer_sc2": "smacv2"},
    "smac": {"backend": "auto", "prefer_sc2": "smac"},
    "smax": {"backend": "smax"},
}
"""The names :func:`rllib_ext.envs.register_envs` registers, with their ``env_config`` defaults."""

SMAC_CLASSPATHS = ("rllib_ext.envs.smac.SMACEnv", "rllib_ext.envs.smac.env.SMACEnv")
SMAC_CREATOR_MARK = "rllib_ext_smac_creator"
SMAC_ENV_MARK = "rllib_ext_smac_env"


def is_our_creator(creator: Any) -> bool:
    """Whether ``creator`` (an entry of Ray's env registry) is rllib_ext's SMAC env creator."""
    return isinstance(creator, functools.partial) and bool(
        getattr(creator.func, SMAC_CREATOR_MARK, False)
    )


def names_our_env(name: str) -> bool:
    """Whether the env name ``name`` runs rllib_ext's SMAC env: one of :data:`SMAC_ENV_DEFAULTS`
    that holds our creator in Ray's env registry, or nothing yet (``register_envs`` takes it).
    ``False`` where the user registered their own env under the name."""
    if name not in SMAC_ENV_DEFAULTS:
        return False
    creator = private.registered_env_creator(name)
    return creator is None or is_our_creator(creator)


def is_smac_env(env: Any) -> bool:
    """True for rllib_ext's SMAC env: ``SMACEnv`` (or a subclass), its class path, and the
    registered names while they hold our creator (:func:`names_our_env`)."""
    if isinstance(env, str):
        return env in SMAC_CLASSPATHS or names_our_env(env)
    if isinstance(env, type):
        return bool(getattr(env, SMAC_ENV_MARK, False))
    return False
