"""Learner timers and the PyTorch profiler: ``Profiling<Base>``, a subclass of the config's learner.

Phases of one ``Learner.update`` (seconds summed over its minibatches), logged as
``__all_modules__/profile/<phase>_s`` (``reduce="sum"``) into the Learner's ``MetricsLogger``:
``update`` (``before_gradient_based_update`` to ``after_gradient_based_update``), ``connector``
(to the first minibatch: learner connector, GAE included, batch to tensors), ``forward``
(``_uncompiled_update`` start to ``compute_losses``), ``loss``, ``backward``
(``compute_gradients``: autograd and the DDP all-reduce it waits for) and ``optimizer``
(``postprocess_gradients`` + ``apply_gradients``), plus ``grad_comm``: the time with at least one
gradient bucket in flight, from the per-bucket records rllib_ext's compression hooks give their
observers. DDP's built-in all-reduce is left as it is (its time stays in ``backward``).
"""

from __future__ import annotations

import gzip
import os
import tempfile
import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from rllib_ext.profiling.env_runner import PROFILE_KEY

__all__ = ["LearnerTimers", "interval_union", "profiling_learner_cls"]


class LearnerTimers(TorchLearner):
    """Times the phases of ``update()`` and traces one update on request; combine with a
    Learner class through :func:`profiling_learner_cls`."""

    @override(Learner)
    def build(self) -> None:
        super().build()
        self.phase_seconds: dict[str, float] = defaultdict(float)
        self.update_started: float | None = None
        self.forward_started: float | None = None
        self.first_minibatch = False
        self.trace_armed = False
        self.profiler: torch.profiler.profile | None = None
        self.trace: dict[str, Any] | None = None
        # rllib_ext's compression hooks report every bucket to their public observers.
        self.comm_intervals: list[tuple[float, float]] = []
        for state in getattr(getattr(self, "comm", None), "states", {}).values():
            state.add_observer(self.on_bucket)

    def on_bucket(self, record: Any) -> None:
        """Observer of the comm hooks (backend thread; ``list.append`` is atomic)."""
        self.comm_intervals.append((record.start_s, record.start_s + record.comm_s))

    def lap(self, phase: str, start: float) -> float:
        """Adds the time since ``start`` to ``phase``; returns now."""
        now = time.perf_counter()
        self.phase_seconds[phase] += now - start
        return now

    @override(Learner)
    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        if self.trace_armed:
            self.trace_armed = False
            self.profiler = _start_profiler()
        self.phase_seconds.clear()
        self.update_started = time.perf_counter()
        self.first_minibatch = True
        super().before_gradient_based_update(timesteps=timesteps)

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> Any:
        now = time.perf_counter()
        if self.first_minibatch and self.update_started is not None:
            self.first_minibatch = False
            now = self.lap("connector", self.update_started)
        self.forward_started = now
        return super()._uncompiled_update(batch, **kwargs)

    @override(Learner)
    def compute_losses(self, *, fwd_out: dict[str, Any], batch: dict[str, Any]) -> Any:
        start = time.perf_counter()
        if self.forward_started is not None:
            start = self.lap("forward", self.forward_started)
            self.forward_started = None
        try:
            return super().compute_losses(fwd_out=fwd_out, batch=batch)
        finally:
            self.lap("loss", start)

    @override(TorchLearner)
    def compute_gradients(self, loss_per_module: dict[str, Any], **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().compute_gradients(loss_per_module, **kwargs)
        finally:
            self.lap("backward", start)

    @override(Learner)
    def postprocess_gradients(self, gradients_dict: dict[str, Any]) -> Any:
        start = time.perf_counter()
        try:
            return super().postprocess_gradients(gradients_dict)
        finally:
            self.lap("optimizer", start)

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict[str, Any]) -> None:
        start = time.perf_counter()
        try:
            super().apply_gradients(gradients_dict)
        finally:
            self.lap("optimizer", start)

    @override(Learner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        if self.update_started is not None:
            self.lap("update", self.update_started)
            self.update_started = None
        if self.comm_intervals:
            self.phase_seconds["grad_comm"] = interval_union(self.comm_intervals)
            self.comm_intervals.clear()
        for phase, seconds in self.phase_seconds.items():
            self.metrics.log_value((ALL_MODULES, PROFILE_KEY, f"{phase}_s"), seconds, reduce="sum")
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()
            self.trace = _export(profiler)

    def arm_trace(self) -> bool:
        """Traces the next update with the PyTorch profiler (rank 0 only); for ``foreach_learner``."""
        self.trace_armed = not (dist.is_available() and dist.is_initialized() and dist.get_rank())
        return self.trace_armed

    def pop_trace(self) -> dict[str, Any] | None:
        """The last trace (see :func:`_export`) or ``None``; for ``foreach_learner``."""
        trace, self.trace = self.trace, None
        return trace


def interval_union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping ``(start, end)`` intervals."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total


def _start_profiler() -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities, record_shapes=True, profile_memory=True, with_stack=False
    )
    profiler.start()
    return profiler


def _export(profiler: torch.profiler.profile, *, rows: int = 25) -> dict[str, Any]:
    """Gzipped Chrome trace, the top ``rows`` operators by self CPU time and the profiler's table."""
    averages = profiler.key_averages()
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    top_ops = [
        {"name": e.key, "calls": int(e.count), "self_cpu_ms": e.self_cpu_time_total / 1e3}
        | {"cpu_ms": e.cpu_time_total / 1e3, "self_device_ms": e.self_device_time_total / 1e3}
        for e in top
    ]
    with tempfile.TemporaryDirectory(prefix="rllib_ext_trace_") as tmp:
        path = os.path.join(tmp, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path, "rb") as f:
            trace = gzip.compress(f.read(), compresslevel=6)
    sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return {
        "trace": trace,
        "top_ops": top_ops,
        "table": averages.table(sort_by=sort_by, row_limit=rows),
    }


def profiling_learner_cls(base: type) -> type:
    """``Profiling<base>``: ``base`` (a ``TorchLearner`` class) with :class:`LearnerTimers`."""
    if issubclass(base, LearnerTimers):
        return base
    if not issubclass(base, TorchLearner):
        raise TypeError(
            f"profiling needs a TorchLearner subclass as learner_class, got {base.__name__}. "
            "Fix: .framework('torch') and a torch learner (e.g. rllib_ext.PPOExtTorchLearner)."
        )
    attrs = {"__module__": __name__, "profiled_class": base}
    return type(f"Profiling{base.__name__}", (LearnerTimers, base), attrs)
