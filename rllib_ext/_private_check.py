"""The check behind :data:`rllib_ext._rllib_private.PRIVATE_NAMES`: what a private name is and
whether the installed Ray / torch still has it (no Ray or torch import; owners are imported when
checked).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

__all__ = ["Kind", "PrivateName", "problems"]

Kind = Literal["attribute", "method", "function", "state_key", "data_key"]


@dataclass(frozen=True)
class PrivateName:
    """One private name rllib_ext relies on.

    ``owner`` is ``"module:Class"`` (attribute, method, state_key, data_key) or ``"module"``
    (function). ``attribute``: assigned as ``self.<name>`` in the class or a base;
    ``method``: callable on the class; ``function``: callable in the module; ``state_key``: a
    key of ``Class().get_state()``; ``data_key``: a string literal in the class's source.
    """

    owner: str
    name: str
    kind: Kind
    used_by: str


def _resolve(owner: str, import_module: Callable[[str], ModuleType]) -> Any:
    module_name, _, qualname = owner.partition(":")
    obj: Any = import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _assigned_in_source(cls: type, name: str) -> bool:
    pattern = re.compile(rf"self\.{re.escape(name)}\s*(:[^=]*)?=(?!=)")
    for base in inspect.getmro(cls):
        try:
            if pattern.search(inspect.getsource(base)):
                return True
        except (OSError, TypeError):
            continue
    return False


def _problem(entry: PrivateName, import_module: Callable[[str], ModuleType]) -> str | None:
    try:
        owner = _resolve(entry.owner, import_module)
    except (ImportError, AttributeError) as exc:
        return f"{entry.owner} not found ({exc})"
    kind = entry.kind
    if kind == "attribute" and isinstance(owner, ModuleType):
        ok = hasattr(owner, entry.name)
    elif kind == "attribute":
        ok = hasattr(owner, entry.name) or _assigned_in_source(owner, entry.name)
    elif kind in ("method", "function"):
        ok = callable(getattr(owner, entry.name, None))
    elif kind == "state_key":
        ok = entry.name in owner().get_state()
    else:  # data_key
        ok = f'"{entry.name}"' in inspect.getsource(owner)
    return None if ok else f"{entry.owner} has no {kind} {entry.name}"


def problems(
    names: Iterable[PrivateName],
    *,
    import_module: Callable[[str], ModuleType] = importlib.import_module,
) -> list[str]:
    """One line per name of ``names`` that ``import_module``'s modules lack (``[]``: all present):
    ``<owner> has no <kind> <name> (used by <what>)``."""
    lines = []
    for entry in names:
        problem = _problem(entry, import_module)
        if problem is not None:
            lines.append(f"{problem} (used by {entry.used_by})")
    return lines
