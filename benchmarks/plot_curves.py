"""Learning curves from the benchmarks' JSON-lines rows, drawn into one PNG.

Commands (no CPU lock needed: it only reads files)::

    python benchmarks/plot_curves.py     # every benchmarks/results/smax_learning/smax_*.jsonl
    python benchmarks/plot_curves.py benchmarks/results/smax_learning/smax_3m_batched_seed0.jsonl \\
        benchmarks/results/smax_learning/smax_2s3z_seed0.jsonl \\
        --out benchmarks/results/smax_learning/smax_curves.png
    python benchmarks/plot_curves.py benchmarks/results/cartpole/cartpole_curves.jsonl \\
        --out benchmarks/results/cartpole/cartpole_curves.png --hline 450

Input: a run directory of ``rllib-ext train`` (or Tune) or its ``progress.csv``
(``num_env_steps_sampled_lifetime``, ``env_runners/episode_return_mean``,
``env_runners/rllib_ext/win_rate``, ``time_total_s``), or a JSON-lines file: one JSON object per line, as ``benchmarks/smax_learning.py learn`` and
``benchmarks/train_cartpole.py --curves`` print them; lines that are not JSON objects (logs)
are skipped, and so is a ``{"header": {...}}`` line (the file's command, commit, machine and
settings). A row has ``env_steps`` and ``wall_s`` and any of the metrics below; rows that lack
a metric are left out of that metric's panel (``greedy_win_rate`` appears every few
iterations only). ``benchmarks/smax_learning.py``'s closing row (``final_env_steps``,
``greedy_eval_win_rate``) is drawn as a star on the greedy panel. A row with a ``run`` key (and
optionally ``seed``) belongs to that run of the file, so one file can hold several runs.

Output: one panel per metric found (x: ``--x``), one colour per run.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SMAX_TITLE = (
    "SMAX, shared-policy PPO with central critic "
    "(2-core AMD EPYC with AVX512-BF16, no GPU, shared machine)"
)

# Metric key -> panel title, in panel order.
METRICS = {
    "sampled_win_rate": "sampled win rate (policy's actions, fresh battles)",
    "greedy_win_rate": "greedy win rate (argmax actions, fresh episodes)",
    "train_win_rate": "win rate of the training policy",
    "episode_return_mean": "mean episode return",
}
X_LABELS = {"env_steps": "env steps", "wall_s": "wall-clock seconds"}


@dataclass
class Run:
    """The rows of one run: ``points[metric]`` is a list of ``(env_steps, wall_s, value)``."""

    label: str
    points: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    final: tuple[float, float, float] | None = None  # (env_steps, wall_s, greedy eval win rate)


# progress.csv column -> row key of the JSON-lines files.
PROGRESS_COLUMNS = {
    "num_env_steps_sampled_lifetime": "env_steps",
    "time_total_s": "wall_s",
    "env_runners/episode_return_mean": "episode_return_mean",
    "env_runners/rllib_ext/win_rate": "train_win_rate",
}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _progress_rows(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            out = {}
            for column, key in PROGRESS_COLUMNS.items():
                value = _number(row.get(column) or "")
                if value is not None:
                    out[key] = value
            yield out


def _rows(path: Path) -> Iterable[dict[str, Any]]:
    if path.is_dir():
        path = path / "progress.csv"
    if path.suffix == ".csv":
        yield from _progress_rows(path)
        return
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "header" not in row:
            yield row


def read_runs(paths: Sequence[Path]) -> list[Run]:
    """Groups the rows of ``paths`` into runs (one per file, or per ``run``/``seed`` key)."""
    runs: dict[str, Run] = {}
    for path in paths:
        for row in _rows(path):
            label = path.name if path.is_dir() else path.stem
            if "run" in row:
                label = f"{row['run']}" + (f" seed {row['seed']}" if "seed" in row else "")
            run = runs.setdefault(label, Run(label))
            if "final_env_steps" in row and "greedy_eval_win_rate" in row:
                run.final = (
                    float(row["final_env_steps"]),
                    float(row.get("final_wall_s", float("nan"))),
                    float(row["greedy_eval_win_rate"]),
                )
                continue
            if "env_steps" not in row:
                continue
            for metric in METRICS:
                value = row.get(metric)
                if isinstance(value, (int, float)) and value == value:  # skips None and nan
                    run.points.setdefault(metric, []).append(
                        (float(row["env_steps"]), float(row.get("wall_s", "nan")), float(value))
                    )
    return list(runs.values())


def plot(
    runs: Sequence[Run],
    out: Path,
    *,
    x: str = "env_steps",
    title: str | None = None,
    hline: float | None = None,
    only: Sequence[str] | None = None,
) -> list[str]:
    """Writes the PNG; returns the metrics drawn (one panel each; ``only``: at most these)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        m for m in METRICS if any(m in run.points for run in runs) and (not only or m in only)
    ]
    if not metrics:
        raise SystemExit(f"no rows with env_steps and one of {sorted(METRICS)} in these files")
    column = 0 if x == "env_steps" else 1
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, run in enumerate(runs):
            colour = colours[i % len(colours)]
            points = run.points.get(metric, [])
            if points:
                xs = [p[column] for p in points]
                ys = [p[2] for p in points]
                marker = "o" if metric in ("greedy_win_rate", "sampled_win_rate") else None
                ax.plot(xs, ys, color=colour, marker=marker, markersize=3, label=run.label)
            if metric == "greedy_win_rate" and run.final is not None:
                ax.plot(
                    [run.final[column]],
                    [run.final[2]],
                    color=colour,
                    marker="*",
                    markersize=12,
                    linestyle="none",
                    label=f"{run.label}: final evaluation",
                )
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
        ax.set_title(METRICS[metric], fontsize=10)
        ax.set_xlabel(X_LABELS[x])
        ax.set_xlim(left=0)
        if metric.endswith("win_rate"):
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="JSON-lines files, run directories or progress.csv files "
        "(default: benchmarks/results/smax_learning/smax_*.jsonl)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "smax_learning" / "smax_curves.png",
        help="PNG to write (default: benchmarks/results/smax_learning/smax_curves.png)",
    )
    parser.add_argument("--x", choices=sorted(X_LABELS), default="env_steps", help="x axis")
    parser.add_argument(
        "--title", default=None, help="figure title (default for the SMAX files: the setup)"
    )
    parser.add_argument("--hline", type=float, default=None, help="dashed target line, e.g. 450")
    parser.add_argument(
        "--metrics", nargs="+", choices=sorted(METRICS), default=None, help="panels (default: all)"
    )
    args = parser.parse_args(argv)
    files = args.files or sorted((RESULTS / "smax_learning").glob("smax_*.jsonl"))
    title = args.title if args.title is not None or args.files else SMAX_TITLE
    if not files:
        raise SystemExit(f"no JSON-lines files given and none in {RESULTS}")
    runs = read_runs(files)
    metrics = plot(runs, args.out, x=args.x, title=title, hline=args.hline, only=args.metrics)
    print(f"wrote {args.out}: {len(runs)} run(s) ({', '.join(r.label for r in runs)}), {metrics}")


if __name__ == "__main__":
    main()
