"""Per-env presets of ``rllib-ext train``: small YAML files shipped in ``rllib_ext/presets/``.

A preset holds the keys of a ``--config`` YAML file (``env``, ``training: {...}``,
``model_config``...) plus a one-line ``description`` and, optionally, a one-line ``example``
command (default ``rllib-ext train --preset NAME``). ``rllib-ext train --preset smax-3m``
applies one; ``rllib-ext presets`` lists them.

Where a preset sits in the precedence of :func:`rllib_ext.cli.runconfig.resolve_settings`
(lowest first): defaults, the resumed checkpoint's settings, **the preset**, ``--config``
YAML, ``--training``, ``--set``, flags. The user always wins; ``training`` and
``model_config`` are merged key by key over the preset's, and so is ``env_config`` while the
env is the preset's or both are SMAC envs (one ``env_config`` schema); another env gets none
of the preset's ``env_config``.

SMAC envs (``--env smac_v2``, ``smac``, ``smax``) without ``--preset`` get a preset chosen by
:func:`choose_preset` (just above the defaults, below a resumed checkpoint's settings), from
the env and the ``env_config`` the user's layers give it:

* the SMAX backend runs (``backend="smax"``, or ``"auto"`` without StarCraft II) and the map
  has its own preset ``smax-<map_name>``: that one (its measured recipe);
* the SMAX backend runs, no preset for the map: :data:`SMAX_PRESET` (the generic SMAX recipe);
* a StarCraft II backend runs: :data:`SMAC_PRESET` (no batched battles: every env copy is a game).

The run prints the choice and its reason in one line (:func:`log_preset`).

No Ray import: ``--help`` lists the preset names from the file names.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from rllib_ext.cli.conversion import convert_values
from rllib_ext.cli.errors import CLIError
from rllib_ext.envs import SMAC_ENV_DEFAULTS, is_smac_env

__all__ = [
    "EXPLICIT_REASON",
    "SMAC_PRESET",
    "SMAX_PRESET",
    "Preset",
    "PresetChoice",
    "auto_preset",
    "choose_preset",
    "env_backend",
    "list_presets",
    "load_preset",
    "log_preset",
    "preset_line",
    "preset_names",
    "render_presets",
]

logger = logging.getLogger(__name__)

SMAC_PRESET = "smac"
"""Applied to SMAC envs on a StarCraft II backend when no ``--preset`` is given."""
SMAX_PRESET = "smax"
"""Applied to SMAC envs on the SMAX backend whose map has no ``smax-<map>`` preset."""
MAP_PRESET_PREFIX = "smax-"
"""``smax-<map_name>``: a SMAX map's own preset, chosen for that map on the SMAX backend."""
EXPLICIT_REASON = "--preset"
"""The reason :func:`preset_line` gives for a preset the user named."""

_SUFFIX = ".yaml"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    values: dict[str, Any]
    """Converted option values, as :func:`rllib_ext.cli.conversion.load_yaml` returns them."""
    example: str = ""
    """A command that runs it (the YAML's ``example``, else ``rllib-ext train --preset NAME``)."""


@dataclass(frozen=True)
class PresetChoice:
    """What :func:`choose_preset` picked: ``name`` (``None``: no preset) and why."""

    name: str | None
    reason: str


def _files() -> dict[str, Any]:
    folder = resources.files("rllib_ext") / "presets"
    return {
        entry.name[: -len(_SUFFIX)]: entry
        for entry in folder.iterdir()
        if entry.name.endswith(_SUFFIX)
    }


def preset_names() -> list[str]:
    """The shipped presets, sorted (file names without ``.yaml``)."""
    return sorted(_files())


