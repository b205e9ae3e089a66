"""Learner-side phase timers and the PyTorch profiler, installed on any ``TorchLearner``.

The functions here run inside each Learner (through ``LearnerGroup.foreach_learner``, so also
in remote Learner actors) and work on RLlib's stock ``PPOTorchLearner`` as well as on
``PPOExtTorchLearner``. Phases, per learner and per update (seconds):

* ``update``: the whole ``Learner.update`` call;
* ``connector`` / ``gae``: the learner connector pipeline, and its GAE piece (RLlib's
  ``GeneralAdvantageEstimation`` or rllib_ext's ``VectorizedGAE``);
* ``forward``: ``module.forward_train``; ``loss``: ``compute_losses``;
* ``backward``: ``compute_gradients`` (zero_grad, loss scaling, autograd, DDP's all-reduce);
* ``optimizer``: ``postprocess_gradients`` + ``apply_gradients`` (clipping, step);
* ``comm_s``: wall time during which at least one gradient bucket's collective was in flight
  (a subset of ``backward``; overlap with backward compute counts as communication).

Gradient communication is timed by the DDP comm hook: rllib_ext's compression hooks already
record each bucket's collective time; a DDP module without a hook gets a timing copy of
PyTorch's ``allreduce_hook`` (divide by world size, then sum: what DDP's built-in reduction
does, so the gradients are unchanged).
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
import tempfile
import time
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from rllib_ext.profiling._clock import PhaseClock, TimedCallable, wrap_method

__all__ = [
    "GAE_CONNECTORS",
    "collect_learner_phases",
    "install_learner_timers",
    "start_learner_trace",
    "stop_learner_trace",
]

logger = logging.getLogger(__name__)

_ATTR = "_rllib_ext_profiling"
GAE_CONNECTORS: tuple[str, ...] = ("GeneralAdvantageEstimation", "VectorizedGAE")
"""Class names of the learner connector pieces reported as ``gae``."""


class _LearnerInstrument:
    def __init__(self) -> None:
        self.clock = PhaseClock()
        self.profiler: torch.profiler.profile | None = None
        self.hooked_modules: list[str] = []


class _TimedAllReduce:
    """Picklable comm-hook state: the process group and the clock to record into."""

    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock
        self.process_group = None


# No annotations: DDP compares a hook's annotations with the real classes, and this module's
# postponed (string) annotations would fail that check.
def timed_allreduce_hook(state, bucket):  # noqa: ANN001, ANN201
    """PyTorch's ``allreduce_hook`` plus the bucket's collective interval in ``state.clock``.

    ``(state: _TimedAllReduce, bucket: dist.GradBucket) -> Future[Tensor]``.
    """
    start = time.perf_counter()
    future = default_hooks.allreduce_hook(state.process_group, bucket)

    def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.clock.add_interval(start, time.perf_counter())
        return fut.value()

    return future.then(done)


def _instrument_comm(learner: Any, clock: PhaseClock) -> list[str]:
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchDDPRLModule

    from rllib_ext.distributed import CommHookState

    hooked = []
    for mid, sub in getattr(learner.module, "_rl_modules", {}).items():
        if not isinstance(sub, TorchDDPRLModule):
            continue
        states = [state for _, state in getattr(sub, "_comm_hooks", [])]
        ours = [s for s in states if isinstance(s, CommHookState)]
        if ours:
            for state in ours:
                _wrap_record(state, clock)
        elif not states:
            sub.register_comm_hook(_TimedAllReduce(clock), timed_allreduce_hook)
        else:
            logger.warning("module %r has a foreign comm hook: its communication is not timed", mid)
            continue
        hooked.append(mid)
    return hooked


def _wrap_record(state: Any, clock: PhaseClock) -> None:
    original = state._record
    if getattr(original, "_rllib_ext_timed", False):
        return

    @functools.wraps(original)
    def record(*, comm_time_s: float, **kwargs: Any) -> None:
        end = time.perf_counter()
        clock.add_interval(end - comm_time_s, end)
        original(comm_time_s=comm_time_s, **kwargs)

    record._rllib_ext_timed = True  # type: ignore[attr-defined]
    state._record = record


def install_learner_timers(learner: Any) -> dict[str, Any]:
    """Installs the phase timers on ``learner`` (idempotent). Run it through ``foreach_learner``.

    Returns:
        ``{"learner_index", "gae_connector", "comm_modules"}``: what was instrumented.
    """
    instrument = getattr(learner, _ATTR, None)
    if instrument is None:
        instrument = _LearnerInstrument()
        clock = instrument.clock
        wrap_method(learner, "update", clock, "update")
        wrap_method(learner.module, "forward_train", clock, "forward")
        wrap_method(learner, "compute_losses", clock, "loss")
        wrap_method(learner, "compute_gradients", clock, "backward")
        wrap_method(learner, "postprocess_gradients", clock, "optimizer")
        wrap_method(learner, "apply_gradients", clock, "optimizer")
        pipeline = learner._learner_connector
        if pipeline is not None:
            for i, piece in enumerate(pipeline.connectors):
                if type(piece).__name__ in GAE_CONNECTORS:
                    pipeline.connectors[i] = TimedCallable(piece, clock, "gae")
            learner._learner_connector = TimedCallable(pipeline, clock, "connector")
        instrument.hooked_modules = _instrument_comm(learner, clock)
        setattr(learner, _ATTR, instrument)
    pipeline = learner._learner_connector
    gae = [p.__class__.__name__ for p in getattr(pipeline, "connectors", [])]
    return {
        "learner_index": int(getattr(learner, "_learner_index", 0)),
        "gae_connector": next((n for n in gae if n in GAE_CONNECTORS), None),
        "comm_modules": list(instrument.hooked_modules),
    }


def collect_learner_phases(learner: Any) -> dict[str, Any]:
    """This learner's phase seconds since the last call (see the module docstring); resets."""
    instrument: _LearnerInstrument = getattr(learner, _ATTR)
    return instrument.clock.pop()


