"""Helpers for tests that start the installed console scripts (``rllib-ext``, ``ray``)."""

from __future__ import annotations

import secrets
import shutil
import socket
import sys
from pathlib import Path

import pytest


def console_script(name: str) -> str:
    """Path of the console script ``name`` installed next to this Python; skips (with the fix)
    when the package was not installed into this environment."""
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} not installed next to {sys.executable}: pip install -e . --no-deps")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_auth_env(directory: Path) -> dict[str, str]:
    """Ray token authentication for every node and client of one test cluster: a fresh token in
    ``directory`` and ``RAY_AUTH_MODE=token``, set explicitly so the test passes whether or not
    this machine has ``~/.ray/auth_token`` (Ray >= 2.59 writes one at a plain ``ray.init()``)."""
    path = directory / "auth_token"
    path.write_text(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
