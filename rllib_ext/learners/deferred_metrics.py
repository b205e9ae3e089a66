"""A learner's ``MetricsLogger`` during one update: values recorded, handed over once.

RLlib's update logs a dozen values per minibatch (the loss terms, gradient norms,
off-policyness, steps trained), each through ``MetricsLogger.log_value``'s key lookup and stats
push. :class:`DeferredMetrics` stands in for the logger while the update runs: ``log_value`` and
``log_dict`` append to a per-key list; anything else asked of it (``reduce``, ``peek``,
``log_time``, ``key in``, ...) first hands the recorded values to the real logger, then goes there. The
handover pushes, per key in first-logged order, what leaves the logger's stats as the full
sequence of pushes would:

* the last ``window`` values for a windowed mean (``window=1``: the last value);
* the last value for ``reduce="item"``;
* one push of the total for ``"sum"`` / ``"lifetime_sum"`` of plain finite numbers (the stats
  skip NaN, so anything else is pushed one by one);
* every value, in order, for anything else (EMA, min/max, percentiles, unwindowed means),
  wherever one key was logged with different options, and where the logger already keeps stats
  under the key with another reduction or window than the calls ask for (it keeps its own).

Contract: after the handover the real logger holds what it would hold had every call gone to it
(stats are per key, so the order between keys does not matter); no value is lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rllib_ext import _rllib_private as private

__all__ = ["DeferredMetrics", "deferred_metrics"]


def _key(key: Any) -> tuple[Any, ...]:
    # RLlib's force_tuple.
    if isinstance(key, tuple):
        return key
    return tuple(key) if isinstance(key, list) else (key,)


def _recordable(value: Any) -> bool:
    """Values whose pushes :func:`_to_push` may drop or add up (not ``Stats`` objects)."""
    return isinstance(value, (int, float, str, np.generic, np.ndarray, torch.Tensor))


def _resolved_reduce(options: Mapping[str, Any]) -> str | None:
    """``log_value``'s own defaulting: a window means "mean", nothing means "ema"."""
    reduce = options.get("reduce")
    if reduce is None:
        return "mean" if options.get("window") is not None else "ema"
    return str(reduce)


def _plain_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _to_push(
    values: list[Any], options: Mapping[str, Any], kept: tuple[str, Any] | None
) -> list[Any]:
    """The pushes that leave the stats as pushing every one of ``values`` would. ``kept``: the
    ``(reduce, window)`` of the stats the logger already keeps under the key (``None``: none,
    so ``options`` create them); stats kept with other settings get every value."""
    reduce, window = _resolved_reduce(options), options.get("window")
    plain = not options.get("percentiles") and options.get("ema_coeff") is None
    if not plain or (kept is not None and kept != (reduce, window)):
        return values
    if reduce == "mean" and isinstance(window, int) and window >= 1:
        return values[-window:]
    if reduce == "item":
        return values[-1:]
    if reduce in ("sum", "lifetime_sum") and window is None:
        if all(_plain_number(v) for v in values):
            return [sum(values)]
    return values


class DeferredMetrics:
    """Records ``log_value`` / ``log_dict`` for ``logger`` (a ``MetricsLogger``); see the module
    docstring. Every other attribute is the logger's, after :meth:`flush`."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self._calls: dict[tuple[Any, ...], list[tuple[Any, dict[str, Any]]]] = {}
        """Per key, in first-logged order: each call's value and options."""

    def log_value(self, key: Any, value: Any, **options: Any) -> None:
        """``MetricsLogger.log_value``, recorded."""
        if not _recordable(value):
            self.flush()
            self.logger.log_value(key, value, **options)
            return
        self._calls.setdefault(_key(key), []).append((value, options))

    def log_dict(self, value_dict: Any, *, key: Any = None, **options: Any) -> None:
        """``MetricsLogger.log_dict``, recorded (its default ``reduce="mean"`` included)."""
        if not isinstance(value_dict, dict) or not self._only_dicts(value_dict):
            # Lists and tuples are structure to RLlib's log_dict: let it flatten them.
            self.flush()
            self.logger.log_dict(value_dict, key=key, **options)
            return
        options.setdefault("reduce", "mean")
        prefix = () if key is None else _key(key)
        for path, value in self._flat(value_dict, ()):
            self.log_value(prefix + path, value, **options)

    def flush(self) -> None:
        """Hands every recorded value to the logger (see the module docstring)."""
        calls, self._calls = self._calls, {}
        for key, logged in calls.items():
            options = logged[0][1]
            if any(other != options for _, other in logged[1:]):
                pushes = logged  # one key, different options: every call as it came
            else:
                kept = private.logged_stats_kind(self.logger, key)
                values = [value for value, _ in logged]
                pushes = [(value, options) for value in _to_push(values, options, kept)]
            for value, value_options in pushes:
                self.logger.log_value(key, value, **value_options)

    def __contains__(self, key: Any) -> bool:
        self.flush()
        return key in self.logger

    def __enter__(self) -> Any:
        self.flush()
        return self.logger.__enter__()

    def __exit__(self, *exc_info: Any) -> Any:
        return self.logger.__exit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the logger's other methods.
        self.flush()
        return getattr(self.logger, name)

    @classmethod
    def _only_dicts(cls, value: Any) -> bool:
        if isinstance(value, dict):
            return all(cls._only_dicts(v) for v in value.values())
        return not isinstance(value, (list, tuple))

    @classmethod
    def _flat(cls, value: dict, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
        try:  # dm-tree, behind RLlib's log_dict, walks a dict in sorted key order
            items = sorted(value.items())
        except TypeError:
            items = list(value.items())
        for name, item in items:
            if isinstance(item, dict):
                yield from cls._flat(item, (*path, name))
            else:
                yield (*path, name), item


@contextmanager
def deferred_metrics(learner: Any) -> Iterator[DeferredMetrics]:
    """``learner.metrics`` is a :class:`DeferredMetrics` inside the block; the recorded values
    reach the real logger by the block's end (also when it raises)."""
    logger = learner.metrics
    deferred = DeferredMetrics(logger)
    learner.metrics = deferred
    try:
        yield deferred
    finally:
        learner.metrics = logger
        deferred.flush()
