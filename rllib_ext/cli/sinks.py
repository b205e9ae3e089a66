"""Where ``rllib-ext train`` writes: a CSV of scalar metrics, TensorBoard events, the summary.

Metric names are the result dict's keys joined by ``/`` (``env_runners/episode_return_mean``),
the same names Tune uses, so CSV columns, TensorBoard tags and Tune stop keys agree.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "flatten_metrics", "format_summary"]

# Result entries that are not metrics (the whole config, host names, dates).
_SKIPPED_TOP_LEVEL = frozenset({"config", "date", "hostname", "node_ip", "pid", "trial_id"})


def flatten_metrics(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested ``algo.train()`` result, keyed ``"a/b/c"``.

    Strings, lists and the ``config`` entry are dropped; bools become 0/1.
    """
    flat: dict[str, float] = {}
    for key, value in result.items():
        if not prefix and key in _SKIPPED_TOP_LEVEL:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, prefix=f"{name}/"))
        elif isinstance(value, numbers.Number) and not isinstance(value, complex):
            flat[name] = float(value)
        elif hasattr(value, "item") and getattr(value, "size", None) == 1:
            # numpy / torch scalars.
            try:
                flat[name] = float(value.item())
            except (TypeError, ValueError):
                continue
    return flat


class MetricsWriter:
    """Appends one row per iteration to ``metrics.csv`` and scalars to TensorBoard.

    New metrics can appear after the first iteration (RLlib logs some lazily); the CSV is then
    rewritten with the wider header so every row keeps its columns aligned.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.csv_path = run_dir / "metrics.csv"
        self.tensorboard_dir = run_dir / "tensorboard"
        self._columns: list[str] = []
        self._writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=str(self.tensorboard_dir), flush_secs=10)

    def write(self, metrics: Mapping[str, float], *, step: int) -> None:
        """Records one iteration's flat metrics at global step ``step`` (env steps)."""
        row = dict(metrics)
        known = set(self._columns)
        new = [k for k in row if k not in known]
        if new or not self.csv_path.exists():
            self._columns.extend(sorted(new))
            self._rewrite_csv(row)
        else:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerow(row)
        if self._writer is not None:
            for key, value in row.items():
                if math.isfinite(value):
                    self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

    def _rewrite_csv(self, row: Mapping[str, float]) -> None:
        # Rare (new metric names show up in the first iterations only): re-read, widen, append.
        old_rows: list[dict[str, str]] = []
        if self.csv_path.exists():
            with self.csv_path.open(newline="") as f:
                old_rows = list(csv.DictReader(f))
        with self.csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(old_rows)
            writer.writerow(row)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


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
