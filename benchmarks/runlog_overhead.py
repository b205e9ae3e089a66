"""Cost of writing runs in Tune's format, and of running under ``tune.Tuner`` instead of in-process.

Command (2-core machine; the lock keeps other CPU jobs from overlapping)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/runlog_overhead.py

Two measurements, one run, the default ``rllib-ext train`` CartPole config (seed 0):

1. **Loop**: ``--train-iterations`` real ``algo.train()`` iterations, (a) in-process, as
   ``rllib-ext train`` runs them: ``config.build_algo()``, then ``algo.train()`` and
   ``RunLog.write`` (``rllib_ext.cli.runlog``: Tune's JSON/CSV/TensorBoard logger callbacks) per
   iteration; (b) under ``tune.Tuner(rllib_ext.PPO, ...)`` with Tune's default loggers, stopped
   after the same number of iterations. Both times are taken in the driver. Start-up = from the
   start to the first result, less that iteration's ``time_this_iter_s``; per-iteration overhead
   = the time between consecutive results less ``time_this_iter_s`` (the trainable's own
   iteration); shut-down = from the last result until the call returns. Each iteration samples
   and trains, so its length varies with load; the overheads are what the two ways add to it.
2. **Writer**: one real result of (a) is logged ``--iterations`` times by ``RunLog`` and by the
   hand-written CSV + TensorBoard writer ``rllib-ext train`` used before (kept below as the
   baseline), each into a fresh directory (the same result each time, so the file sizes are
   realistic, with the full config in every ``result.json`` row as Tune writes it). Reported:
   start-up (opening the files; Tune's JSON logger also writes ``params.json``/``params.pkl``)
   and the mean time per write, also as a share of the measured in-process iteration.

Printed last: the ratios (Tuner / in-process, Tune loggers / hand-written writer).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import logging
import math
import numbers
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray
import torch

from rllib_ext.cli.options import DEFAULT_TRAINING
from rllib_ext.cli.runconfig import resolve_settings
from rllib_ext.cli.runlog import RunLog
from rllib_ext.cli.train import build_algo_config, ray_init_kwargs

_SKIPPED_TOP_LEVEL = frozenset({"config", "date", "hostname", "node_ip", "pid", "trial_id"})


def _flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in result.items():
        if not prefix and key in _SKIPPED_TOP_LEVEL:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}/"))
        elif isinstance(value, numbers.Number) and not isinstance(value, complex):
            flat[name] = float(value)
    return flat


class HandWrittenSinks:
    """The baseline: numeric leaves to ``metrics.csv`` (append) and TensorBoard scalars."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.csv_path = run_dir / "metrics.csv"
        self.columns: list[str] = []
        self.writer = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=10)

    def write(self, result: Mapping[str, Any]) -> None:
        row = _flatten(result)
        new = [k for k in row if k not in set(self.columns)]
        if new or not self.csv_path.exists():
            self.columns.extend(sorted(new))
            with self.csv_path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns)
                writer.writeheader()
                writer.writerow(row)
        else:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns).writerow(row)
        step = int(result.get("num_env_steps_sampled_lifetime", 0))
        for key, value in row.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@dataclasses.dataclass
class LoopTiming:
    """Driver-side times of one way of running ``--train-iterations`` iterations (seconds)."""

    name: str
    total_s: float
    startup_s: float
    overhead_per_iter_s: float
    iter_s: float  # mean time_this_iter_s of the trainable
    shutdown_s: float


def _timing(
    name: str, started: float, ended: float, stamps: list[tuple[float, float]]
) -> LoopTiming:
    """``stamps``: (driver time a result arrived, its ``time_this_iter_s``) per iteration."""
    first_at, first_iter = stamps[0]
    gaps = [
        (at - previous_at) - iter_s
        for (previous_at, _), (at, iter_s) in zip(stamps, stamps[1:], strict=False)
    ]
    return LoopTiming(
        name=name,
        total_s=ended - started,
        startup_s=first_at - started - first_iter,
        overhead_per_iter_s=statistics.mean(gaps) if gaps else float("nan"),
        iter_s=statistics.mean(iter_s for _, iter_s in stamps),
        shutdown_s=ended - stamps[-1][0],
    )


def run_in_process(config: Any, iterations: int, run_dir: Path) -> tuple[LoopTiming, dict]:
    """What ``rllib-ext train`` does per iteration, without its checkpoints and progress line."""
    stamps: list[tuple[float, float]] = []
    started = time.perf_counter()
    algo = config.build_algo()
    log = RunLog(run_dir, config.to_dict())
    try:
        for _ in range(iterations):
            result = algo.train()
            log.write(result)
            stamps.append((time.perf_counter(), float(result["time_this_iter_s"])))
    finally:
        log.close()
        algo.stop()
    return _timing("in-process + RunLog", started, time.perf_counter(), stamps), result


