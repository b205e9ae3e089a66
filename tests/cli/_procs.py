"""Helpers for tests that start the installed console scripts (``rllib-ext``, ``ray``)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
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


def stop_ray_head(head: subprocess.Popen) -> None:
    """Ends a ``ray start --head --block`` started with ``start_new_session=True``: SIGTERM to
    the ``ray start`` process only (it stops its GCS, raylet and workers and exits, about 2 s
    here; SIGTERM to the whole group left it waiting 30+ s for children that had already been
    signalled), then SIGKILL to whatever of its process group is left, always."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone: nothing left
        pass
    head.wait()
