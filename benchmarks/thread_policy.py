"""Single-agent PPO end to end under each CPU thread setting, alone and beside one busy process.

Command (2-core machine; run alone, under the lock)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/thread_policy.py \\
        --json benchmarks/results/thread_policy/thread_policy.jsonl

Per framework (stock RLlib, rllib-ext, Stable-Baselines3), OpenMP wait setting and torch intra-op
thread count, one fresh process runs ``ppo_throughput.py``'s end-to-end measurement (CartPole-v1,
the same PPO settings, ``--iters`` iterations after a warm-up one) twice: alone, and beside one
Python busy loop at the same priority. The settings:

* ``omp-default``: neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` set (OpenMP spins a while);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at once);
* ``spin-N``: ``GOMP_SPINCOUNT=N`` (a short spin, then sleep);

each with 1 and 2 torch intra-op threads (``OMP_NUM_THREADS`` in the worker's environment and
``torch.set_num_threads``; rllib-ext's ``cpu_threads=0`` keeps a count ``OMP_NUM_THREADS`` chose),
and ``--threads 0``: each framework's own default (rllib-ext: one thread, stock RLlib and SB3:
torch's default, one per core). Rows: a header row, then one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from run_header import append_rows, run_header

FRAMEWORKS = ("stock", "rllib-ext", "sb3")
SETTINGS = {
    "omp-default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin-1000": {"GOMP_SPINCOUNT": "1000"},
}
THREADS = (1, 2)
BUSY_LOOP = "while True: pass"


def _worker(task: dict[str, Any]) -> dict[str, Any]:
    import torch

    if task["threads"]:
        torch.set_num_threads(task["threads"])
    if task["framework"] == "rllib-ext":
        import rllib_ext  # noqa: F401
    import ray
    from ppo_throughput import throughput

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = throughput(task["framework"], task["env"], task["iters"])
    finally:
        ray.shutdown()
    return {"end_to_end": result["end_to_end"], "torch_threads": torch.get_num_threads()}


def measure(task: dict[str, Any], busy: bool) -> dict[str, Any]:
    """One row: ``task`` in a fresh process with its environment, beside a busy loop or not."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(SETTINGS[task["setting"]])
    env.pop("OMP_NUM_THREADS", None)
    if task["threads"]:
        env["OMP_NUM_THREADS"] = str(task["threads"])
    competitor = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(task)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {**task, "busy": busy, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument(
        "--threads", nargs="+", type=int, default=list(THREADS), help="0: the framework's default"
    )
    parser.add_argument("--iters", type=int, default=3, help="timed iterations per row")
    parser.add_argument("--json", type=Path, help="append rows to this JSON-lines file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))), flush=True)
        return
    rows: list[dict[str, Any]] = [{"header": run_header(settings=SETTINGS)}]
    print(json.dumps(rows[0]), flush=True)
    for framework in args.frameworks:
        for setting in args.settings:
            for threads in args.threads:
                task = dict(
                    framework=framework,
                    setting=setting,
                    threads=threads,
                    env=args.env,
                    iters=args.iters,
                )
                for busy in (False, True):
                    row = measure(task, busy)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        append_rows(args.json, rows)


if __name__ == "__main__":
    main()
