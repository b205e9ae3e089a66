"""Fused sampling before and after a change: two checkouts, alternating fresh processes, one run.

Command (2-core machine; run alone, under the lock)::

    git worktree add /tmp/before <commit>; git worktree add /tmp/after HEAD
    flock /tmp/cpu.lock .venv/bin/python benchmarks/sampling_ab.py /tmp/before /tmp/after \\
        --json benchmarks/results/sampling_ab/sampling_ab.jsonl

For each round and checkout (``PYTHONPATH`` set to it, so its ``rllib_ext`` is the one imported;
the harness is this script's, the same for both), one fresh process measures env steps per second of
``sample()`` alone, warm, for ``--seconds`` each:

* ``cartpole``: ``rllib_ext.PPOConfig``'s default runner (``FusedSingleAgentEnvRunner``) on
  CartPole-v1, 8 envs, 2,000 env steps per call ([256, 256] tanh, ``ppo_throughput.py``'s module);
* ``smax``: ``smax_throughput.py``'s ``fused`` path on 3s5z_vs_3s6z, 64 battles, 128 steps per
  battle per call (what training asks of a local env runner);

each with one torch thread, what the learner sets in a local runner's process.

Rows: a header row, then one JSON line per (round, checkout, workload) with the checkout's commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from run_header import append_rows, run_header

WORKLOADS = ("cartpole", "smax")


def _cartpole(seconds: float) -> float:
    from rllib_ext import PPOConfig

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=250)
        .rl_module(model_config={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"})
        .debugging(seed=0)
    )
    runner = config.env_runner_cls(config=config)
    runner.sample(num_timesteps=2000)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += sum(len(e) for e in runner.sample(num_timesteps=2000))
    return steps / (time.perf_counter() - start)


def _smax(seconds: float) -> float:
    from smax_throughput import measure_sampling

    return float(
        measure_sampling("3s5z_vs_3s6z", "fused", num_envs=64, seconds=seconds, steps_per_env=128)[
            "rate"
        ]
    )


def _worker(workload: str, seconds: float) -> dict[str, Any]:
    import ray
    import torch

    torch.set_num_threads(1)  # what the learner sets in this process (cpu_threads auto)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rate = _cartpole(seconds) if workload == "cartpole" else _smax(seconds)
    finally:
        ray.shutdown()
    return {"rate": rate}


def _commit(tree: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def measure(tree: Path, workload: str, seconds: float, own_harness: bool = False) -> dict[str, Any]:
    """One fresh process importing ``rllib_ext`` from checkout ``tree`` (this script and its
    helpers from this checkout, so both sides run the same harness; ``own_harness``: from
    ``tree``'s ``benchmarks/``, for a checkout whose package the current helpers no longer fit)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = tree / "benchmarks" / Path(__file__).name if own_harness else Path(__file__)
    out = subprocess.run(
        [sys.executable, str(script), "--worker", workload, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree} {workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts: before, after")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="append rows to this JSON-lines file")
    parser.add_argument(
        "--own-harness",
        action="store_true",
        help="run each checkout's own benchmarks/sampling_ab.py (its package's names)",
    )
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.seconds)), flush=True)
        return
    if len(args.trees) != 2:
        parser.error(f"give two checkouts (before, after), got {len(args.trees)}")
    commits = {str(t): _commit(t) for t in args.trees}
    header = run_header(trees=commits, own_harness=args.own_harness)
    rows: list[dict[str, Any]] = [{"header": header}]
    print(json.dumps(rows[0]), flush=True)
    for round_ in range(args.rounds):
        for workload in args.workloads:
            for tree in args.trees:
                row = {
                    "round": round_,
                    "workload": workload,
                    "commit": commits[str(tree)],
                    **measure(tree, workload, args.seconds, args.own_harness),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        append_rows(args.json, rows)


if __name__ == "__main__":
    main()
