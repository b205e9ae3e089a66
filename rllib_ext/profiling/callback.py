"""``enable_profiling``: the breakdown and the PyTorch trace from inside any RLlib run.

``enable_profiling(config, out_dir="prof", iterations=[3, 4, 5])`` (rllib_ext or stock PPO config,
also as a Tune ``param_space``) selects the timing EnvRunner and Learner subclasses and adds
:class:`ProfilerCallback`. Each profiled iteration's result gets ``rllib_ext_profile/<phase>``
shares; after the last one, ``breakdown.json``/``.txt``, ``top_ops.txt``/``.json`` and
``trace/learner.pt.trace.json.gz`` (Chrome trace for TensorBoard's PyTorch profiler plugin or
https://ui.perfetto.dev) of the learner update of ``trace_iteration`` are written to ``out_dir``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rllib_ext.profiling.breakdown import Breakdown, breakdown_of_result, merge_breakdowns
from rllib_ext.profiling.env_runner import profiling_env_runner_cls
from rllib_ext.profiling.learner import profiling_learner_cls

__all__ = ["TRACE_FILE", "ProfilerCallback", "check_out_dir", "enable_profiling"]

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


def _learner_calls(algorithm: Any, method: str) -> list[Any]:
    results = algorithm.learner_group.foreach_learner(lambda learner: getattr(learner, method)())
    return [r.get() for r in results]


def _base_name(cls: type) -> str:
    return getattr(cls, "profiled_class", cls).__name__


class ProfilerCallback(RLlibCallback):
    """Breaks down chosen iterations and writes the files; added by :func:`enable_profiling`.

    Options are class attributes (RLlib instantiates callbacks itself); only the driver-side
    instance does anything.
    """

    out_dir: str | None = None
    iterations: tuple[int, ...] = (2, 3, 4)
    trace_iteration: int | None = 5

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        self.parts: list[Breakdown] = []
        self.trace: dict[str, Any] | None = None
        self.written = False
        if self.trace_iteration == 1:
            _learner_calls(algorithm, "arm_trace")

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        config, iteration = algorithm.config, int(result["training_iteration"])
        if iteration in self.iterations:
            part = breakdown_of_result(
                result, num_env_runners=config.num_env_runners, num_learners=config.num_learners
            )
            self.parts.append(part)
            result[RESULT_KEY] = {"wall_s": part.wall_s, **part.shares}
        if self.trace_iteration is not None and iteration + 1 == self.trace_iteration:
            _learner_calls(algorithm, "arm_trace")
        if iteration == self.trace_iteration:
            self.trace = next((t for t in _learner_calls(algorithm, "pop_trace") if t), None)
        done = len(self.parts) == len(self.iterations)
        if done and iteration >= (self.trace_iteration or 0) and not self.written:
            self.written = True
            if self.out_dir is not None:
                self.write(Path(self.out_dir), config=config)

    def write(self, out_dir: Path, *, config: Any) -> dict[str, Path]:
        """Writes the breakdown, top operators and trace files; returns their paths."""
        out_dir = check_out_dir(out_dir)
        paths: dict[str, Path] = {}
        if self.parts:
            breakdown = merge_breakdowns(self.parts)
            keys = "env env_config num_env_runners num_envs_per_env_runner num_learners".split()
            keys += ["train_batch_size_per_learner", "minibatch_size", "num_epochs"]
            breakdown.details["config"] = {
                **{k: getattr(config, k) for k in (*keys, "learner_config_dict")},
                "learner_class": _base_name(config.learner_class),
                "env_runner_class": _base_name(config.env_runner_cls),
            }
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


def enable_profiling(
    config: Any,
    *,
    out_dir: str | Path | None,
    iterations: Iterable[int] = (2, 3, 4),
    trace_iteration: int | None | str = "next",
) -> Any:
    """Profiles ``iterations`` of runs built from ``config`` (changed in place and returned).

    Args:
        out_dir: where files are written (``None``: only the result keys).
        iterations: 1-based ``training_iteration`` numbers to break down (>= 1 each).
        trace_iteration: iteration whose learner update is traced with the PyTorch
            profiler; ``"next"`` = the one after the last of ``iterations``, ``None`` = none.

    Raises:
        ValueError: bad ``iterations``/``trace_iteration`` or an unwritable ``out_dir``.
    """
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rllib_ext.config import add_callback

    timed = tuple(sorted(set(int(i) for i in iterations)))
    if not timed or timed[0] < 1:
        raise ValueError(
            f"iterations={timed!r} must be a non-empty list of training iterations >= 1. "
            "Fix: e.g. iterations=[2, 3, 4] (iteration 1 includes warm-up)."
        )
    if trace_iteration == "next":
        trace_iteration = timed[-1] + 1
    if trace_iteration is not None and int(trace_iteration) < 1:
        raise ValueError(
            f"trace_iteration={trace_iteration!r} must be >= 1, 'next' or None. "
            "Fix: e.g. trace_iteration='next'."
        )
    if out_dir is not None:
        out_dir = str(check_out_dir(out_dir))
    # The EnvRunner class the run would use: the config's, else RLlib's default.
    runner = config.env_runner_cls or (
        MultiAgentEnvRunner if config.is_multi_agent else SingleAgentEnvRunner
    )
    config.env_runners(env_runner_cls=profiling_env_runner_cls(runner))
    config.learners(learner_class=profiling_learner_cls(config.learner_class))
    attrs = {
        "out_dir": out_dir,
        "iterations": timed,
        "trace_iteration": None if trace_iteration is None else int(trace_iteration),
    }
    add_callback(config, type("ConfiguredProfilerCallback", (ProfilerCallback,), attrs))
    return config
