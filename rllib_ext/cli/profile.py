"""``rllib-ext profile``: where a training iteration's time goes.

Runs ``warmup`` untimed iterations (lazy initialisation, first-call overheads), then
``iterations`` timed ones for the breakdown, then one more whose learner update is traced with
the PyTorch profiler (traced separately so the profiler's overhead does not distort the
breakdown). All through :func:`rllib_ext.profiling.enable_profiling`, which Tune users apply to
their own config instead.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rllib_ext.cli.runconfig import CLIError, TrainSettings

__all__ = ["ProfileResult", "parse_count", "profile"]

logger = logging.getLogger("rllib_ext.cli")


@dataclass
class ProfileResult:
    out_dir: Path
    breakdown: dict[str, Any]
    table: str
    top_ops: list[dict[str, Any]]
    files: dict[str, Path]


def parse_count(flag: str, value: Any, *, minimum: int, example: int) -> int:
    """An integer flag ``>= minimum``, or a :class:`CLIError` naming the fix."""
    try:
        number = int(str(value))
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise CLIError(
            f"{flag} {value!r} must be an integer >= {minimum}. Fix: e.g. {flag} {example}."
        )
    return number


def default_out_dir(env: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env).strip("_") or "env"
    return Path("rllib_ext_runs") / f"profile_{name}_{datetime.now():%Y%m%d-%H%M%S}"


def profile(
    settings: TrainSettings,
    *,
    iterations: int,
    warmup: int,
    out_dir: str | Path | None,
    stock: bool = False,
    trace: bool = True,
) -> ProfileResult:
    """Runs the profile and writes its files; see the module docstring.

    Args:
        settings: as for ``rllib-ext train`` (stop criteria are ignored).
        stock: profile RLlib's own ``PPOConfig`` and learner (no rllib_ext component).

    Raises:
        CLIError: bad settings, ``iterations < 1``, ``warmup < 0`` or an unwritable ``out_dir``.
    """
    from ray.rllib.algorithms.ppo import PPOConfig as RLlibPPOConfig

    from rllib_ext.cli.train import build_algo_config, check_settings, ray_init_kwargs
    from rllib_ext.profiling import check_out_dir, enable_profiling
    from rllib_ext.profiling.callback import TRACE_FILE

    iterations = parse_count("--iterations", iterations, minimum=1, example=3)
    warmup = parse_count("--warmup", warmup, minimum=0, example=1)
    try:
        out = check_out_dir(out_dir or default_out_dir(settings.env))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    check_settings(settings)
    config = build_algo_config(settings, config_cls=RLlibPPOConfig if stock else None)
    timed = range(warmup + 1, warmup + iterations + 1)
    trace_iteration = warmup + iterations + 1 if trace else None
    enable_profiling(config, out_dir=out, iterations=timed, trace_iteration=trace_iteration)
    import ray

    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(**ray_init_kwargs(settings))
    algo = None
    try:
        algo = config.build_algo()
        for i in range(warmup + iterations + (1 if trace else 0)):
            result = algo.train()
            phase = "warm-up" if i < warmup else ("timed" if i < warmup + iterations else "trace")
            logger.info("iteration %d (%s): %.2f s", i + 1, phase, result["time_this_iter_s"])
    finally:
        if algo is not None:
            algo.stop()
        if owns_ray:
            ray.shutdown()
    files = {"breakdown": out / "breakdown.json", "table": out / "breakdown.txt"}
    if trace:
        files |= {"trace": out / "trace" / TRACE_FILE, "top_ops": out / "top_ops.txt"}
    return ProfileResult(
        out_dir=out,
        breakdown=json.loads(files["breakdown"].read_text()),
        table=files["table"].read_text(),
        top_ops=json.loads((out / "top_ops.json").read_text()) if trace else [],
        files=files,
    )


def render(result: ProfileResult, *, top: int = 15) -> str:
    """What ``rllib-ext profile`` prints: the breakdown, the top operators and the files."""
    config = result.breakdown["details"].get("config", {})
    lines = [
        f"rllib-ext profile: {config.get('env')} ({config.get('learner_class')}, "
        f"{config.get('num_env_runners')} env runners, {config.get('num_learners')} learners), "
        f"iterations {result.breakdown['iterations']}",
        "",
        result.table.rstrip(),
    ]
    if result.top_ops:
        lines += ["", f"top {top} operators of the traced learner update (self CPU time):"]
        lines.append(f"{'operator':<44} {'calls':>7} {'self ms':>9} {'total ms':>9}")
        lines += [
            f"{op['name'][:44]:<44} {op['calls']:>7} {op['self_cpu_ms']:>9.2f} {op['cpu_ms']:>9.2f}"
            for op in result.top_ops[:top]
        ]
    lines += ["", *(f"{name}: {path}" for name, path in result.files.items())]
    return "\n".join(lines)
