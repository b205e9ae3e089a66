"""Value converters of the ``rllib-ext train`` option table (:mod:`rllib_ext.cli.options`).

Each converter takes a command-line string or a YAML value and returns the typed value or
raises ``ValueError(reason)``; the caller adds where the value came from and the fix.

No Ray or torch import: ``rllib-ext --help`` builds its parser from the table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from rllib_ext._validation import Bounds, SettingSpec, is_allowed

__all__ = [
    "as_bool",
    "choice",
    "choice_names",
    "class_paths",
    "display",
    "float_value",
    "fraction",
    "int_at_least",
    "json_object",
    "number",
    "one_of",
    "optional",
    "parse_set_value",
    "resource_map",
    "text",
]


# value or raises ValueError(reason); the caller adds where the value came from and the fix.


def _reject_bool(value: Any) -> None:
    # YAML `yes`/`true` load as bool, and bool is an int subclass: never a count.
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")


def int_at_least(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        _reject_bool(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            number = int(value) if not isinstance(value, float) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(number, float) or number < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return number

    return convert


def optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert_optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return convert(value)

    return convert_optional


def float_value(*, positive: bool = False, minimum: float | None = None) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        _reject_bool(value)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("must be a number") from None
        if not math.isfinite(number):
            raise ValueError("must be a finite number")
        if positive and number <= 0:
            raise ValueError("must be > 0")
        if minimum is not None and number < minimum:
            raise ValueError(f"must be >= {minimum:g}")
        return number

    return convert


def fraction(value: Any) -> float:
    number = float_value()(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("must be a fraction between 0 and 1")
    return number


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a JSON object ({{...}}), got {type(value).__name__}")
    return dict(value)


def display(value: Any) -> str:
    """How a setting value is spelled on the command line (``False`` -> ``off``, ``None`` ->
    ``none``, booleans ``true``/``false``)."""
    if value is None:
        return "none"
    if value is False:
        return "false"
    if value is True:
        return "true"
    return f"{value:g}" if isinstance(value, float) else str(value)


def choice_names(spec: SettingSpec) -> dict[str, Any]:
    # `amp`'s off value is False: spelled "off" there, like "none" for grad_compression.
    return {("off" if c is False else display(c)): c for c in spec.choices}


def choice(spec: SettingSpec) -> Callable[[Any], Any]:
    names = choice_names(spec)

    def convert(value: Any) -> Any:
        if isinstance(value, str) and value in names:
            return names[value]
        if not isinstance(value, str) and is_allowed(value, spec.choices):
            return value
        raise ValueError(f"is not supported; allowed values: {', '.join(names)}")

    return convert


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ValueError("must be true or false")


def number(bounds: Bounds) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        _reject_bool(value)
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value) if bounds.integer else float(value)
            except ValueError:
                number = math.nan
        elif bounds.integer and isinstance(value, float) and value.is_integer():
            number = int(value)
        if not bounds.contains(number):
            raise ValueError(f"must be {bounds.describe()}")
        return number

    return convert


def parse_set_value(text: str) -> Any:
    """The value of ``--set key=VALUE``: JSON (numbers, true/false/null, lists, objects) or
    else the text itself (``--set amp=bf16``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def one_of(value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"is not supported; allowed values: {', '.join(allowed)}")
    return str(value)


_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def resource_map(value: Any) -> dict[str, float]:
    """A JSON object of custom Ray resource name -> amount > 0 (``{"learner_node": 1}``)."""
    resources = json_object(value)
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError("must map resource names (non-empty strings) to amounts")
        if name in _BUILTIN_RESOURCES:
            raise ValueError(
                f"names the built-in resource {name!r}, which has its own flag "
                "(--num-gpus-per-learner, --num-env-runners); use custom resource names only"
            )
        try:
            resources[name] = float_value(positive=True)(amount)
        except ValueError:
            raise ValueError(
                f"must map each resource to a number > 0, got {name!r}: {amount!r}"
            ) from None
    return resources


def class_paths(value: Any) -> list[str]:
    """``pkg.module:Class`` paths: one, comma-separated ones, or a YAML list of them."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError("must be 'pkg.module:Class' or a list of them")
    paths = []
    for item in items:
        module, sep, name = str(item).strip().partition(":")
        if not sep or not module or not name.isidentifier():
            raise ValueError(f"has {str(item).strip()!r}, not of the form 'pkg.module:Class'")
        paths.append(f"{module}:{name}")
    return paths
