"""``ProfilerCallback``: the breakdown and the PyTorch trace from inside any RLlib run.

Usage (stock or rllib_ext config, also under Tune)::

    from rllib_ext.profiling import ProfilerCallback

    config.callbacks(ProfilerCallback.configure(out_dir="/tmp/prof", iterations=[3, 4, 5]))

Iterations are RLlib's 1-based ``training_iteration`` numbers. Each profiled iteration adds
``rllib_ext_profile/<phase>`` shares (and ``rllib_ext_profile/wall_s``) to its result; after the
last one, ``breakdown.json``, ``breakdown.txt``, ``top_ops.txt``/``top_ops.json`` and the trace
``trace/learner.pt.trace.json.gz`` (gzipped Chrome trace: ``tensorboard --logdir OUT/trace``
with the PyTorch profiler plugin, or open it in https://ui.perfetto.dev) are written to
``out_dir``. The trace covers the learner update of ``trace_iteration`` (default:
the iteration after the last profiled one, so the profiler's overhead does not distort the
breakdown).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rllib_ext.profiling import env_runner as er
from rllib_ext.profiling import learner as learner_side
from rllib_ext.profiling._clock import PhaseClock, wrap_method
from rllib_ext.profiling.breakdown import Breakdown, breakdown_of_iteration, merge_breakdowns

__all__ = ["TRACE_FILE", "IterationProfiler", "ProfilerCallback", "check_out_dir"]

logger = logging.getLogger(__name__)

RESULT_KEY = "rllib_ext_profile"
TRACE_FILE = "learner.pt.trace.json.gz"


def check_out_dir(out_dir: str | Path) -> Path:
    """Creates ``out_dir`` and checks it is writable.

    Raises:
        ValueError: the path is a file or cannot be created or written, naming the fix.
    """
    path = Path(out_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".rllib_ext_write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(
            f"profile output directory {str(out_dir)!r} is not writable ({exc.strerror or exc}). "
            "Fix: pass a directory you can write to, e.g. --out ./profile."
        ) from None
    return path.resolve()


def _values(results: Any) -> list[Any]:
    return [r.get() for r in results]


class IterationProfiler:
    """Driver-side timers plus learner-side timers for one ``Algorithm`` instance."""

    def __init__(
        self,
        algorithm: Any,
        *,
        iterations: Iterable[int],
        trace_iteration: int | None,
        out_dir: str | Path | None,
    ) -> None:
        self.algorithm = algorithm
        self.iterations = sorted(set(int(i) for i in iterations))
        self.trace_iteration = trace_iteration
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.clock = PhaseClock()
        self.parts: list[Breakdown] = []
        self.trace: dict[str, Any] | None = None
        self.learner_info: list[dict[str, Any]] = []
        self._step_started: float | None = None
        self._written = False
        self._install()

    # ------------------------------------------------------------------ installation

    def _current_iteration(self) -> int:
        return int(self.algorithm.iteration) + 1

    def _install(self) -> None:
        algo = self.algorithm
        original_step = algo.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            if self._current_iteration() in self.iterations:  # reset the remote timers
                _values(algo.learner_group.foreach_learner(learner_side.collect_learner_phases))
                self._foreach_env_runner(er.collect_env_runner_phases)
            self.clock.pop()
            self._step_started = time.perf_counter()
            return original_step(*args, **kwargs)

        object.__setattr__(algo, "training_step", training_step)
        group = algo.learner_group
        original_update = group.update

        def update(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            if self._step_started is not None:
                self.clock.add("sampling", start - self._step_started)
            tracing = self._current_iteration() == self.trace_iteration
            if tracing:
                _values(group.foreach_learner(learner_side.start_learner_trace))
            try:
                return original_update(*args, **kwargs)
            finally:
                self.clock.add("learner_update", time.perf_counter() - start)
                if tracing:
                    traces = _values(group.foreach_learner(learner_side.stop_learner_trace))
                    self.trace = next((t for t in traces if t is not None), None)

        object.__setattr__(group, "update", update)
        wrap_method(algo.env_runner_group, "sync_weights", self.clock, "weight_sync")
        self.learner_info = _values(group.foreach_learner(learner_side.install_learner_timers))
        self._foreach_env_runner(er.install_env_runner_timers)

    def _foreach_env_runner(self, func: Any) -> list[Any]:
        group = self.algorithm.env_runner_group
        return list(group.foreach_env_runner(func, local_env_runner=True))

    # ------------------------------------------------------------------ per iteration

    def on_result(self, result: dict[str, Any]) -> None:
        """Call with each iteration's result; adds the shares and writes files when done."""
        iteration = int(result.get("training_iteration", self.algorithm.iteration))
        if iteration in self.iterations:
            learners = _values(
                self.algorithm.learner_group.foreach_learner(learner_side.collect_learner_phases)
            )
            driver = self.clock.pop()["seconds"]
            part = breakdown_of_iteration(
                iteration=iteration,
                result=result,
                driver=driver,
                learners=learners,
                env_runners=[
                    r for r in self._foreach_env_runner(er.collect_env_runner_phases) if r
                ],
            )
            self.parts.append(part)
            result[RESULT_KEY] = {"wall_s": part.wall_s, **part.shares}
        if self.done and self.out_dir is not None and not self._written:
            self.write(self.out_dir)
            self._written = True

    @property
    def done(self) -> bool:
        parts_done = len(self.parts) == len(self.iterations)
        trace_done = self.trace_iteration is None or self.trace is not None
        return parts_done and trace_done

    def breakdown(self) -> Breakdown:
        merged = merge_breakdowns(self.parts)
        config = self.algorithm.config
        merged.details.update(
            {
                "learners": self.learner_info,
                "config": {
                    "algo_class": type(self.algorithm).__name__,
                    "learner_class": config.learner_class.__name__,
                    "env": str(config.env),
                    "num_env_runners": config.num_env_runners,
                    "num_envs_per_env_runner": config.num_envs_per_env_runner,
                    "num_learners": config.num_learners,
                    "train_batch_size_per_learner": config.train_batch_size_per_learner,
                    "minibatch_size": config.minibatch_size,
                    "num_epochs": config.num_epochs,
                    "learner_config_dict": dict(config.learner_config_dict or {}),
                },
            }
        )
        return merged

    def write(self, out_dir: Path) -> dict[str, Path]:
        """Writes the breakdown, top operators and trace files; returns their paths."""
        out_dir = check_out_dir(out_dir)
        paths: dict[str, Path] = {}
        if self.parts:
            breakdown = self.breakdown()
            paths["breakdown"] = out_dir / "breakdown.json"
            paths["breakdown"].write_text(json.dumps(breakdown.to_dict(), indent=2, default=str))
            (out_dir / "breakdown.txt").write_text(breakdown.table() + "\n")
        if self.trace is not None:
            # TensorBoard's PyTorch profiler plugin reads *.pt.trace.json.gz under --logdir.
            paths["trace"] = out_dir / "trace" / TRACE_FILE
            paths["trace"].parent.mkdir(exist_ok=True)
            paths["trace"].write_bytes(self.trace["trace"])
            paths["top_ops"] = out_dir / "top_ops.txt"
            paths["top_ops"].write_text(self.trace["table"])
            (out_dir / "top_ops.json").write_text(json.dumps(self.trace["top_ops"], indent=2))
        logger.info("profile written to %s", out_dir)
        return paths


