"""Learner health: a remote learner that stops showing signs of life fails the run in one line.

RLlib 2.58 waits for remote learners without a timeout (``LearnerGroup.update`` calls
``FaultTolerantActorManager.foreach_actor`` with ``timeout_seconds=None``; there is no
``config.learners(...)`` option for it), so one stopped or deadlocked learner process hangs
``algo.train()``, the final checkpoint and ``algo.stop()`` for ever. A per-call timeout cannot
tell a hung learner from a long update, so health is a heartbeat instead:

* each learner actor runs a daemon thread that reports to a small :class:`HeartbeatBoard`
  actor every :data:`BEAT_INTERVAL_S` (started through ``LearnerGroup.foreach_learner``;
  the thread beats while the learner computes, so a busy learner is healthy);
* :class:`LearnerWatchdog`, a driver thread, fails the run when a learner's last beat is older
  than ``timeout_s`` (``--learner-timeout``), or older than :data:`FROZEN_AFTER_INTERRUPT_S`
  once the run was interrupted (Ctrl-C/SIGTERM then ends the process within seconds even
  though the final checkpoint waits on that learner).

Failing means: one ``rllib-ext: error: ...`` line naming the learner (index, node, pid), its
silence and the last complete checkpoint; the silent learners are killed; the process exits
with :data:`EXIT_LEARNER_HUNG`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = [
    "BEAT_INTERVAL_S",
    "EXIT_LEARNER_HUNG",
    "FROZEN_AFTER_INTERRUPT_S",
    "HeartbeatBoard",
    "LearnerWatchdog",
]

logger = logging.getLogger(__name__)

BEAT_INTERVAL_S = 1.0
FROZEN_AFTER_INTERRUPT_S = 10.0
"""After Ctrl-C/SIGTERM, a learner silent this long is taken as hung (ten missed beats)."""
EXIT_LEARNER_HUNG = 1


class HeartbeatBoard:
    """Last beat per learner, timed on arrival with this actor's clock (no clock skew).

    Runs as a Ray actor (:data:`_BOARD_ACTOR`); the class itself is plain Python.
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def beat(self, key: str) -> None:
        self._last[key] = time.monotonic()

    def silence(self) -> dict[str, float]:
        """Seconds since each learner's last beat."""
        now = time.monotonic()
        return {key: now - last for key, last in self._last.items()}


_BOARD_ACTOR: Any = ray.remote(num_cpus=0)(HeartbeatBoard)
"""``HeartbeatBoard`` as a Ray actor class (no CPU reserved: it only stores timestamps)."""


_boards: dict[str, Any] = {}
"""Board each heartbeat thread of this process reports to (a new watchdog replaces it)."""


def _start_beating(learner: Any, *, board: Any) -> tuple[str, Any]:
    """Runs inside a learner actor: starts its heartbeat thread once; returns (key, handle)."""
    context = ray.get_runtime_context()
    key = f"pid {os.getpid()} on {context.get_node_id()[:8]} ({ray.util.get_node_ip_address()})"
    ray.get(board.beat.remote(key))
    first = key not in _boards
    _boards[key] = board
    if first:

        def beat() -> None:
            while True:
                _boards[key].beat.remote(key)
                time.sleep(BEAT_INTERVAL_S)

        threading.Thread(target=beat, name="rllib_ext-heartbeat", daemon=True).start()
    return key, context.current_actor


@dataclass
class _Learner:
    index: int
    key: str
    handle: Any


