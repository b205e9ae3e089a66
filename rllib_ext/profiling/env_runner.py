"""EnvRunner timers: ``Profiling<Base>``, a subclass of the EnvRunner class the config uses.

Phases of one ``sample()`` call (seconds summed over its steps), logged as ``profile/<phase>_s``
(``reduce="sum"``) into the EnvRunner's ``MetricsLogger``, so the result holds
``env_runners/profile/<phase>_s`` summed over EnvRunners (RLlib's own timers are per-call EMAs):
``sample`` (the whole call), ``env_step`` (``_try_env_step``: the vector env's ``step``),
``connectors`` (env-to-module and module-to-env, first to last piece: :class:`PipelineMark` pieces
at both ends take the timestamps) and ``inference`` (end of env-to-module, or the start of
``sample()``, to the start of module-to-env: the RLModule forward, plus RLlib's numpy conversion
of the episodes that ended in that step, which runs in between).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override

__all__ = [
    "PROFILE_KEY",
    "EnvRunnerTimers",
    "PipelineMark",
    "profiling_env_runner_cls",
    "sample_phase",
]

PROFILE_KEY = "profile"
"""Metrics key under which EnvRunners and Learners log their phase seconds."""


class SampleClock:
    """Phase seconds of one ``sample()`` call, from spans opened and closed by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.opened: dict[str, float] = {}

    def open(self, span: str) -> None:
        self.opened[span] = time.perf_counter()

    def close(self, span: str, phase: str) -> None:
        start = self.opened.pop(span, None)
        if start is not None:
            self.seconds[phase] += time.perf_counter() - start

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def mark(self, pipeline: str, end: bool) -> None:
        """A :class:`PipelineMark` ran at the start or the end of ``pipeline``."""
        if pipeline == "env_to_module" and end:
            self.close(pipeline, "connectors")
            self.open("inference")
        elif pipeline == "module_to_env" and not end:
            self.close("inference", "inference")
            self.open(pipeline)
        elif end:
            self.close(pipeline, "connectors")
        else:
            self.open(pipeline)


class PipelineMark(ConnectorV2):
    """Connector piece that passes the batch through and tells the clock it ran."""

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        clock: SampleClock | None = None,
        pipeline: str = "",
        end: bool = False,
    ) -> None:
        # Not passed on: the checkpointed constructor kwargs stay empty (a restored mark is inert).
        super().__init__(input_observation_space, input_action_space)
        self.clock, self.pipeline, self.end = clock, pipeline, end

    @override(ConnectorV2)
    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> Any:
        if self.clock is not None:
            self.clock.mark(self.pipeline, self.end)
        return batch


class PipelineStart(PipelineMark):
    """First piece of a pipeline (own class: pipelines name their pieces' state by class)."""


class PipelineEnd(PipelineMark):
    """Last piece of a pipeline."""


class EnvRunnerTimers(EnvRunner):
    """Times the phases of ``sample()``; combine with an EnvRunner class through
    :func:`profiling_env_runner_cls`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sample_clock = SampleClock()
        # RLlib builds both pipelines in __init__; the marks go at their ends.
        for name, pipeline in (
            ("env_to_module", self._env_to_module),
            ("module_to_env", self._module_to_env),
        ):
            pipeline.prepend(PipelineStart(clock=self.sample_clock, pipeline=name))
            pipeline.append(PipelineEnd(clock=self.sample_clock, pipeline=name, end=True))

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        clock = self.sample_clock
        clock.seconds.clear()
        # The first forward of this call uses the env-to-module output cached by the last one.
        clock.open("inference")
        start = time.perf_counter()
        episodes = super().sample(*args, **kwargs)
        clock.seconds["sample"] = time.perf_counter() - start
        for phase, seconds in clock.seconds.items():
            self.metrics.log_value((PROFILE_KEY, f"{phase}_s"), seconds, reduce="sum")
        return episodes

    @override(EnvRunner)
    def _try_env_step(self, actions: Any) -> Any:
        clock = self.sample_clock
        clock.opened.pop("inference", None)  # no forward this step (e.g. all envs resetting)
        with clock.time("env_step"):
            return super()._try_env_step(actions)


def sample_phase(env_runner: Any, phase: str) -> AbstractContextManager[Any]:
    """``with sample_phase(self, "env_step"): ...`` in an EnvRunner's own sampling loop (one that
    bypasses RLlib's, e.g. fused SMAX sampling): the block counts as ``phase`` when the runner is
    profiled; otherwise nothing happens."""
    clock = getattr(env_runner, "sample_clock", None)
    return clock.time(phase) if isinstance(clock, SampleClock) else nullcontext()


def profiling_env_runner_cls(base: type) -> type:
    """``Profiling<base>``: ``base`` (an EnvRunner class) with :class:`EnvRunnerTimers`."""
    if issubclass(base, EnvRunnerTimers):
        return base
    attrs = {"__module__": __name__, "profiled_class": base}
    return type(f"Profiling{base.__name__}", (EnvRunnerTimers, base), attrs)
