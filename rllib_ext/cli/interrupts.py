"""Ctrl-C and SIGTERM for ``rllib-ext train``: the first one stops the run cleanly (final
checkpoint, summary), a second one ends the process at once.

SIGTERM is what schedulers and Kubernetes send; it is treated exactly like the first Ctrl-C,
and the process then exits with ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM), as a
shell reports a process killed by that signal. Ray shields the local cluster it starts from
SIGINT only: a SIGTERM to the whole process group also ends the raylet, after which Ray ends
the driver (status 1), possibly before the final checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["RunInterrupted", "Signals", "exit_code_for"]

_HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread by the first SIGINT or SIGTERM (a ``KeyboardInterrupt``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code_for(signum: int) -> int:
    return 128 + signum


class Signals:
    """Installs the handlers for SIGINT and SIGTERM while the run is in :meth:`installed`.

    * First signal: raises :class:`RunInterrupted` where the main thread is, except inside
      :meth:`deferred` sections (a metrics row, a checkpoint commit), which finish first.
    * After :meth:`stopping` (the final checkpoint and summary are being written), a first
      signal is only recorded.
    * Second signal: one line on stderr and ``os._exit(128 + signum)`` at once; a checkpoint
      being written stays an incomplete temporary directory that resume skips.

    A signal that was ignored when the run started (``nohup``, background jobs of a
    non-interactive shell) stays ignored.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferring = 0
        self._pending = False
        self._stopping = False
        self._installed: list[int] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[Signals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in _HANDLED}
        self._installed = [s for s in _HANDLED if previous[s] is not signal.SIG_IGN]
        self.reclaim()
        try:
            yield self
        finally:
            self._installed = []
            for s, handler in previous.items():
                signal.signal(s, handler)

    def reclaim(self) -> None:
        """(Re)installs the handlers: call after ``ray.init``, whose core worker installs a C-level
        SIGTERM handler that would end the process without a checkpoint."""
        for s in self._installed:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            os.write(
                2,
                b"\nrllib-ext: second signal: exiting now (a checkpoint being written is left "
                b"incomplete; resume skips it)\n",
            )
            os._exit(exit_code_for(signum))
        self.signum = signum
        if self._stopping:
            return
        if self._deferring:
            self._pending = True
            return
        raise RunInterrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A section a first signal does not cut short; it is raised when the section ends."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self._pending and not self._deferring:
            self._pending = False
            raise RunInterrupted(self.signum or signal.SIGINT)

    def stopping(self) -> None:
        """From now on a first signal is recorded but not raised (we are already stopping)."""
        self._stopping = True
