"""Raw input (a ``--config`` YAML file, a preset, one flag) -> checked option values.

Every value goes through its row of the option table (:mod:`rllib_ext.cli.options`); a bad key
or value raises one :class:`~rllib_ext.cli.errors.CLIError` naming the source and the fix. Both
:mod:`~rllib_ext.cli.runconfig` and :mod:`~rllib_ext.cli.presets` build on it. No Ray import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rllib_ext._validation import unknown_keys_error
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.options import ALL_OPTIONS, Option

__all__ = ["BY_KEY", "convert_option", "convert_values", "load_yaml", "unknown_key"]

BY_KEY: dict[str, Option] = {opt.key: opt for opt in ALL_OPTIONS}
"""Every option of :data:`~rllib_ext.cli.options.ALL_OPTIONS` by its key."""


def convert_option(option: Option, value: Any, where: str) -> Any:
    """``option.convert(value)``; a ``ValueError`` becomes a :class:`CLIError` naming ``where``."""
    try:
        return option.convert(value)
    except ValueError as exc:
        raise CLIError(
            f"{where} {value!r} {exc}. Fix: e.g. {option.flag} {option.example}"
        ) from None


def unknown_key(key: str, source: str) -> CLIError:
    """The error for a key of ``source`` that is no option (with the closest one)."""
    error = unknown_keys_error(
        [key],
        [o.key for o in ALL_OPTIONS],
        what=f"key in {source}",
        fix="remove or rename the key; PPO settings go under 'training:'.",
    )
    return CLIError(str(error))


def convert_values(
    data: Mapping[str, Any], *, source: str, where: str | None = None
) -> dict[str, Any]:
    """A YAML mapping (``--config`` file or preset) -> converted option values.

    Raises:
        CLIError: unknown key or bad value, naming ``source``.
    """
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in BY_KEY:
            raise unknown_key(str(raw_key), source)
        values[key] = convert_option(BY_KEY[key], value, f"{key}: in {where or source}:")
    return values


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Reads a ``--config`` YAML file into converted option values.

    Keys are the option keys (``num_env_runners: 1``); dashes are accepted too.

    Raises:
        CLIError: missing file, invalid YAML, not a mapping, unknown key or bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"--config {str(path)!r}: no such file. Fix: pass an existing YAML file.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CLIError(f"--config {str(path)!r} is not valid YAML ({first}).") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise CLIError(
            f"--config {str(path)!r} must hold a mapping (key: value lines), got "
            f"{type(data).__name__}. Fix: write e.g. 'num_env_runners: 1'."
        )
    return convert_values(data, source=f"--config {str(path)!r}", where=path.name)
