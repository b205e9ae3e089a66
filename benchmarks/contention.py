"""Throughput beside a competing CPU-bound process: ``rllib-ext train`` alone and shared, in one run.

Command (2-core machine; run alone, under the lock)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/contention.py \\
        --json benchmarks/results/contention/contention.jsonl

For each workload (the CartPole defaults of ``rllib-ext train``, and the SMAX
``smax-3s5z_vs_3s6z`` preset) and each thread setting (``auto``: rllib-ext's default, one torch
thread in the learner's process; ``2-threads``: ``--cpu-threads 2`` under OpenMP's default wait
policy; ``2-threads-passive``: the same with ``OMP_WAIT_POLICY=PASSIVE``, rllib-ext's import-time
default before 2026-12-06), ``rllib-ext train`` runs in a fresh process twice: alone, and beside
one competing CPU-bound process (a Python busy loop at the same priority, or ``--competitor-nice``).
The rate is env steps per second over the iterations after the first (``progress.csv``:
``env_runners/num_env_steps_sampled`` over ``time_this_iter_s``). The target: shared >= 0.5x of the
best quiet rate (a fair share of 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from run_header import append_rows, run_header

WORKLOADS = {
    "cartpole": ["--stop-reward", "none", "--stop-timesteps", "24000"],
    "smax-3s5z_vs_3s6z": ["--preset", "smax-3s5z_vs_3s6z", "--stop-timesteps", "49152"],
}
SETTINGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "auto": ({}, []),
    "2-threads": ({}, ["--cpu-threads", "2"]),
    "2-threads-passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, ["--cpu-threads", "2"]),
}
BUSY_LOOP = "while True: pass"


def run(workload: str, setting: str, competitor_nice: int | None) -> dict[str, Any]:
    """One ``rllib-ext train`` run; ``competitor_nice`` ``None``: alone."""
    rllib_ext = str(Path(sys.executable).with_name("rllib-ext"))
    variables, flags = SETTINGS[setting]
    cleared = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
    env = {**{k: v for k, v in os.environ.items() if k not in cleared}, **variables}
    competitor = None
    if competitor_nice is not None:
        competitor = subprocess.Popen(
            ["nice", "-n", str(competitor_nice), sys.executable, "-c", BUSY_LOOP]
        )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            started = time.perf_counter()
            subprocess.run(
                [
                    rllib_ext,
                    "train",
                    *WORKLOADS[workload],
                    *flags,
                    "--run-dir",
                    str(run_dir),
                    "--no-progress",
                ],
                env=env,
                check=True,
                capture_output=True,
            )
            wall = time.perf_counter() - started
            rows = list(csv.DictReader((run_dir / "progress.csv").open()))
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    timed = rows[1:]  # the first iteration includes compilation and warm-up
    seconds = sum(float(r["time_this_iter_s"]) for r in timed)
    steps = sum(float(r["env_runners/num_env_steps_sampled"]) for r in timed)
    return {
        "workload": workload,
        "setting": setting,
        "competitor": competitor_nice is not None,
        "competitor_nice": competitor_nice,
        "env_steps_per_s": steps / seconds,
        "iterations_timed": len(timed),
        "wall_s": wall,
        "load_average_after": os.getloadavg(),
    }


def _header(args: argparse.Namespace) -> dict[str, Any]:
    settings = {"workloads": WORKLOADS, "competitor": BUSY_LOOP}
    return run_header(settings={**settings, "competitor_nice": args.competitor_nice})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--competitor-nice", type=int, default=0)
    parser.add_argument("--json", type=Path, help="append rows to this JSON-lines file")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = [{"header": _header(args)}]
    print(json.dumps(rows[0]), flush=True)
    for workload in args.workloads:
        results = []
        for setting in args.settings:
            for nice in (None, args.competitor_nice):
                row = run(workload, setting, nice)
                results.append(row)
                rows.append(row)
                print(json.dumps(row), flush=True)
        best_quiet = max(r["env_steps_per_s"] for r in results if not r["competitor"])
        for r in results:
            summary = {**r, "of_best_quiet": r["env_steps_per_s"] / best_quiet, "summary": True}
            rows.append(summary)
            print(
                f"{workload:20s} {r['setting']:18s} "
                f"{'shared' if r['competitor'] else 'alone':6s} "
                f"{r['env_steps_per_s']:8.0f} env steps/s  {summary['of_best_quiet']:.2f}x",
                flush=True,
            )
    if args.json:
        append_rows(args.json, rows)


if __name__ == "__main__":
    main()
