"""The Learner timers (``Profiling<Base>``, a subclass of the config's) and the PyTorch trace.

One ``Learner.update`` logs ``__all_modules__/profile/<phase>_s`` (summed over its minibatches)
for ``update``, ``connector``, ``forward``, ``loss``, ``backward``, ``optimizer`` and
``grad_comm``: the time with a gradient bucket in flight, from the records rllib_ext's
compression hooks give their public observers (see :data:`~rllib_ext.profiling.breakdown.SOURCES`).
DDP's own all-reduce is left as it is: without compression it stays in ``backward``.
"""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from torch.profiler import ProfilerActivity, profile

from rllib_ext.profiling.env_runner import PhaseClock

__all__ = ["LearnerTimers", "interval_union"]


class LearnerTimers(TorchLearner):
    """Times the phases of ``update()`` and traces one update on request; combined with a
    ``TorchLearner`` class by :func:`~rllib_ext.profiling.env_runner.timed_subclass`."""

    @override(Learner)
    def build(self) -> None:
        super().build()
        self.phase_clock = PhaseClock()
        self.comm_intervals: list[tuple[float, float]] = []
        self.trace_armed = False
        self.profiler: profile | None = None
        self.trace: dict[str, Any] | None = None
        # Observers run on the backend's thread (list.append is atomic).
        for state in getattr(getattr(self, "comm", None), "states", {}).values():
            state.add_observer(
                lambda r: self.comm_intervals.append((r.start_s, r.start_s + r.comm_s))
            )

    @override(Learner)
    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        if self.trace_armed:
            self.trace_armed = False
            cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
            self.profiler = profile(
                activities=[ProfilerActivity.CPU, *cuda], record_shapes=True, profile_memory=True
            )
            self.profiler.start()
        self.phase_clock.open("update")
        self.phase_clock.open("connector")
        super().before_gradient_based_update(timesteps=timesteps)

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> Any:
        self.phase_clock.close("connector")  # open only before the first minibatch
        self.phase_clock.open("forward")
        return super()._uncompiled_update(batch, **kwargs)

    @override(Learner)
    def compute_losses(self, *, fwd_out: dict[str, Any], batch: dict[str, Any]) -> Any:
        self.phase_clock.close("forward")
        with self.phase_clock.time("loss"):
            return super().compute_losses(fwd_out=fwd_out, batch=batch)

    @override(TorchLearner)
    def compute_gradients(self, loss_per_module: dict[str, Any], **kwargs: Any) -> Any:
        with self.phase_clock.time("backward"):
            return super().compute_gradients(loss_per_module, **kwargs)

    @override(Learner)
    def postprocess_gradients(self, gradients_dict: dict[str, Any]) -> Any:
        with self.phase_clock.time("optimizer"):
            return super().postprocess_gradients(gradients_dict)

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict[str, Any]) -> None:
        with self.phase_clock.time("optimizer"):
            super().apply_gradients(gradients_dict)

    @override(Learner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self.phase_clock.close("update")
        if self.comm_intervals:
            self.phase_clock.seconds["grad_comm"] = interval_union(self.comm_intervals)
            self.comm_intervals.clear()
        self.phase_clock.log(self.metrics, ALL_MODULES)
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


def _export(profiler: profile, *, rows: int = 25) -> dict[str, Any]:
    """The gzipped Chrome trace and the profiler's table of the top ``rows`` operators."""
    with tempfile.TemporaryDirectory(prefix="rllib_ext_trace_") as tmp:
        profiler.export_chrome_trace(str(Path(tmp) / "trace.json"))
        trace = gzip.compress((Path(tmp) / "trace.json").read_bytes(), compresslevel=6)
    sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return {"trace": trace, "table": profiler.key_averages().table(sort_by=sort_by, row_limit=rows)}