def start_learner_trace(learner: Any, *, learner_index: int = 0) -> bool:
    """Starts the PyTorch profiler (CPU, CUDA when present, shapes, memory) on one learner."""
    if int(getattr(learner, "_learner_index", 0)) != learner_index:
        return False
    instrument: _LearnerInstrument = getattr(learner, _ATTR)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    instrument.profiler = torch.profiler.profile(
        activities=activities, record_shapes=True, profile_memory=True, with_stack=False
    )
    instrument.profiler.__enter__()
    return True


def stop_learner_trace(learner: Any, *, row_limit: int = 25) -> dict[str, Any] | None:
    """Stops the profiler started by :func:`start_learner_trace`.

    Returns:
        ``None`` on learners that were not traced, else ``{"trace": gzip of the Chrome-trace JSON,
        "top_ops": [{"name", "calls", "self_cpu_ms", "cpu_ms", "self_device_ms"}...],
        "table": the profiler's own table}`` (top ``row_limit`` operators by self CPU time).
    """
    instrument: _LearnerInstrument | None = getattr(learner, _ATTR, None)
    if instrument is None or instrument.profiler is None:
        return None
    profiler, instrument.profiler = instrument.profiler, None
    profiler.__exit__(None, None, None)
    averages = profiler.key_averages()
    sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    rows = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:row_limit]
    top_ops = [
        {
            "name": e.key,
            "calls": int(e.count),
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "cpu_ms": e.cpu_time_total / 1e3,
            "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3,
        }
        for e in rows
    ]
    handle, path = tempfile.mkstemp(suffix=".json", prefix="rllib_ext_trace_")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        with open(path, "rb") as f:
            trace = gzip.compress(f.read(), compresslevel=6)
    finally:
        os.unlink(path)
    return {
        "trace": trace,
        "top_ops": top_ops,
        "table": averages.table(sort_by=sort_by, row_limit=row_limit),
    }
