"""The end of a ``rllib-ext train`` segment: :class:`TrainResult`, ``summary.json`` (written
atomically, whole-run counters) and the table printed on the terminal.

Per-iteration metrics go through Tune's logger callbacks, see :mod:`rllib_ext.cli.runlog`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from rllib_ext import __version__
from rllib_ext.cli.checkpoints import write_json_atomic
from rllib_ext.cli.runconfig import DEFAULT_TRAINING, TrainSettings

__all__ = ["TrainResult", "format_summary", "summary_table", "write_summary"]

SUMMARY_FILE = "summary.json"

_EXIT_CODES = {"interrupted": 130, "terminated": 143}


@dataclass
class TrainResult:
    """What a ``rllib-ext train`` run ended with (also written to ``summary.json``).

    Counters cover the whole run: all segments (the first process and every ``--resume``),
    each counted up to its last checkpoint.
    """

    run_dir: Path
    checkpoint: Path | None
    """The newest checkpoint of the run (``None`` if none was written)."""
    episode_return_mean: float
    env_steps: int
    iterations: int
    wall_time_s: float
    """Process time (Ray start-up included), summed over segments."""
    train_time_s: float
    """From ``build_algo()`` to the last iteration, summed over segments."""
    stop_reason: str
    """``stop_reward``, ``stop_win_rate``, ``stop_timesteps``, ``time_budget``, ``interrupted`` (SIGINT) or
    ``terminated`` (SIGTERM)."""
    settings: TrainSettings
    win_rate: float | None = None
    """SMAC envs: ``env_runners/rllib_ext/win_rate`` of the last iteration (``None`` otherwise)."""
    segments: int = 1
    backend: str | None = None
    """SMAC envs: the backend that ran (``smacv2``, ``smac`` or ``smax``); ``None`` otherwise."""

    @property
    def interrupted(self) -> bool:
        return self.stop_reason in _EXIT_CODES

    @property
    def exit_code(self) -> int:
        """0, or 128 + the signal number for a run stopped by SIGINT (130) / SIGTERM (143)."""
        return _EXIT_CODES.get(self.stop_reason, 0)


def write_summary(result: TrainResult) -> Path:
    summary = {
        "episode_return_mean": result.episode_return_mean,
        "win_rate": result.win_rate,
        "backend": result.backend,
        "env_steps": result.env_steps,
        "iterations": result.iterations,
        "wall_time_s": round(result.wall_time_s, 3),
        "train_time_s": round(result.train_time_s, 3),
        "segments": result.segments,
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "stop_reason": result.stop_reason,
        "settings": result.settings.to_dict(),
        "ppo": {**DEFAULT_TRAINING, **result.settings.training},
        "versions": {"rllib_ext": __version__, "ray": ray.__version__},
    }
    path = result.run_dir / SUMMARY_FILE
    write_json_atomic(path, summary)
    return path


_STOP_TEXT = {
    "stop_reward": "reached --stop-reward",
    "stop_win_rate": "reached --stop-win-rate",
    "stop_timesteps": "reached --stop-timesteps",
    "time_budget": "used up --time-budget",
    "interrupted": "interrupted (Ctrl-C)",
    "terminated": "terminated (SIGTERM)",
}


def summary_table(result: TrainResult) -> str:
    """The table ``rllib-ext train`` prints at the end."""
    title = f"rllib-ext train: {result.settings.env}, {_STOP_TEXT[result.stop_reason]}"
    return format_summary(
        [
            ("episode_return_mean", result.episode_return_mean),
            *([("win_rate", result.win_rate)] if result.win_rate is not None else []),
            *([("backend", result.backend)] if result.backend is not None else []),
            ("env_steps", result.env_steps),
            ("iterations", result.iterations),
            ("train_time_s", result.train_time_s),
            ("wall_time_s", result.wall_time_s),
            *([("segments", result.segments)] if result.segments > 1 else []),
            ("checkpoint", result.checkpoint),
            ("run_dir", result.run_dir),
            ("summary", result.run_dir / SUMMARY_FILE),
        ],
        title=title,
    )


def format_summary(rows: Iterable[tuple[str, Any]], *, title: str) -> str:
    """A two-column plain-text table."""
    rows = [(name, _format_value(value)) for name, value in rows]
    width = max(len(name) for name, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1000 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
