"""The one error type of the ``rllib-ext`` command: bad user input, found before Ray starts.

A leaf: every CLI module raises :class:`CLIError` and ``main`` prints it as one
``rllib-ext: error: ...`` line (exit status 2), so this module imports nothing of ours.
"""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """Bad user input. ``main`` prints it as one ``rllib-ext: error: ...`` line."""
