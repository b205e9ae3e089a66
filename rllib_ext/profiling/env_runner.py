"""The phase clock and the env runner's timer (:class:`SampleTimer`, held by ``Profiling<Base>``).

One ``sample()`` call logs ``rllib_ext/profile/<phase>_s`` (``reduce="sum"``: the result holds
``env_runners/rllib_ext/profile/<phase>_s`` summed over EnvRunners) for ``sample`` (the whole call),
``env_step``, ``connectors`` and ``inference`` (see :data:`~rllib_ext.profiling.breakdown.SOURCES`).

Profiling applies to any runner class (a user's, RLlib's recording runner, ours), so it is no
setting a runner reads: :func:`profiled_env_runner_class` gives ``Profiling<Base>``, one subclass
of ``Base`` (single inheritance, one per base), whose ``__init__`` builds a :class:`SampleTimer`
and whose ``sample()`` / ``_try_env_step`` hand to it. Installing the timer on an instance is not
possible without patching methods: RLlib builds the runner inside its actor from the class in the
config and has no callback around ``sample()`` or one env step.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private

__all__ = ["PROFILE_KEY", "PhaseClock", "PipelineMark", "SampleTimer", "profiled"]
__all__ += ["profiled_env_runner_class"]

PROFILE_KEY = "rllib_ext/profile"
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
        """Logs ``(*key, PROFILE_KEY, "<phase>_s")`` into a ``MetricsLogger`` and starts over."""
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


class SampleTimer:
    """Times the phases of one env runner's ``sample()`` (see the module docstring): marks in
    both connector pipelines (RLlib built them in ``__init__``; the forward runs between) and
    the env steps."""

    def __init__(self, runner: EnvRunner) -> None:
        self.runner = runner
        self.clock = clock = PhaseClock()
        env_to_module = private.env_to_module(runner)
        module_to_env = private.module_to_env(runner)
        env_to_module.prepend(PipelineMark(clock=clock, spans=("", "connectors")))
        env_to_module.append(PipelineMark(clock=clock, spans=("connectors", "inference")))
        module_to_env.prepend(PipelineMark(clock=clock, spans=("inference", "connectors")))
        module_to_env.append(PipelineMark(clock=clock, spans=("connectors", "")))

    def sample(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)`` (the runner's ``sample()``), timed and logged."""
        self.clock.seconds.clear()
        # The first forward of this call uses the env-to-module output cached by the last one.
        self.clock.open("inference")
        with self.clock.time("sample"):
            episodes = call(*args, **kwargs)
        self.clock.log(self.runner.metrics)
        return episodes

    def env_step(self, call: Callable[[Any], Any], actions: Any) -> Any:
        """``call(actions)`` (the runner's ``_try_env_step``), timed."""
        self.clock.opened.pop("inference", None)  # no forward this step (envs resetting)
        with self.clock.time("env_step"):
            return call(actions)


def profiled(cls: type) -> bool:
    """Whether ``cls`` is a ``Profiling<Base>`` class built here (not a subclass of one)."""
    return "profiled_class" in vars(cls)


def check_profiled_base(base: type, needed: type, fix: str) -> None:
    """Raises ``TypeError`` naming ``fix`` unless ``base`` is a class deriving from ``needed``."""
    if not (isinstance(base, type) and issubclass(base, needed)):
        name = getattr(base, "__name__", repr(base))
        raise TypeError(f"profiling needs a {needed.__name__} subclass, got {name}. Fix: {fix}")


def name_profiled(cls: type, base: type, module: str) -> type:
    """``cls`` named ``Profiling<base>`` in ``module``."""
    cls.__name__ = cls.__qualname__ = f"Profiling{base.__name__}"
    cls.__module__ = module
    return cls


@functools.cache
def profiled_env_runner_class(base: type, *, rllib_choice: bool = False) -> type:
    """``Profiling<base>``: ``base`` whose ``sample()`` and env steps hand to a
    :class:`SampleTimer` (``base`` itself if it is one already). One class per arguments
    (cached), so re-applying a config's rules keeps its class.

    Args:
        rllib_choice: ``base`` is the class RLlib picked (``env_runner_cls`` was ``None``), not
            one the user chose; the runner table (:mod:`rllib_ext.runner_table`) reads it.

    Raises:
        TypeError: ``base`` is no ``EnvRunner``, naming the fix.
    """
    if profiled(base):
        return base
    check_profiled_base(base, EnvRunner, "pass an RLlib EnvRunner subclass as env_runner_cls.")

    class Profiled(base):
        profiled_class = base
        """The class being timed (what reports name)."""
        profiled_rllib_choice = rllib_choice
        """``base`` is RLlib's own choice, not the user's (see ``rllib_choice``)."""
        sample_timer: SampleTimer

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.sample_timer = SampleTimer(self)

        @property
        def sample_clock(self) -> PhaseClock:
            """The clock fused loops report to (:func:`rllib_ext.sampling_protocol.sample_phase`)."""
            return self.sample_timer.clock

        @override(EnvRunner)
        def sample(self, *args: Any, **kwargs: Any) -> Any:
            return self.sample_timer.sample(super().sample, *args, **kwargs)

        @override(EnvRunner)
        def _try_env_step(self, actions: Any) -> Any:
            return self.sample_timer.env_step(super()._try_env_step, actions)

    return name_profiled(Profiled, base, __name__)
