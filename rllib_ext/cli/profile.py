"""``rllib-ext profile``: where a training iteration's time goes.

Runs ``warmup`` untimed iterations (lazy initialisation, first-call overheads), then
``iterations`` timed ones for the breakdown, then one more whose learner update is traced with
the PyTorch profiler, all through :func:`rllib_ext.profiling.enable_profiling` (which Tune users
apply to their own config instead).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.ppo_config import build_algo_config, check_settings, ray_init_kwargs
from rllib_ext.cli.runconfig import TrainSettings
from rllib_ext.cli.values import int_at_least

__all__ = ["parse_count", "profile", "render"]

logger = logging.getLogger("rllib_ext.cli")


def parse_count(flag: str, value: Any, *, minimum: int, example: int) -> int:
    """An integer flag ``>= minimum``, or a :class:`CLIError` naming the fix."""
    try:
        return int_at_least(minimum)(value)
    except ValueError as exc:
        raise CLIError(f"{flag} {value!r} {exc}. Fix: e.g. {flag} {example}.") from None


def profile(
    settings: TrainSettings,
    *,
    iterations: Any,
    warmup: Any,
    out_dir: str | Path | None,
    stock: bool = False,
    trace: bool = True,
) -> Path:
    """Runs the profile and writes its files; returns their directory (see the module docstring).

    Args:
        settings: as for ``rllib-ext train`` (stop criteria are ignored).
        iterations / warmup: counts as given on the command line.
        out_dir: ``None``: ``rllib_ext_runs/profile_<env>_<time>``.
        stock: profile RLlib's own ``PPOConfig`` and learner (no rllib_ext component).

    Raises:
        CLIError: bad settings, ``iterations < 1``, ``warmup < 0`` or an unwritable ``out_dir``.
    """
    # lazy: keeps Ray out of --help
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig as RLlibPPOConfig

    from rllib_ext.profiling import TRACE_FILE, check_out_dir, enable_profiling

    timed = parse_count("--iterations", iterations, minimum=1, example=3)
    warmup = parse_count("--warmup", warmup, minimum=0, example=1)
    if out_dir is None:
        env = re.sub(r"[^A-Za-z0-9_.-]+", "_", settings.env).strip("_") or "env"
        out_dir = Path("rllib_ext_runs") / f"profile_{env}_{datetime.now():%Y%m%d-%H%M%S}"
    try:
        out = check_out_dir(out_dir)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    for stale in ("breakdown.json", "breakdown.txt", "top_ops.txt", f"trace/{TRACE_FILE}"):
        (out / stale).unlink(missing_ok=True)  # render() reads what this run wrote
    check_settings(settings)
    config = build_algo_config(settings, config_cls=RLlibPPOConfig if stock else None)
    enable_profiling(
        config, out_dir=out, iterations=range(warmup + 1, warmup + timed + 1), trace=trace
    )
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(**ray_init_kwargs(settings))
    algo = None
    try:
        algo = config.build_algo()
        for i in range(1, warmup + timed + 1 + int(trace)):
            result = algo.train()
            phase = "warm-up" if i <= warmup else ("timed" if i <= warmup + timed else "trace")
            logger.info("iteration %d (%s): %.2f s", i, phase, result["time_this_iter_s"])
    finally:
        if algo is not None:
            algo.stop()
        if owns_ray:
            ray.shutdown()
    return out


def render(out: Path) -> str:
    """What ``rllib-ext profile`` prints: the breakdown, the traced update's top operators, files."""
    config = json.loads((out / "breakdown.json").read_text())["details"]["config"]
    lines = [
        f"rllib-ext profile of {config['env']} ({config['learner_class']}, "
        f"{config['num_env_runners']} env runners, {config['num_learners']} learners)",
        (out / "breakdown.txt").read_text(),
    ]
    if (out / "top_ops.txt").is_file():
        lines += ["top operators of the traced learner update:", (out / "top_ops.txt").read_text()]
    files = sorted(p for p in out.rglob("*") if p.is_file())
    return "\n".join([*lines, *(f"{p.relative_to(out)}: {p}" for p in files)])
