"""Profiling: where a PPO training iteration's wall time goes, plus a PyTorch profiler trace.

``enable_profiling(config, out_dir="prof", iterations=[3, 4, 5])`` (any PPO config, also as a Tune
``param_space``) selects ``Profiling<Base>`` subclasses of the config's EnvRunner and Learner (one
layer each, handing to a timer object: :mod:`.env_runner`, :mod:`.learner`), which log through
RLlib's ``MetricsLogger``, and adds :class:`ProfilerCallback`: each timed iteration's result gets
``rllib_ext/profile/<phase>`` shares, and ``out_dir`` gets ``breakdown.json``/``.txt``, the top
operators (``top_ops.txt``) and the Chrome trace (``trace/learner.pt.trace.json.gz``, for
TensorBoard or https://ui.perfetto.dev) of the next iteration's learner update.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rllib_ext.callbacks import add_callback
from rllib_ext.env_runners import rllib_env_runner_class
from rllib_ext.profiling.breakdown import PHASES, Breakdown, breakdown_of_result, merge_breakdowns
from rllib_ext.profiling.env_runner import profiled_env_runner_class
from rllib_ext.profiling.learner import profiled_learner_class

__all__ = ["PHASES", "TRACE_FILE", "Breakdown", "ProfilerCallback", "breakdown_of_result"]
__all__ += ["check_out_dir", "enable_profiling"]

logger = logging.getLogger(__name__)

RESULT_KEY = "rllib_ext/profile"
"""The result key of a timed iteration's shares (``wall_s`` and one per phase)."""
TRACE_FILE = "learner.pt.trace.json.gz"
"""Under ``<out_dir>/trace``: TensorBoard's PyTorch profiler plugin reads ``*.pt.trace.json.gz``."""
CONFIG_KEYS = (
    "env env_config num_env_runners num_envs_per_env_runner num_learners num_epochs".split()
)
CONFIG_KEYS += ["train_batch_size_per_learner", "minibatch_size", "learner_config_dict"]


def check_out_dir(out_dir: str | Path) -> Path:
    """Creates ``out_dir`` and checks it is writable.

    Raises:
        ValueError: the path is a file or cannot be created or written, naming the fix.
    """
    path = Path(out_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".rllib_ext_write_test").write_text("ok")
        (path / ".rllib_ext_write_test").unlink()
    except OSError as exc:
        raise ValueError(
            f"profile output directory {str(out_dir)!r} is not writable ({exc.strerror or exc}). "
            "Fix: pass a directory you can write to, e.g. --out ./profile."
        ) from None
    return path.resolve()


def _on_learners(algorithm: Any, method: str) -> list[Any]:
    return [
        r.get() for r in algorithm.learner_group.foreach_learner(lambda lrn: getattr(lrn, method)())
    ]


class ProfilerCallback(RLlibCallback):
    """Breaks down chosen iterations and writes the files; added by :func:`enable_profiling`.

    Options are class attributes (RLlib instantiates callbacks itself); only the driver-side
    instance does anything.
    """

    out_dir: str | None = None
    iterations: tuple[int, ...] = (2, 3, 4)
    trace: bool = True
    """Trace the learner update of the iteration after the last of ``iterations``."""

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        self.parts: list[Breakdown] = []

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        config, iteration = algorithm.config, int(result["training_iteration"])
        if iteration in self.iterations:
            part = breakdown_of_result(
                result, num_env_runners=config.num_env_runners, num_learners=config.num_learners
            )
            self.parts.append(part)
            result[RESULT_KEY] = {"wall_s": part.wall_s, **part.shares}
        if self.trace and iteration == self.iterations[-1]:
            _on_learners(algorithm, "arm_trace")
        if self.out_dir and self.parts and iteration == self.iterations[-1] + int(self.trace):
            traces = _on_learners(algorithm, "pop_trace") if self.trace else []
            self.write(Path(self.out_dir), config=config, trace=next(filter(None, traces), None))

    def write(self, out_dir: Path, *, config: Any, trace: dict[str, Any] | None) -> None:
        """Writes the breakdown, the traced update's top operators and its trace under ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        breakdown = merge_breakdowns(self.parts)
        classes = {"learner_class": config.learner_class, "env_runner_class": config.env_runner_cls}
        breakdown.details["config"] = {k: getattr(config, k) for k in CONFIG_KEYS} | {
            key: getattr(cls, "profiled_class", cls).__name__ for key, cls in classes.items()
        }
        (out_dir / "breakdown.json").write_text(
            json.dumps(breakdown.to_dict(), indent=2, default=str)
        )
        (out_dir / "breakdown.txt").write_text(breakdown.table() + "\n")
        if trace is not None:
            (out_dir / "trace").mkdir(exist_ok=True)
            (out_dir / "trace" / TRACE_FILE).write_bytes(trace["trace"])
            (out_dir / "top_ops.txt").write_text(trace["table"])
        logger.info("profile written to %s", out_dir)


def enable_profiling(
    config: Any,
    *,
    out_dir: str | Path | None,
    iterations: Iterable[int] = (2, 3, 4),
    trace: bool = True,
) -> Any:
    """Profiles ``iterations`` of runs built from ``config`` (changed in place and returned).

    Args:
        out_dir: where files are written (``None``: only the result keys, no trace).
        iterations: 1-based ``training_iteration`` numbers to break down (>= 1 each).
        trace: trace the learner update of the iteration after the last of ``iterations``
            with the PyTorch profiler (traced apart, so its overhead stays out of the breakdown).

    Raises:
        ValueError: bad ``iterations`` or an unwritable ``out_dir``, naming the fix.
    """
    timed = tuple(sorted(set(int(i) for i in iterations)))
    if not timed or timed[0] < 1:
        raise ValueError(
            f"iterations={timed!r} must be a non-empty list of training iterations >= 1. "
            "Fix: e.g. iterations=[2, 3, 4] (iteration 1 includes warm-up)."
        )
    out = None if out_dir is None else str(check_out_dir(out_dir))
    # The EnvRunner class the run would use: the config's, else RLlib's own choice (its
    # recording runner with .offline_data(output=...)); rllib_ext.PPOConfig's runner table
    # applies its rules to the class underneath (rllib_ext.runner_table).
    chosen = config.env_runner_cls
    runner = profiled_env_runner_class(
        chosen or rllib_env_runner_class(config), rllib_choice=chosen is None
    )
    learner = profiled_learner_class(config.learner_class)
    config.env_runners(env_runner_cls=runner)
    config.learners(learner_class=learner)

    class ConfiguredProfilerCallback(ProfilerCallback):
        """This call's options (RLlib builds callbacks without arguments)."""

    ConfiguredProfilerCallback.out_dir = out
    ConfiguredProfilerCallback.iterations = timed
    ConfiguredProfilerCallback.trace = trace and out is not None
    add_callback(config, ConfiguredProfilerCallback, replaces=ProfilerCallback)  # re-configures
    return config
