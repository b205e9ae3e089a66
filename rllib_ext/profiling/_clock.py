"""Wall-clock accounting: named phase accumulators and method wrappers.

Everything here uses ``time.perf_counter`` (monotonic, sub-microsecond on Linux). The wrappers
replace *instance* attributes only, so the class (and every other instance) is untouched.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

__all__ = ["PhaseClock", "TimedCallable", "interval_union", "wrap_method"]

_WRAPPED_ATTR = "_rllib_ext_profiling_wrapped"


class PhaseClock:
    """Seconds spent per phase name since the last :meth:`pop`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.intervals: list[tuple[float, float]] = []

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1

    def add_interval(self, start: float, end: float) -> None:
        """An interval (``perf_counter`` times) during which a collective was in flight."""
        self.intervals.append((start, end))

    def pop(self) -> dict[str, Any]:
        """``{"seconds": {...}, "calls": {...}, "comm_s": union of intervals}``; then resets."""
        out = {
            "seconds": dict(self.seconds),
            "calls": dict(self.calls),
            "comm_s": interval_union(self.intervals),
        }
        self.seconds.clear()
        self.calls.clear()
        self.intervals.clear()
        return out


def interval_union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping ``(start, end)`` intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def wrap_method(obj: Any, name: str, clock: PhaseClock, phase: str) -> None:
    """Times every call of ``obj.<name>`` into ``clock[phase]`` (instance attribute only)."""
    original = getattr(obj, name)
    if getattr(original, _WRAPPED_ATTR, False):
        return

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            clock.add(phase, time.perf_counter() - start)

    setattr(timed, _WRAPPED_ATTR, True)
    object.__setattr__(obj, name, timed)


class TimedCallable:
    """Stands in for a callable object (a connector) and times its calls; delegates the rest."""

    def __init__(self, inner: Callable[..., Any], clock: PhaseClock, phase: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_clock", clock)
        object.__setattr__(self, "_phase", phase)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._clock.add(self._phase, time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - RLlib names connector timers after the class
        return type(self._inner)

    def __repr__(self) -> str:
        return f"TimedCallable({self._inner!r})"
