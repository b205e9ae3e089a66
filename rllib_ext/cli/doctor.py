"""``rllib-ext doctor``: versions, accelerators and optional backends, in three sections.

Versions come from package metadata, so absent or heavy backends (JAX, StarCraft II) are never
imported; each tested package says whether its version is in :data:`rllib_ext._versions.TESTED`.
torch is imported for the CUDA / bf16 checks, Ray and torch for the private-name check
(:mod:`rllib_ext._rllib_private`).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Callable
from pathlib import Path

from rllib_ext import _rllib_private as private
from rllib_ext._threads import thread_policy_rows
from rllib_ext._versions import TESTED, installed_version, tested_note
from rllib_ext.ops.gae import kernel_backend

__all__ = ["SECTIONS", "collect", "render"]

_CORE_PACKAGES = ("rllib-ext", "ray", "torch", "gymnasium", "pettingzoo", "numpy", "numba")
# (import name, distribution name, pip hint)
_OPTIONAL_BACKENDS = (
    ("jax", "jax", 'pip install "rllib-ext[smax]"'),
    ("jaxmarl", "jaxmarl", 'pip install "rllib-ext[smax]"'),
    ("smacv2", "smacv2", "pip install git+https://github.com/oxwhirl/smacv2.git"),
    ("smac", "smac", "pip install git+https://github.com/oxwhirl/smac.git"),
    ("pysc2", "pysc2", "pip install pysc2"),
)

Rows = list[tuple[str, str]]


def _version(distribution: str) -> str:
    """The installed version, with the tested-range note for the packages in ``TESTED``."""
    version = installed_version(distribution)
    if version is None:
        return "not installed"
    if distribution in TESTED:
        return f"{version} ({tested_note(distribution, version)})"
    return version


def _versions() -> Rows:
    rows = [("python", f"{platform.python_version()} ({platform.python_implementation()})")]
    rows += [(name, _version(name)) for name in _CORE_PACKAGES]
    return rows


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _cpu_flag(check: Callable[[], bool]) -> str:
    try:
        return _yes(check())
    except (AttributeError, RuntimeError):
        return "unknown (not in this torch)"


def _accelerators() -> Rows:
    try:
        import torch  # lazy: a missing torch is a row of the report, not a crash
    except ImportError:
        return [("torch", "not installed: no accelerator checks")]
    rows: Rows = []
    cuda = torch.cuda.is_available()
    rows.append(("cuda available", _yes(cuda)))
    rows.append(("cuda build", torch.version.cuda or "none (CPU-only torch build)"))
    rows.append(("cuda device count", str(torch.cuda.device_count() if cuda else 0)))
    if cuda:
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        rows.append(("cuda devices", ", ".join(names)))
        try:
            nccl = torch.cuda.nccl.version()
            nccl_text = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except (AttributeError, RuntimeError):
            nccl_text = "unavailable"
        rows.append(("nccl version", nccl_text))
        rows.append(("cuda bf16", _yes(torch.cuda.is_bf16_supported())))
    else:
        rows.append(("nccl version", "n/a (no CUDA)"))
        rows.append(("cuda bf16", "n/a (no CUDA)"))
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    rows.append(("cpu capability", str(capability)))
    rows.append(("cpu bf16 (avx512_bf16)", _cpu_flag(private.cpu_has_avx512_bf16)))
    rows.append(("cpu amx", _cpu_flag(private.cpu_has_amx)))
    rows.append(("cpu cores", str(os.cpu_count())))
    rows.extend(thread_policy_rows(torch.get_num_threads()))
    return rows


def _backends() -> Rows:
    rows: Rows = []
    for module, distribution, hint in _OPTIONAL_BACKENDS:
        if importlib.util.find_spec(module) is None:
            rows.append((module, f"not installed ({hint})"))
        else:
            version = _version(distribution)
            rows.append((module, version if version != "not installed" else "installed"))
    backend = kernel_backend()
    hint = "compiled" if backend == "numba" else "numba missing or failed: pip install numba"
    rows.append(("GAE kernel", f"{backend} ({hint})"))
    sc2path = os.environ.get("SC2PATH")
    if not sc2path:
        rows.append(("SC2PATH", "not set (StarCraft II backends need it)"))
    else:
        exists = Path(sc2path).expanduser().is_dir()
        rows.append(("SC2PATH", f"{sc2path} ({'exists' if exists else 'MISSING directory'})"))
    return rows


def _private_names() -> Rows:
    """The private RLlib / torch names rllib_ext relies on, checked against this install."""
    missing = private.missing_private_names()
    if not missing:
        return [("private names", f"all {len(private.PRIVATE_NAMES)} present")]
    return [("private names", f"{len(missing)} of {len(private.PRIVATE_NAMES)} MISSING")] + [
        ("missing", line) for line in missing
    ]


SECTIONS: tuple[tuple[str, Callable[[], Rows]], ...] = (
    ("versions", _versions),
    ("accelerators", _accelerators),
    ("optional backends", _backends),
    ("rllib internals", _private_names),
)


def collect() -> dict[str, Rows]:
    return {title: make() for title, make in SECTIONS}


def render(report: dict[str, Rows]) -> str:
    width = max(len(name) for rows in report.values() for name, _ in rows)
    lines: list[str] = []
    for title, rows in report.items():
        lines.append(f"[{title}]")
        lines += [f"  {name:<{width}}  {value}" for name, value in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