def run_tuner(config: Any, iterations: int, storage: Path) -> LoopTiming:
    """The same config as a Tune trial (``rllib_ext.PPO``: the extension survives Tune)."""
    from ray import tune

    import rllib_ext

    stamps: list[tuple[float, float]] = []

    class Stamp(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):  # noqa: D102
            stamps.append((time.perf_counter(), float(result["time_this_iter_s"])))

    started = time.perf_counter()
    tuner = tune.Tuner(
        rllib_ext.PPO,
        param_space=config,
        run_config=tune.RunConfig(
            name="runlog_overhead",
            storage_path=str(storage),
            stop={"training_iteration": iterations},
            callbacks=[Stamp()],
            verbose=0,
        ),
    )
    results = tuner.fit()
    ended = time.perf_counter()
    if results.errors:
        raise RuntimeError(f"the Tune trial failed: {results.errors}")
    return _timing("tune.Tuner (default loggers)", started, ended, stamps)


def _time_writer(make, result: dict[str, Any], iterations: int) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory(prefix="runlog_bench_") as tmp:
        started = time.perf_counter()
        writer = make(Path(tmp))
        startup = time.perf_counter() - started
        per_iteration = []
        for i in range(1, iterations + 1):
            row = {**result, "training_iteration": i}
            started = time.perf_counter()
            writer.write(row)
            per_iteration.append(time.perf_counter() - started)
        writer.close()
    return startup, per_iteration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--train-iterations", type=int, default=6, help="real iterations per way of running"
    )
    parser.add_argument("--iterations", type=int, default=200, help="writes per writer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads in the driver (default: torch's; a Tune trial runs with "
        "Ray's OMP_NUM_THREADS, 1 per CPU of the trial)",
    )
    args = parser.parse_args()
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    logging.getLogger("rllib_ext").setLevel(logging.WARNING)
    settings = resolve_settings({"seed": str(args.seed), "checkpoint_freq": "0"})
    ray.init(**ray_init_kwargs(settings))
    try:
        with tempfile.TemporaryDirectory(prefix="runlog_overhead_") as tmp:
            config = build_algo_config(settings)
            local, result = run_in_process(config, args.train_iterations, Path(tmp) / "local")
            tuned = run_tuner(config, args.train_iterations, Path(tmp) / "tune")
    finally:
        ray.shutdown()

    print(f"machine: {_machine()}; driver torch threads: {torch.get_num_threads()}")
    print(
        f"\n1. loop: {args.train_iterations} iterations of the default CartPole config "
        f"(PPO {DEFAULT_TRAINING}), seconds"
    )
    print(
        f"{'way':<30} {'total':>7} {'start-up':>9} {'overhead/iter':>14} {'iter':>6} "
        f"{'shut-down':>10}"
    )
    for t in (local, tuned):
        print(
            f"{t.name:<30} {t.total_s:>7.2f} {t.startup_s:>9.2f} {t.overhead_per_iter_s:>14.3f} "
            f"{t.iter_s:>6.2f} {t.shutdown_s:>10.2f}"
        )

    print(f"\n2. writer: one result logged {args.iterations} times")
    writers = {
        "tune loggers (result.json, progress.csv, TB)": lambda d: RunLog(d, config.to_dict()),
        "hand-written (metrics.csv, TB)": HandWrittenSinks,
    }
    print(f"{'writer':<46} {'start-up ms':>11} {'ms/iter':>8} {'p90 ms':>7} {'share':>7}")
    means = {}
    for name, make in writers.items():
        startup, per = _time_writer(make, result, args.iterations)
        mean = statistics.mean(per)
        means[name] = mean
        p90 = statistics.quantiles(per, n=10)[-1]
        print(
            f"{name:<46} {startup * 1e3:>11.1f} {mean * 1e3:>8.2f} {p90 * 1e3:>7.2f} "
            f"{mean / local.iter_s:>7.2%}"
        )
    tune_ms, hand_ms = means.values()
    print("\nratios:")
    print(
        f"  tune.Tuner / in-process: start-up {tuned.startup_s / local.startup_s:.1f}x "
        f"({tuned.startup_s:.1f} s vs {local.startup_s:.1f} s), "
        f"per-iteration overhead {tuned.overhead_per_iter_s * 1e3:.0f} ms vs "
        f"{local.overhead_per_iter_s * 1e3:.0f} ms, total {tuned.total_s / local.total_s:.2f}x"
    )
    print(
        f"  Tune loggers / hand-written writer per iteration: {tune_ms / hand_ms:.2f}x "
        f"({tune_ms * 1e3:.2f} ms vs {hand_ms * 1e3:.2f} ms; "
        f"{tune_ms / local.iter_s:.2%} of an in-process iteration)"
    )


def _machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    bf16 = "AVX512-BF16" if "avx512_bf16" in flags else "no AVX512-BF16"
    return f"{os.cpu_count()} CPUs, {model}, {bf16}, load average {os.getloadavg()[0]:.2f}"


if __name__ == "__main__":
    main()
