"""``rllib-ext train --address`` under Ray's token authentication.

Since Ray 2.59 every local cluster a plain ``ray.init()`` starts turns token authentication on
and writes the token to ``~/.ray/auth_token``; ``ray start --head`` then requires it whenever
that file exists. A client sends its token only while ``RAY_AUTH_MODE=token``, which Ray sets
itself for ``address="auto"`` but not for an explicit ``HOST:PORT``. :func:`client_auth` does
what Ray does for ``auto``: with ``RAY_AUTH_MODE`` unset and a token at hand it sets
``RAY_AUTH_MODE=token`` for this process (a cluster without authentication accepts such a
client too; Ray 2.58 reads the same variables). :func:`auth_failure` turns a refused connection
into one line naming the cause and the fix.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import ray

from rllib_ext import _rllib_private as private
from rllib_ext.cli.errors import CLIError

__all__ = ["AUTH_FIX", "auth_failure", "client_auth", "init_ray", "probe_auth", "token_source"]

logger = logging.getLogger("rllib_ext.cli")

MODE_VAR = "RAY_AUTH_MODE"

AUTH_FIX = (
    "Fix: give this machine the cluster's token (the head's ~/.ray/auth_token, or "
    "RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH) with RAY_AUTH_MODE=token, and start every node "
    "(`ray start --head` and each `ray start --address`) with the same RAY_AUTH_MODE and token; "
    "or start the cluster with RAY_AUTH_MODE=disabled on every node."
)


def token_source(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Where Ray would read a token from (``None``: nowhere), in Ray's order of precedence."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path}" if Path(path).expanduser().is_file() else None
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def client_auth(environ: MutableMapping[str, str] | None = None) -> str:
    """Sets ``RAY_AUTH_MODE=token`` when it is unset and a token exists; says what applies.

    Returns:
        A short description for the ``ray.init`` log line, e.g.
        ``"token (from /root/.ray/auth_token)"``, ``"disabled (RAY_AUTH_MODE)"``, ``"none"``.
    """
    env = os.environ if environ is None else environ
    mode = env.get(MODE_VAR)
    if mode is not None:
        return f"{mode} ({MODE_VAR})"
    source = token_source(env)
    if source is None:
        return "none (no token on this machine)"
    env[MODE_VAR] = "token"
    return f"token (from {source})"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def auth_failure(exc: BaseException, address: str) -> str | None:
    """One line for a connection Ray refused for authentication (``None``: another cause).

    Ray raises ``ConnectionError("Failed to connect ...")`` from an ``AuthenticationError`` (or
    a gRPC ``UNAUTHENTICATED`` status) after its connection retries.
    """
    for link in _chain(exc):
        text = f"{type(link).__name__}: {link}"
        if (
            "AuthenticationError" in text
            or "UNAUTHENTICATED" in text.upper()
            or ("auth" in text.lower() and "token" in text.lower())
        ):
            mode = os.environ.get(MODE_VAR, "unset")
            source = token_source() or "none"
            return (
                f"--address {address}: the Ray cluster refused this client's authentication "
                f"(RAY_AUTH_MODE {mode}, token: {source}). {AUTH_FIX}"
            )
    return None


_PROBE = """
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
except Exception as exc:
    while exc is not None:
        print(type(exc).__name__, exc)
        exc = exc.__cause__ or exc.__context__
    sys.exit(1)
"""


def probe_auth(address: str, *, timeout_s: float = 60.0) -> str | None:
    """Connects to ``address`` from a child process, its output captured; the one-line
    :func:`auth_failure` if the cluster refused it for authentication, else ``None``.

    Ray retries a refused connection for 20 s, printing a warning a second from its C++ core;
    the child keeps those lines off this console and gives up after 5 s.
    """
    env = {**os.environ, "RAY_gcs_server_port_wait_time_s": "5"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None  # let ray.init say what is wrong
    if done.returncode == 0:
        return None
    return auth_failure(RuntimeError(done.stdout + done.stderr), address)


def init_ray(init_kwargs: dict[str, Any]) -> None:
    """``ray.init(**init_kwargs)``; with an explicit ``address``, under :func:`client_auth`
    and after :func:`probe_auth`.

    Raises:
        CLIError: Ray refused the connection for authentication (one line).
    """
    address = init_kwargs.get("address")
    if address in (None, "local", "auto"):
        ray.init(**init_kwargs)
        return
    logger.info("ray auth: %s", client_auth())
    refused = probe_auth(str(address))
    if refused is not None:
        raise CLIError(refused)
    private.reload_ray_config()  # RAY_AUTH_MODE may have been set after `import ray`
    ray.init(**init_kwargs)
