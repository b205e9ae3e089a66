"""What features declare so that array-speed sampling loops compose with them unnamed.

A fused loop (an env runner's own loop in place of RLlib's ``_sample``) does what RLlib's
default connector pipelines do itself. A connector piece that only passes the batch through, or
whose effect every fused loop applies too, declares it with the class attribute
:data:`FUSED_EQUIVALENT` ``= True`` (profiling's marks, ``amp_inference``'s float32 cast); any
other piece keeps the call on RLlib's loop. A profiled runner exposes ``runner.sample_clock``
(anything with ``time(phase)``, a context manager); fused loops report
their phases through :func:`sample_phase`. No Ray import.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["FUSED_EQUIVALENT", "fused_equivalent", "sample_phase"]

FUSED_EQUIVALENT = "rllib_ext_fused_equivalent"
"""Class attribute of a connector piece: ``True`` when a fused loop may skip it (see above);
counts only on the class that defines it, not on its subclasses."""


def fused_equivalent(piece: Any) -> bool:
    """Whether ``piece``'s own class declared :data:`FUSED_EQUIVALENT` (a subclass inherits no
    such promise: it may change what the piece does)."""
    return vars(type(piece)).get(FUSED_EQUIVALENT) is True


def sample_phase(env_runner: Any, phase: str) -> AbstractContextManager[Any]:
    """``with sample_phase(self, "env_step"): ...`` in a fused loop: the block counts as
    ``phase`` when the runner is profiled (has ``env_runner.sample_clock``); otherwise nothing happens."""
    clock = getattr(env_runner, "sample_clock", None)
    return clock.time(phase) if clock is not None else nullcontext()