class LearnerWatchdog:
    """Watches the remote learners of ``algo`` from a driver thread (see the module docstring).

    Args:
        algo: a built RLlib ``Algorithm``; with a local learner (``num_learners=0``) there is
            nothing to watch and :meth:`start` does nothing.
        timeout_s: silence that fails the run.
        last_checkpoint: returns the newest complete checkpoint (for the message).
        interrupted: returns True once the run was interrupted (Ctrl-C/SIGTERM).
        on_hung: called with the one-line message; the default prints it, kills the silent
            learners and ends the process with :data:`EXIT_LEARNER_HUNG`.
    """

    def __init__(
        self,
        algo: Any,
        *,
        timeout_s: float,
        last_checkpoint: Callable[[], Any] = lambda: None,
        interrupted: Callable[[], bool] = lambda: False,
        on_hung: Callable[[str], None] | None = None,
        poll_s: float = 1.0,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0. Fix: e.g. 600.")
        self._algo = algo
        self._timeout_s = float(timeout_s)
        self._last_checkpoint = last_checkpoint
        self._interrupted = interrupted
        self._on_hung = on_hung or self._fail
        self._poll_s = poll_s
        self._learners: list[_Learner] = []
        self._board: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._silent_learners: list[tuple[_Learner, float]] = []

    def start(self) -> LearnerWatchdog:
        group = self._algo.learner_group
        if group is None or group.is_local:
            return self
        # On the driver's node: a board on a worker node would die with that node, and the
        # watchdog would go blind exactly when learners there go silent.
        here = ray.get_runtime_context().get_node_id()
        self._board = _BOARD_ACTOR.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        ).remote()
        results = group.foreach_learner(functools.partial(_start_beating, board=self._board))
        for result in results:
            key, handle = result.get()
            self._learners.append(_Learner(int(result.actor_id) + 1, key, handle))
        self._learners.sort(key=lambda learner: learner.index)
        self._thread = threading.Thread(target=self._watch, name="rllib_ext-watchdog", daemon=True)
        self._thread.start()
        return self

    @property
    def num_learners(self) -> int:
        """Remote learners watched (0: local learner, nothing to watch)."""
        return len(self._learners)

    def describe(self) -> str:
        """``"learner 1: pid N on NODE (IP); learner 2: ..."``."""
        return "; ".join(f"learner {learner.index}: {learner.key}" for learner in self._learners)

    def stop(self) -> None:
        self._stop.set()
        if self._board is not None:
            ray.kill(self._board)
            self._board = None

    def _silent(self, limit: float) -> list[tuple[_Learner, float]]:
        try:
            silence = ray.get(self._board.silence.remote(), timeout=max(5.0, self._poll_s))
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            return []  # the board itself is busy or gone: no verdict this round
        return [
            (learner, silence[learner.key])
            for learner in self._learners
            if silence.get(learner.key, 0.0) > limit
        ]

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            interrupted = self._interrupted()
            limit = (
                min(self._timeout_s, FROZEN_AFTER_INTERRUPT_S) if interrupted else self._timeout_s
            )
            silent = self._silent(limit)
            if silent and not self._stop.is_set():
                self._silent_learners = silent
                self._on_hung(self._message(silent, interrupted))
                return

    def _message(self, silent: list[tuple[_Learner, float]], interrupted: bool) -> str:
        names = "; ".join(
            f"learner {learner.index} of {len(self._learners)} ({learner.key}) silent for "
            f"{age:.0f} s"
            for learner, age in silent
        )
        why = "after the interrupt" if interrupted else f"--learner-timeout {self._timeout_s:g} s"
        checkpoint = self._last_checkpoint()
        resume = f"--resume {checkpoint}" if checkpoint else "a new run"
        return (
            f"{names} ({why}): the learner is stopped, deadlocked or its node is gone. Last "
            f"complete checkpoint: {checkpoint or 'none'}. Fix: check that learner's process/node, "
            f"then start {resume} (or raise --learner-timeout if updates are that slow)."
        )

    def _fail(self, message: str) -> None:
        line = " ".join(message.split())
        os.write(2, f"\nrllib-ext: error: {line}\n".encode())
        for learner, _ in self._silent_learners:
            with contextlib.suppress(Exception):
                ray.kill(learner.handle, no_restart=True)
        sys.stderr.flush()
        os._exit(EXIT_LEARNER_HUNG)
