"""The versions rllib-ext is tested with, and the one-line warning for any other.

:data:`TESTED` is the one home of the tested ranges: CI runs the full suite on the newest Ray of
the range (``constraints.txt``) and a smoke selection on the oldest (``Makefile`` ``OLDEST_RAY``);
``tests/test_versions.py`` checks both files, and ``pyproject.toml``'s Ray requirement, against
it. Versions are read from package metadata, so nothing here imports Ray, torch or JAX.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re

__all__ = ["TESTED", "installed_version", "tested_note", "untested_packages", "warn_if_untested"]

logger = logging.getLogger("rllib_ext")

TESTED: dict[str, tuple[str, str]] = {
    "ray": ("2.58.0", "2.60.0"),
    "torch": ("2.13.0", "2.13.0"),
    "gymnasium": ("1.2.2", "1.2.2"),
    "jaxmarl": ("0.2.0", "0.2.0"),
}
"""Distribution name -> (oldest, newest) release the test-suite ran on, inclusive."""

_warned = False


def _key(version: str) -> tuple[int, ...]:
    """``"2.60.0"`` -> ``(2, 60, 0)``; what follows the release numbers is dropped
    (``"2.13.0+cpu"`` -> ``(2, 13, 0)``, ``"2.61.0rc1"`` -> ``(2, 61, 0)``)."""
    release = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in release.group(0).split(".")) if release else ()


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tested_note(distribution: str, version: str | None) -> str:
    """``"tested"``, or ``"untested: rllib-ext is tested with 2.58.0-2.60.0"``."""
    oldest, newest = TESTED[distribution]
    span = oldest if oldest == newest else f"{oldest}-{newest}"
    if version is not None and _key(oldest) <= _key(version) <= _key(newest):
        return "tested"
    return f"untested: rllib-ext is tested with {span}"


def untested_packages() -> dict[str, str]:
    """Installed distributions of :data:`TESTED` outside their range -> installed version."""
    found = {}
    for distribution in TESTED:
        version = installed_version(distribution)
        if version is not None and tested_note(distribution, version) != "tested":
            found[distribution] = version
    return found


def warn_if_untested() -> None:
    """Once per process: one warning line when the installed Ray is outside :data:`TESTED`."""
    global _warned
    if _warned:
        return
    _warned = True
    version = installed_version("ray")
    if version is not None and tested_note("ray", version) != "tested":
        oldest, newest = TESTED["ray"]
        logger.warning(
            "Ray %s is not a release rllib-ext was tested with (%s-%s); it runs, but "
            "`rllib-ext doctor` checks the private RLlib names it relies on.",
            version,
            oldest,
            newest,
        )
