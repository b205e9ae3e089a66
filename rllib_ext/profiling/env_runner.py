"""The phase clock and the EnvRunner timers (``Profiling<Base>``, a subclass of the config's).

One ``sample()`` call logs ``profile/<phase>_s`` (``reduce="sum"``: the result holds
``env_runners/profile/<phase>_s`` summed over EnvRunners) for ``sample`` (the whole call),
``env_step``, ``connectors`` and ``inference`` (see :data:`~rllib_ext.profiling.breakdown.SOURCES`).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private

__all__ = ["PROFILE_KEY", "EnvRunnerTimers", "PhaseClock", "PipelineMark"]
__all__ += ["timed_subclass"]

PROFILE_KEY = "profile"
"""Metrics key under which EnvRunners and Learners log their phase seconds."""


class PhaseClock:
    """Seconds per phase, from timed blocks and from spans opened and closed by phase name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.opened: dict[str, float] = {}

    def open(self, phase: str) -> None:
        if phase:
            self.opened[phase] = time.perf_counter()

    def close(self, phase: str) -> None:
        """Adds the time since ``open(phase)``; nothing if that span is not open."""
        if phase in self.opened:
            self.seconds[phase] += time.perf_counter() - self.opened.pop(phase)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def log(self, metrics: Any, *key: str) -> None:
        """Logs ``(*key, "profile", "<phase>_s")`` into a ``MetricsLogger`` and starts over."""
        for phase, seconds in self.seconds.items():
            metrics.log_value((*key, PROFILE_KEY, f"{phase}_s"), seconds, reduce="sum")
        self.seconds.clear()
        self.opened.clear()


class PipelineMark(ConnectorV2):
    """Connector piece that passes the batch through, closing one span and opening another."""

    rllib_ext_fused_equivalent = True  # sampling_protocol.FUSED_EQUIVALENT: only passes data

    def __init__(
        self, *args: Any, clock: PhaseClock | None = None, spans: tuple[str, str] = ("", "")
    ) -> None:
        super().__init__(*args)
        self.clock, (self.closes, self.opens) = clock, spans

    @override(ConnectorV2)
    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> Any:
        if self.clock is not None:
            self.clock.close(self.closes)
            self.clock.open(self.opens)
        return batch


class EnvRunnerTimers(EnvRunner):
    """Times the phases of ``sample()``; combined with an EnvRunner by :func:`timed_subclass`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sample_clock = clock = PhaseClock()
        # Spans (closed, opened): RLlib built both pipelines in __init__; the forward runs between.
        env_to_module = private.env_to_module(self)
        module_to_env = private.module_to_env(self)
        env_to_module.prepend(PipelineMark(clock=clock, spans=("", "connectors")))
        env_to_module.append(PipelineMark(clock=clock, spans=("connectors", "inference")))
        module_to_env.prepend(PipelineMark(clock=clock, spans=("inference", "connectors")))
        module_to_env.append(PipelineMark(clock=clock, spans=("connectors", "")))

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self.sample_clock.seconds.clear()
        # The first forward of this call uses the env-to-module output cached by the last one.
        self.sample_clock.open("inference")
        with self.sample_clock.time("sample"):
            episodes = super().sample(*args, **kwargs)
        self.sample_clock.log(self.metrics)
        return episodes

    @override(EnvRunner)
    def _try_env_step(self, actions: Any) -> Any:
        self.sample_clock.opened.pop("inference", None)  # no forward this step (envs resetting)
        with self.sample_clock.time("env_step"):
            return super()._try_env_step(actions)


@functools.cache
def timed_subclass(timers: type, base: type, *, rllib_choice: bool = False) -> type:
    """``Profiling<base>``: ``base`` with the ``timers`` mixin in front (``base`` if it has it).

    One class per arguments (cached), so re-applying a config's rules keeps its class.

    Args:
        rllib_choice: ``base`` is the class RLlib picked (``env_runner_cls`` was ``None``), not
            one the user chose; the runner table (:mod:`rllib_ext.runner_table`) reads it.

    Raises:
        TypeError: ``base`` does not extend the class ``timers`` extends, naming the fix.
    """
    needed = timers.__mro__[1]
    if issubclass(base, timers):
        return base
    if not issubclass(base, needed):
        raise TypeError(
            f"profiling needs a {needed.__name__} subclass, got {base.__name__}. Fix: "
            ".framework('torch') with a torch learner (e.g. rllib_ext.PPOExtTorchLearner)."
        )

    class Profiling(timers, base):
        profiled_class = base
        """The class being timed (what reports name)."""
        profiled_rllib_choice = rllib_choice
        """``base`` is RLlib's own choice, not the user's (see ``rllib_choice``)."""

    Profiling.__name__ = Profiling.__qualname__ = f"Profiling{base.__name__}"
    Profiling.__module__ = timers.__module__
    return Profiling
