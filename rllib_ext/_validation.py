"""Checks shared by every settings object: choices, numbers, booleans, unknown keys.

Used by the extension settings (:mod:`rllib_ext.settings`), the SMAC ``env_config``
(:mod:`rllib_ext.envs.smac.settings`) and the ``rllib-ext`` command line, so a bad value reads
the same everywhere: the key, the value, what is allowed and the fix.

:func:`field_specs` reads a settings dataclass (a ``Literal`` type lists the choices,
``metadata={"bounds": Bounds(...)}`` the range, the attribute docstring the help) for
:func:`check_fields` and for the command line's generated flags. No Ray or torch import.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import math
import re
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "Bounds",
    "SettingSpec",
    "check_bool",
    "check_choice",
    "check_fields",
    "check_number",
    "field_specs",
    "is_allowed",
    "near_miss",
    "unknown_keys_error",
]


def is_allowed(value: Any, allowed: Iterable[Any]) -> bool:
    """``value in allowed``, except that booleans and ``None`` only match themselves.

    Plain ``in`` would accept ``0`` for ``False`` and ``1`` for ``True`` (``bool`` is an ``int``).
    """
    for choice in allowed:
        if choice is None or isinstance(choice, bool) or value is None or isinstance(value, bool):
            if value is choice:
                return True
        elif type(value) is type(choice) and value == choice:
            return True
    return False


def check_choice(key: str, value: Any, allowed: Sequence[Any], *, example: str) -> None:
    """Raises ``ValueError`` unless ``value`` is one of ``allowed`` (see :func:`is_allowed`).

    Args:
        example: the fix, e.g. ``".training(gae='compiled')"``.
    """
    if not is_allowed(value, allowed):
        raise ValueError(
            f"{key}={value!r} is not supported; allowed values: "
            f"{', '.join(repr(a) for a in allowed)}. Fix: pass one of them, e.g. {example}."
        )


def check_bool(key: str, value: Any, *, example: str) -> None:
    """Raises ``ValueError`` unless ``value`` is ``True`` or ``False`` (not ``1``, not ``"false"``)."""
    if not isinstance(value, bool):
        raise ValueError(
            f"{key}={value!r} must be a boolean; allowed values: True, False"
            + (" (a string is not a boolean)" if isinstance(value, str) else "")
            + f". Fix: pass e.g. {example}."
        )


@dataclass(frozen=True)
class Bounds:
    """The allowed range of a number setting (always finite; booleans are never numbers)."""

    integer: bool = False
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def describe(self) -> str:
        """E.g. ``"an integer >= 1"``, ``"a finite number in (0, 1)"``."""
        kind = "an integer" if self.integer else "a finite number"
        low = (
            ("(", self.gt)
            if self.gt is not None
            else ("[", self.ge)
            if self.ge is not None
            else None
        )
        high = (
            (")", self.lt)
            if self.lt is not None
            else ("]", self.le)
            if self.le is not None
            else None
        )
        if low and high:
            return f"{kind} in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
        if low:
            return f"{kind} {'>' if low[0] == '(' else '>='} {low[1]:g}"
        if high:
            return f"{kind} {'<' if high[0] == ')' else '<='} {high[1]:g}"
        return kind

    def contains(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):  # also NaN: every comparison below would be False anyway
            return False
        return not (
            (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )


def check_number(key: str, value: Any, bounds: Bounds, *, example: str) -> None:
    """Raises ``ValueError`` unless ``value`` is a number inside ``bounds`` (inf/NaN never are)."""
    if not bounds.contains(value):
        raise ValueError(
            f"{key}={value!r} is out of range; allowed: {bounds.describe()}. "
            f"Fix: pass e.g. {example}."
        )


def unknown_keys_error(
    unknown: Iterable[str], allowed: Sequence[str], *, what: str, fix: str
) -> ValueError:
    """The error for keys that are not settings, with the closest known key for each.

    Args:
        unknown: the bad keys.
        allowed: every valid key, in the order to list them.
        what: e.g. ``"rllib_ext setting(s) in learner_config_dict"``.
        fix: the last sentence, e.g. ``"remove the key or use one of the allowed names."``.
    """
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ValueError(
        f"Unknown {what}: {', '.join(hints)}. Allowed keys: {', '.join(allowed)}. Fix: {fix}"
    )


NEAR_MISS_CUTOFF = 0.8
"""``difflib`` ratio from which a key reads as a misspelling of a known one."""


def near_miss(key: str, known: Sequence[str]) -> str | None:
    """The known key that ``key`` most likely misspells, or ``None`` for a key of its own.

    A misspelling: the same key up to case and ``-``/``_``, two neighbouring characters
    swapped (``gea``), or a ``difflib`` ratio >= :data:`NEAR_MISS_CUTOFF` (``grad_compresion``).
    Keys far from every known one (RLlib's example keys ``regularizer_coeff``, ``lr_vf``) are not.
    """
    text = str(key)
    norm = text.lower().replace("-", "_")
    swaps = {norm[:i] + norm[i + 1] + norm[i] + norm[i + 2 :] for i in range(len(norm) - 1)}
    for name in known:
        if norm == name or name in swaps:
            return name
    close = difflib.get_close_matches(norm, list(known), n=1, cutoff=NEAR_MISS_CUTOFF)
    return close[0] if close else None


def check_known_keys(keys: Iterable[Any], allowed: Sequence[str], *, what: str, fix: str) -> None:
    """Raises :func:`unknown_keys_error` for the ``keys`` (in their order) not in ``allowed``."""
    unknown = [key for key in keys if key not in allowed]
    if unknown:
        raise unknown_keys_error(unknown, allowed, what=what, fix=fix)


@dataclass(frozen=True)
class SettingSpec:
    """One field of a settings dataclass, as validation, the command line and the docs see it."""

    name: str
    component: type
    kind: str
    """``"choice"``, ``"bool"``, ``"int"`` or ``"float"``."""
    default: Any
    choices: tuple[Any, ...] = ()
    bounds: Bounds | None = None
    doc: str = ""
    """The field's attribute docstring, whitespace-normalized."""
    example: Any = None
    """A good value, used in the fix of an error message (``metadata={"example": ...}``)."""

    @property
    def summary(self) -> str:
        """The first sentence of the docstring, without reST markup (for ``--help``)."""
        first = re.sub(r"``(.*?)``", r"\1", self.doc.split(". ")[0].strip())
        return first if first.endswith(".") else first + "."


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    except (OSError, TypeError):  # no source shipped: the help goes without the docs
        return {}
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for stmt, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


@functools.cache
def field_specs(cls: type) -> tuple[SettingSpec, ...]:
    """The :class:`SettingSpec` of every field of the dataclass ``cls``, in declaration order.

    Raises:
        TypeError: a field whose type is not a ``Literal``, ``bool``, ``int`` or ``float``.
    """
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    specs = []
    for f in fields(cls):
        hint = hints[f.name]
        default = f.default_factory() if callable(f.default_factory) else f.default
        if typing.get_origin(hint) is Literal:
            kind, choices = "choice", typing.get_args(hint)
        elif hint is bool:
            kind, choices = "bool", (True, False)
        elif hint in (int, float):
            kind, choices = hint.__name__, ()
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported setting type {hint!r}")
        specs.append(
            SettingSpec(
                name=f.name,
                component=cls,
                kind=kind,
                default=default,
                choices=choices,
                bounds=f.metadata.get("bounds"),
                doc=docs.get(f.name, ""),
                example=f.metadata.get("example", default),
            )
        )
    return tuple(specs)


def check_fields(settings: Any, *, example: Callable[[str, Any], str]) -> None:
    """Checks every field of a settings dataclass against its spec, in declaration order.

    Args:
        example: builds the fix from a key and a good value, e.g. ``.training(key=value)``.

    Raises:
        ValueError: the first field with a bad value.
    """
    cls: type = type(settings)
    for spec in field_specs(cls):
        value = getattr(settings, spec.name)
        fix = example(spec.name, spec.example)
        if spec.kind == "choice":
            check_choice(spec.name, value, spec.choices, example=fix)
        elif spec.kind == "bool":
            check_bool(spec.name, value, example=fix)
        elif spec.kind == "int" or spec.kind == "float":
            bounds = spec.bounds or Bounds(integer=spec.kind == "int")
            check_number(spec.name, value, bounds, example=fix)
