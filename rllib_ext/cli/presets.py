"""Per-env presets of ``rllib-ext train``: small YAML files shipped in ``rllib_ext/presets/``.

A preset holds the keys of a ``--config`` YAML file (``env``, ``training: {...}``,
``model_config``...) plus a one-line ``description``. ``rllib-ext train --preset smax-3m``
applies one; ``rllib-ext presets`` lists them.

Where a preset sits in the precedence of :func:`rllib_ext.cli.runconfig.resolve_settings`
(lowest first): defaults, the resumed checkpoint's settings, **the preset**, ``--config``
YAML, ``--training``, ``--set``, flags. The user always wins; ``training`` and
``model_config`` are merged key by key over the preset's, and so is ``env_config`` while the
env is the preset's.

SMAC envs (``--env smac_v2``, ``smac``, ``smax``) without ``--preset`` get the :data:`SMAC_PRESET`
automatically (SMAC-sized PPO, no CartPole stop reward), just above the defaults and below a
resumed checkpoint's settings.

No Ray import: ``--help`` lists the preset names from the file names.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = [
    "SMAC_PRESET",
    "Preset",
    "auto_preset",
    "env_backend",
    "list_presets",
    "load_preset",
    "preset_names",
    "render_presets",
]

SMAC_PRESET = "smac"
"""Applied to SMAC envs when no ``--preset`` is given."""

_SUFFIX = ".yaml"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    values: dict[str, Any]
    """Converted option values, as :func:`rllib_ext.cli.runconfig.load_yaml` returns them."""


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
    import yaml

    from rllib_ext.cli.runconfig import CLIError, convert_values

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
    return Preset(name, description, convert_values(data, source=f"preset {name!r}"))


def list_presets() -> list[Preset]:
    return [load_preset(name) for name in preset_names()]


def render_presets() -> str:
    """What ``rllib-ext presets`` prints: one ``name  description`` line per preset."""
    presets = list_presets()
    width = max(len(p.name) for p in presets)
    lines = [f"{p.name:<{width}}  {p.description}" for p in presets]
    lines.append("")
    lines.append(
        "Use: rllib-ext train --preset NAME [flags]; flags, --set, --training and --config win "
        f"over the preset. SMAC envs without --preset use '{SMAC_PRESET}'."
    )
    return "\n".join(lines)


def auto_preset(env: str) -> str | None:
    """The preset a run of ``env`` gets without ``--preset``: :data:`SMAC_PRESET` for SMAC
    envs, else none (the defaults are CartPole's)."""
    from rllib_ext.envs import is_smac_env

    return SMAC_PRESET if is_smac_env(env) else None


def env_backend(env: str, env_config: Mapping[str, Any]) -> str | None:
    """The SMAC backend a run of ``env`` will use (``"smacv2"``, ``"smac"`` or ``"smax"``,
    with ``backend="auto"`` resolved as the env resolves it), ``None`` for other envs."""
    from rllib_ext.envs import SMAC_ENV_DEFAULTS, is_smac_env

    if not is_smac_env(env):
        return None
    from rllib_ext.envs.smac.factory import resolve_backend
    from rllib_ext.envs.smac.settings import SMACEnvSettings

    defaults = SMAC_ENV_DEFAULTS.get(env, {})
    return resolve_backend(SMACEnvSettings.from_env_config({**defaults, **env_config}))