def load_preset(name: str) -> Preset:
    """Reads and checks the preset ``name`` like a ``--config`` file.

    Raises:
        CLIError: no preset of that name (the message lists them), or a bad key/value.
    """
    files = _files()
    if name not in files:
        close = difflib.get_close_matches(name, list(files), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CLIError(
            f"--preset {name!r} is not a preset.{hint} Presets: {', '.join(sorted(files))}. "
            "Fix: pick one ('rllib-ext presets' describes them) or pass your own YAML with "
            "--config."
        )
    data = yaml.safe_load(files[name].read_text()) or {}
    if not isinstance(data, Mapping):
        raise CLIError(f"preset {name!r} must hold a mapping, got {type(data).__name__}.")
    data = dict(data)
    description = str(data.pop("description", "")).strip()
    example = str(data.pop("example", "") or f"rllib-ext train --preset {name}").strip()
    return Preset(name, description, convert_values(data, source=f"preset {name!r}"), example)


def list_presets() -> list[Preset]:
    return [load_preset(name) for name in preset_names()]


def render_presets() -> str:
    """What ``rllib-ext presets`` prints: a ``name  description`` line per preset and, under
    it, ``$ example``."""
    presets = list_presets()
    width = max(len(p.name) for p in presets)
    lines = [
        line
        for p in presets
        for line in (f"{p.name:<{width}}  {p.description}", f"{'':<{width}}  $ {p.example}")
    ]
    lines.append("")
    lines.append(
        "Use: rllib-ext train --preset NAME [flags]; flags, --set, --training and --config win "
        "over the preset. SMAC envs without --preset use the map's "
        f"'{MAP_PRESET_PREFIX}MAP' preset on the SMAX backend ('{SMAX_PRESET}' for other maps) "
        f"and '{SMAC_PRESET}' on StarCraft II."
    )
    return "\n".join(lines)


def choose_preset(env: str, env_config: Mapping[str, Any] | None = None) -> PresetChoice:
    """The preset a run of ``env`` with ``env_config`` gets without ``--preset``, and why.

    ``env_config`` is the one the user's layers give the env (before any preset's). Non-SMAC
    envs get none (the defaults are CartPole's); SMAC envs follow the rule of the module
    docstring, with the backend resolved as the env resolves it (:func:`env_backend`). An
    ``env_config`` the env rejects gets :data:`SMAC_PRESET` (the run then stops at the env
    check before ``ray.init``, which names the bad key).
    """
    if not is_smac_env(env):
        return PresetChoice(None, f"env {env} has no preset")
    try:
        backend = env_backend(env, env_config or {})
    except (TypeError, ValueError):
        # The env check before ray.init reports the bad key with its fix.
        return PresetChoice(SMAC_PRESET, "env_config rejected by the env")
    if backend != "smax":
        return PresetChoice(SMAC_PRESET, f"StarCraft II backend {backend}")
    map_name = _map_name(env_config)
    own = f"{MAP_PRESET_PREFIX}{map_name}"
    if own in _files():
        return PresetChoice(own, f"SMAX backend, map {map_name}")
    return PresetChoice(SMAX_PRESET, f"SMAX backend, no preset for map {map_name}")


def auto_preset(env: str, env_config: Mapping[str, Any] | None = None) -> str | None:
    """The name :func:`choose_preset` picks (``None`` for non-SMAC envs)."""
    return choose_preset(env, env_config).name


def _map_name(env_config: Mapping[str, Any] | None) -> str:
    from rllib_ext.envs.smac.settings import SMACEnvSettings  # lazy: keeps Ray out of --help

    return str((env_config or {}).get("map_name", SMACEnvSettings.map_name))


def env_backend(env: str, env_config: Mapping[str, Any]) -> str | None:
    """The SMAC backend a run of ``env`` will use (``"smacv2"``, ``"smac"`` or ``"smax"``,
    with ``backend="auto"`` resolved as the env resolves it), ``None`` for other envs.

    Raises:
        ValueError: an ``env_config`` the SMAC env rejects.
    """
    if not is_smac_env(env):
        return None
    # lazy: rllib_ext.envs.smac imports Ray; keeps it out of --help
    from rllib_ext.envs.smac.factory import resolve_backend
    from rllib_ext.envs.smac.settings import SMACEnvSettings

    defaults = SMAC_ENV_DEFAULTS.get(env, {})
    return resolve_backend(SMACEnvSettings.from_env_config({**defaults, **env_config}))


def preset_line(settings: Any) -> str | None:
    """``preset: NAME (WHY)`` for the resolved ``settings`` (``TrainSettings``), ``None``
    without a preset. WHY is ``settings.preset_reason`` (:data:`EXPLICIT_REASON` or the
    :func:`choose_preset` reason); settings built by hand without one show the name only."""
    if not settings.preset:
        return None
    reason = getattr(settings, "preset_reason", None)
    return f"preset: {settings.preset}" + (f" ({reason})" if reason else "")


def log_preset(settings: Any) -> None:
    """Logs :func:`preset_line` at INFO through the ``rllib_ext.cli`` logger (the console's
    ``[rllib-ext]`` lines); nothing without a preset."""
    line = preset_line(settings)
    if line:
        logger.info("%s", line)