class ProfilerCallback(RLlibCallback):
    """Profiles chosen iterations of any RLlib run; see the module docstring.

    Configure with :meth:`configure` (class attributes; RLlib instantiates callbacks itself).
    Only the driver-side instance (``on_algorithm_init``) does anything.
    """

    out_dir: str | None = None
    iterations: tuple[int, ...] = (2, 3, 4)
    trace_iteration: int | None = 5

    @classmethod
    def configure(
        cls,
        *,
        out_dir: str | Path | None,
        iterations: Iterable[int] = (2, 3, 4),
        trace_iteration: int | None | str = "next",
    ) -> type[ProfilerCallback]:
        """A subclass with these options, for ``config.callbacks(...)``.

        Args:
            out_dir: where files are written (``None``: only the result keys).
            iterations: 1-based ``training_iteration`` numbers to break down (>= 1 each).
            trace_iteration: iteration whose learner update is traced with the PyTorch
                profiler; ``"next"`` = the one after the last of ``iterations``, ``None`` = none.
        """
        iterations = tuple(sorted(set(int(i) for i in iterations)))
        if not iterations or iterations[0] < 1:
            raise ValueError(
                f"iterations={iterations!r} must be a non-empty list of training iterations "
                ">= 1. Fix: e.g. iterations=[2, 3, 4] (iteration 1 includes warm-up)."
            )
        if trace_iteration == "next":
            trace_iteration = iterations[-1] + 1
        if trace_iteration is not None and int(trace_iteration) < 1:
            raise ValueError(
                f"trace_iteration={trace_iteration!r} must be >= 1, 'next' or None. "
                "Fix: e.g. trace_iteration='next'."
            )
        if out_dir is not None:
            out_dir = str(check_out_dir(out_dir))
        attrs = {
            "out_dir": out_dir,
            "iterations": iterations,
            "trace_iteration": None if trace_iteration is None else int(trace_iteration),
        }
        return type("ConfiguredProfilerCallback", (cls,), attrs)

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        self.profiler = IterationProfiler(
            algorithm,
            iterations=self.iterations,
            trace_iteration=self.trace_iteration,
            out_dir=self.out_dir,
        )

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        profiler = getattr(self, "profiler", None)
        if profiler is not None:
            profiler.on_result(result)
