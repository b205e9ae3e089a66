"""``DeferredMetrics`` against RLlib's ``MetricsLogger`` fed call by call.

The same calls (each kind of reduction, windows, NaN, tensors, nested ``log_dict``, one key with
two option sets) go to one logger directly and to another through ``DeferredMetrics``; after the
handover both reduce to the same results. Reading the logger mid-way hands the values over first.
"""

from __future__ import annotations

import math

import pytest
import torch
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ext.learners.deferred_metrics import DeferredMetrics, deferred_metrics


def _calls(metrics) -> None:
    for step in range(12):
        x = float(step)
        metrics.log_value(("m", "loss"), torch.tensor(x * 0.5), window=1)
        metrics.log_value(("m", "last3"), x, window=3)
        metrics.log_value(("m", "ema"), x)  # no reduce, no window: RLlib's EMA
        metrics.log_value(("m", "mean_all"), 250 if step % 2 else 200, reduce="mean")
        metrics.log_value(("all", "steps"), 250, reduce="sum", with_throughput=True)
        metrics.log_value(("all", "lifetime"), 250, reduce="lifetime_sum", with_throughput=True)
        metrics.log_value(("all", "nan_sum"), math.nan if step == 3 else x, reduce="sum")
        metrics.log_value(("all", "tensor_sum"), torch.tensor(x), reduce="sum")
        metrics.log_value("max", -x if step < 6 else x, reduce="max")
        metrics.log_value("item", f"s{step}", reduce="item")
        metrics.log_dict({"a": x, "b": {"c": torch.tensor(2 * x)}}, key="m", window=1)
        metrics.log_dict({"d": x}, key=("m", "plain"))  # log_dict's own reduce="mean"
        metrics.log_value(
            "mixed", x, window=1 if step % 3 else 2
        )  # one key, two option sets: every call as it came


def _flat(results, prefix=()):
    for key, value in results.items():
        if isinstance(value, dict):
            yield from _flat(value, (*prefix, key))
        else:  # a Stats object (what MetricsLogger.reduce returns) or a plain value
            yield (*prefix, key), value.peek() if hasattr(value, "peek") else value


def _same(a, b) -> None:
    a, b = dict(_flat(a)), dict(_flat(b))
    assert sorted(a, key=str) == sorted(b, key=str)
    for key, value in a.items():
        if "throughput" in str(key):
            continue  # a rate over wall time
        other = b[key]
        if isinstance(value, str):
            assert value == other, key
        else:
            assert float(value) == pytest.approx(float(other), rel=1e-6, nan_ok=True), key


def test_handover_reduces_to_the_same_results_as_direct_logging():
    direct, via = MetricsLogger(root=True), MetricsLogger(root=True)
    _calls(direct)
    deferred = DeferredMetrics(via)
    _calls(deferred)
    deferred.flush()
    _same(direct.reduce(), via.reduce())
    # A second round on the same loggers (stats that persist across reduces: lifetime, EMA).
    _calls(direct)
    with_context = type("L", (), {"metrics": via})()
    with deferred_metrics(with_context):
        _calls(with_context.metrics)
    assert with_context.metrics is via
    _same(direct.reduce(), via.reduce())


def test_stats_the_logger_already_keeps_decide_not_the_calls_options():
    direct, via = MetricsLogger(root=True), MetricsLogger(root=True)
    for logger in (direct, via):
        logger.log_value("pre", 1.0, reduce="sum")  # kept as a sum before the update
    deferred = DeferredMetrics(via)
    for x in (2.0, 3.0, 4.0):
        direct.log_value("pre", x, window=1)  # RLlib keeps summing: its stats exist
        deferred.log_value("pre", x, window=1)
    deferred.flush()
    assert direct.peek("pre") == via.peek("pre") == 10.0


def test_reading_the_logger_hands_recorded_values_over_first():
    logger = MetricsLogger(root=True)
    deferred = DeferredMetrics(logger)
    deferred.log_value("k", 1.0, reduce="sum")
    deferred.log_value("k", 2.0, reduce="sum")
    assert "k" in deferred  # `in` reads the logger: the values are there
    assert deferred.peek("k") == 3.0
    deferred.log_value("k", 4.0, reduce="sum")
    assert deferred.reduce()["k"] == 7.0


def test_values_reach_the_logger_when_the_update_raises():
    holder = type("L", (), {"metrics": MetricsLogger(root=True)})()
    logger = holder.metrics
    with pytest.raises(RuntimeError), deferred_metrics(holder):
        holder.metrics.log_value("k", 5, reduce="sum")
        raise RuntimeError("boom")
    assert holder.metrics is logger and logger.peek("k") == 5
