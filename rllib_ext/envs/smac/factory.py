"""Which SMAC backend runs: resolves ``backend="auto"`` and builds the backend.

Kept apart from the types in :mod:`rllib_ext.envs.smac.backend` so the modules import one way
only: ``sc2`` and ``smax`` import the types, this module imports ``sc2`` and ``smax``. Neither
imports its game at module level (smac/smacv2 and JAX load when a backend is built), so this
import stays cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rllib_ext.envs.names import SMAC_ENV_DEFAULTS, is_smac_env
from rllib_ext.envs.smac import sc2
from rllib_ext.envs.smac.backend import Backend
from rllib_ext.envs.smac.settings import SC2_PACKAGES, SMACEnvSettings
from rllib_ext.envs.smac.smax import SMAXBackend

__all__ = ["make_backend", "resolve_backend", "smax_env_config"]

logger = logging.getLogger(__name__)


def resolve_backend(settings: SMACEnvSettings) -> str:
    """The backend ``settings.backend`` names, with ``"auto"`` resolved (and the choice logged).

    ``"auto"`` takes the first StarCraft II package (``settings.prefer_sc2`` first) that can run
    the map here, ``settings.prefer_sc2`` when a ``game_factory`` stands in for the game, only
    SMACv2 with a ``capability_config``, and SMAX otherwise.

    Returns:
        ``"smacv2"``, ``"smac"`` or ``"smax"``.
    """
    if settings.backend != "auto":
        return settings.backend
    name = "smax"
    reasons = []
    order = (settings.prefer_sc2, *(p for p in SC2_PACKAGES if p != settings.prefer_sc2))
    if settings.capability_config is not None:
        order = ("smacv2",)  # capability_config exists in SMACv2 only
    if settings.game_factory is not None:
        name = settings.prefer_sc2
        reasons.append("game_factory is set")
    else:
        for package in order:
            ok, why = sc2.availability(package, settings.map_name)
            if ok:
                name = package
                break
            reasons.append(f"{package}: {why}")
        else:
            if settings.capability_config is not None:
                logger.warning(
                    "capability_config is ignored on SMAX (a SMACv2 feature); use "
                    "smax_options or a 'smacv2_*_units' map for procedural scenarios."
                )
    logger.info(
        "SMAC backend='auto' for map %r -> %r (%s)",
        settings.map_name,
        name,
        "; ".join(reasons) or "StarCraft II found",
    )
    return name


def make_backend(settings: SMACEnvSettings, seed: int | None) -> Backend:
    """Builds the backend :func:`resolve_backend` picks for ``settings``.

    Raises:
        ImportError: the chosen backend's package or game is missing (with install steps).
        ValueError: the map does not exist on that backend (lists the maps it has).
    """
    name = resolve_backend(settings)
    if name == "smax":
        return SMAXBackend(settings, seed)
    return sc2.SC2Backend(settings, seed, package=name)


def smax_env_config(env: Any, env_config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The SMAC ``env_config`` with ``backend="smax"`` if ``env`` runs on SMAX, else ``None``.

    ``backend="auto"`` is resolved by :func:`rllib_ext.envs.smac.factory.resolve_backend`, the
    rule the env itself uses.
    """
    if not is_smac_env(env):
        return None
    defaults = SMAC_ENV_DEFAULTS.get(env, {}) if isinstance(env, str) else {}
    merged = {**defaults, **dict(env_config or {})}
    try:
        settings = SMACEnvSettings.from_env_config(merged)
    except (TypeError, ValueError):
        return None  # the env itself raises the full message when it is built
    if resolve_backend(settings) != "smax":
        return None
    return {**merged, "backend": "smax"}
