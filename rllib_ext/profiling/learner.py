"""The Learner's timer (:class:`UpdateTimer`, held by ``Profiling<Base>``) and the PyTorch trace.

One ``Learner.update`` logs ``__all_modules__/rllib_ext/profile/<phase>_s`` (summed over its minibatches)
for ``update``, ``connector``, ``forward``, ``loss``, ``backward``, ``optimizer`` and
``grad_comm``: the time with a gradient bucket in flight, from the records rllib_ext's
compression hooks give their public observers (see :data:`~rllib_ext.profiling.breakdown.SOURCES`).
DDP's own all-reduce is left as it is: without compression it stays in ``backward``.

As for env runners (:mod:`rllib_ext.profiling.env_runner`), :func:`profiled_learner_class` gives
``Profiling<Base>``, one subclass of the config's learner class (single inheritance), whose
update steps hand to its :class:`UpdateTimer`: RLlib offers no hook around a learner's phases.
"""

from __future__ import annotations

import functools
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

from rllib_ext.profiling.env_runner import (
    PhaseClock,
    check_profiled_base,
    name_profiled,
    profiled,
)

__all__ = ["UpdateTimer", "interval_union", "profiled_learner_class"]


class UpdateTimer:
    """Times the phases of one learner's ``update()`` (its :attr:`clock`) and traces one update
    on request; built once the learner is built (its compression hooks exist)."""

    def __init__(self, learner: Learner) -> None:
        self.clock = PhaseClock()
        self.comm_intervals: list[tuple[float, float]] = []
        self.trace_armed = False
        self.profiler: profile | None = None
        self.trace: dict[str, Any] | None = None
        # Observers run on the backend's thread (list.append is atomic).
        for state in getattr(getattr(learner, "comm", None), "states", {}).values():
            state.add_observer(
                lambda r: self.comm_intervals.append((r.start_s, r.start_s + r.comm_s))
            )

    def start(self) -> None:
        """An update begins (its connector pass first); the armed trace starts."""
        if self.trace_armed:
            self.trace_armed = False
            cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
            self.profiler = profile(
                activities=[ProfilerActivity.CPU, *cuda], record_shapes=True, profile_memory=True
            )
            self.profiler.start()
        self.clock.open("update")
        self.clock.open("connector")

    def finish(self, metrics: Any) -> None:
        """The update ended: logs its phases into ``metrics`` and keeps the trace."""
        self.clock.close("update")
        if self.comm_intervals:
            self.clock.seconds["grad_comm"] = interval_union(self.comm_intervals)
            self.comm_intervals.clear()
        self.clock.log(metrics, ALL_MODULES)
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()
            self.trace = _export(profiler)

    def arm_trace(self) -> bool:
        """Traces the next update with the PyTorch profiler (rank 0 only)."""
        self.trace_armed = not (dist.is_available() and dist.is_initialized() and dist.get_rank())
        return self.trace_armed

    def pop_trace(self) -> dict[str, Any] | None:
        """The last trace (see :func:`_export`) or ``None``."""
        trace, self.trace = self.trace, None
        return trace


@functools.cache
def profiled_learner_class(base: type) -> type:
    """``Profiling<base>``: ``base`` whose update phases hand to an :class:`UpdateTimer`
    (``base`` itself if it is one already); one class per base (cached).

    Raises:
        TypeError: ``base`` is no ``TorchLearner``, naming the fix.
    """
    if profiled(base):
        return base
    check_profiled_base(
        base,
        TorchLearner,
        ".framework('torch') with a torch learner (e.g. rllib_ext.PPOExtTorchLearner).",
    )

    class Profiled(base):
        profiled_class = base
        """The class being timed (what reports name)."""
        update_timer: UpdateTimer

        @override(Learner)
        def build(self) -> None:
            super().build()
            self.update_timer = UpdateTimer(self)

        @override(Learner)
        def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
            self.update_timer.start()
            super().before_gradient_based_update(timesteps=timesteps)

        @override(TorchLearner)
        def _uncompiled_update(self, batch: dict, **kwargs: Any) -> Any:
            self.update_timer.clock.close("connector")  # open only before the first minibatch
            self.update_timer.clock.open("forward")
            return super()._uncompiled_update(batch, **kwargs)

        @override(Learner)
        def compute_losses(self, *, fwd_out: dict[str, Any], batch: dict[str, Any]) -> Any:
            self.update_timer.clock.close("forward")
            with self.update_timer.clock.time("loss"):
                return super().compute_losses(fwd_out=fwd_out, batch=batch)

        @override(TorchLearner)
        def compute_gradients(self, loss_per_module: dict[str, Any], **kwargs: Any) -> Any:
            with self.update_timer.clock.time("backward"):
                return super().compute_gradients(loss_per_module, **kwargs)

        @override(Learner)
        def postprocess_gradients(self, gradients_dict: dict[str, Any]) -> Any:
            with self.update_timer.clock.time("optimizer"):
                return super().postprocess_gradients(gradients_dict)

        @override(TorchLearner)
        def apply_gradients(self, gradients_dict: dict[str, Any]) -> None:
            with self.update_timer.clock.time("optimizer"):
                super().apply_gradients(gradients_dict)

        @override(Learner)
        def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
            super().after_gradient_based_update(timesteps=timesteps)
            self.update_timer.finish(self.metrics)

        def arm_trace(self) -> bool:
            """:meth:`UpdateTimer.arm_trace`, for ``foreach_learner``."""
            return self.update_timer.arm_trace()

        def pop_trace(self) -> dict[str, Any] | None:
            """:meth:`UpdateTimer.pop_trace`, for ``foreach_learner``."""
            return self.update_timer.pop_trace()

    return name_profiled(Profiled, base, __name__)


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
