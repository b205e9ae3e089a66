"""Env steps to a mean return of 450 on CartPole-v1 with 2 learners, per gradient compressor.

Each run is ``rllib-ext train``'s PPO config (:func:`rllib_ext.cli.train.build_algo_config`,
its CartPole hyper-parameters) with ``num_learners=2`` (two Learner actors, DDP over gloo) and
``grad_compression`` = none / fp16 / bf16 / powersgd / onebit, same seeds for every compressor.
After every iteration the two learners' weights are compared (max abs difference, must be 0:
all ranks apply the same decoded gradient). Prints one row per run and a summary: mean env
steps to 450 per compressor and its ratio to uncompressed (target: <= 1.25).

Command (2-core machine; the lock keeps other CPU jobs from overlapping)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/comm_learning.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import time
from typing import Any

import numpy as np
import ray

from rllib_ext.cli.runconfig import resolve_settings
from rllib_ext.cli.train import build_algo_config, env_steps_of, episode_return_of

COMPRESSORS = ("none", "fp16", "bf16", "powersgd", "onebit")


@dataclasses.dataclass
class Run:
    compressor: str
    seed: int
    env_steps: int
    iterations: int
    seconds: float
    final_return: float
    reached: bool
    max_weight_diff: float
    compression_ratio: float | None


def _max_rank_diff(algo: Any) -> float:
    def flat(learner: Any) -> np.ndarray:
        state = learner.module._rl_modules["default_policy"].state_dict()
        return np.concatenate([v.detach().cpu().numpy().ravel() for v in state.values()])

    weights = [r.get() for r in algo.learner_group.foreach_learner(flat)]
    return float(max(np.abs(w - weights[0]).max() for w in weights[1:]))


def run_one(compressor: str, seed: int, *, stop_reward: float, max_env_steps: int) -> Run:
    values = {"num_learners": "2", "seed": str(seed), "checkpoint_freq": "0"}
    if compressor != "none":
        values["grad_compression"] = compressor
    settings = resolve_settings(values)
    config = build_algo_config(settings)
    started = time.perf_counter()
    algo = config.build_algo()
    max_diff, ratio = 0.0, None
    try:
        while True:
            result = algo.train()
            max_diff = max(max_diff, _max_rank_diff(algo))
            comm = result.get("learners", {}).get("default_policy", {})
            ratio = comm.get("rllib_ext/comm/compression_ratio", ratio)
            episode_return, steps = episode_return_of(result), env_steps_of(result)
            if episode_return >= stop_reward or steps >= max_env_steps:
                break
        seconds = time.perf_counter() - started
    finally:
        algo.stop()
    return Run(
        compressor,
        seed,
        steps,
        int(result["training_iteration"]),
        seconds,
        episode_return,
        episode_return >= stop_reward,
        max_diff,
        None if ratio is None else float(ratio),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--compressors", nargs="+", default=list(COMPRESSORS), choices=COMPRESSORS)
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument("--max-env-steps", type=int, default=200_000)
    parser.add_argument("--json", help="also write the runs here")
    args = parser.parse_args()
    logging.getLogger("rllib_ext").setLevel(logging.WARNING)

    ray.init(num_cpus=3, include_dashboard=False, logging_level=logging.WARNING)
    header = f"{'compressor':<10} {'seed':>4} {'env steps':>10} {'iters':>5} {'s':>7} "
    print(header + f"{'return':>7} {'reached':>7} {'rank diff':>9} {'bytes ratio':>11}")
    runs: list[Run] = []
    for seed in args.seeds:
        for compressor in args.compressors:
            run = run_one(
                compressor, seed, stop_reward=args.stop_reward, max_env_steps=args.max_env_steps
            )
            runs.append(run)
            ratio = "-" if run.compression_ratio is None else f"{run.compression_ratio:.1f}x"
            print(
                f"{run.compressor:<10} {run.seed:>4} {run.env_steps:>10,} {run.iterations:>5} "
                f"{run.seconds:>7.1f} {run.final_return:>7.1f} "
                f"{'yes' if run.reached else 'NO':>7} {run.max_weight_diff:>9.1e} {ratio:>11}",
                flush=True,
            )
    ray.shutdown()

    print("\n| compressor | runs reaching 450 | mean env steps to 450 | ratio vs none |")
    print("|---|---|---|---|")
    plain = [r.env_steps for r in runs if r.compressor == "none"]
    base = statistics.mean(plain) if plain else None
    for name in args.compressors:
        mine = [r for r in runs if r.compressor == name]
        mean = statistics.mean(r.env_steps for r in mine)
        reached = sum(r.reached for r in mine)
        ratio = f"{mean / base:.2f}x" if base else "-"
        print(f"| {name} | {reached}/{len(mine)} | {mean:,.0f} | {ratio} |")
    print(f"\nmax weight difference between ranks: {max(r.max_weight_diff for r in runs):.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in runs], f, indent=2)


if __name__ == "__main__":
    main()
