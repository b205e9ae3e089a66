"""User input that is not a setting value: paths, the Ray address, checkpoint files.

:func:`check_inputs` runs before ``ray.init``; :func:`one_line_error` is the CLI boundary's
translation of the errors that can only show up later (a checkpoint that is truncated or was
trained on another env) into the one line ``main`` prints.
"""

from __future__ import annotations

import json
import pickle
import socket
from pathlib import Path
from typing import Any

from rllib_ext.cli.errors import CLIError

__all__ = ["ADDRESS_TIMEOUT_S", "check_address", "check_inputs", "one_line_error"]

ADDRESS_TIMEOUT_S = 30.0
"""How long ``--address HOST:PORT`` may take to accept a connection before the run fails."""

_CHECKPOINT_FIX = (
    "Fix: resume/evaluate another checkpoint (the run directory picks the newest complete "
    "one), or start a new run."
)


def _check_directory(value: str | None, flag: str) -> None:
    if value is None:
        return
    path = Path(value).expanduser()
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is a file" if candidate == path else f"is under the file {candidate}"
                raise CLIError(
                    f"{flag} {value!r} {where}, not a directory. Fix: pass a directory path "
                    "(it is created if missing)."
                )
            return


def check_address(address: str | None, *, timeout_s: float = ADDRESS_TIMEOUT_S) -> None:
    """Fails in one line when ``--address HOST:PORT`` accepts no connection in ``timeout_s``.

    ``auto``, ``local`` and ``ray://`` client addresses are left to ``ray.init``.
    """
    if address is None or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CLIError(
            f"--address {address!r} is not HOST:PORT. Fix: e.g. --address 10.0.0.1:6379 (what "
            "'ray start --head' prints), or --address auto."
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise CLIError(
            f"--address {address!r}: no Ray cluster answers there ({reason} after at most "
            f"{timeout_s:g} s). Fix: start one with 'ray start --head --port {port}' or pass the "
            "address 'ray start' printed."
        ) from None


def check_inputs(settings: Any) -> None:
    """Paths and the Ray address of ``settings`` (a ``TrainSettings``), before Ray starts."""
    _check_directory(settings.run_dir, "--run-dir")
    _check_directory(settings.checkpoint_dir, "--checkpoint-dir")
    check_address(settings.address)


def _is_checkpoint_corruption(exc: BaseException) -> bool:
    if isinstance(exc, (pickle.UnpicklingError, EOFError, json.JSONDecodeError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "PytorchStreamReader failed" in text or "size mismatch" in text
    )


def one_line_error(
    exc: BaseException, *, checkpoint: str | None = None, config_file: str | None = None
) -> str | None:
    """The one-line message for ``exc`` if it is bad input found late, else ``None``.

    Args:
        checkpoint: the checkpoint the command was loading (``--resume`` / ``evaluate``), if any.
        config_file: the ``--config`` YAML file, if any.
    """
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, UnicodeDecodeError):
        what = f"--config {config_file!r}" if config_file else "a settings file"
        return (
            f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start}). Fix: save it as UTF-8."
        )
    if not _is_checkpoint_corruption(exc):
        return None
    where = f"checkpoint {checkpoint!r}" if checkpoint else "the checkpoint"
    if "size mismatch" in str(exc):
        detail = next(
            (line.strip() for line in str(exc).splitlines() if "size mismatch" in line), first
        )
        return (
            f"{where} does not fit this env/model ({detail[:200]}): it was trained on an env with "
            f"other observation/action spaces or another model. Fix: pass the --env and "
            f"--env-config it was trained with, or start a new run."
        )
    return (
        f"{where} is incomplete or corrupt ({type(exc).__name__}: {first[:200]}). {_CHECKPOINT_FIX}"
    )
