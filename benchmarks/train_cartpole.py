"""Time to a mean return of 450 on CartPole-v1: ``rllib-ext train`` vs stock RLlib PPO.

Command (2-core machine; the lock keeps other CPU jobs from overlapping)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/train_cartpole.py --repeats 3

Both runs use the same settings and seed, in one process on one Ray instance:

* rllib-ext: :func:`rllib_ext.cli.train.train`, the function behind ``rllib-ext train``, with
  its default settings (compiled GAE, CSV/TensorBoard writing, progress);
* stock: ``ray.rllib.algorithms.ppo.PPOConfig`` built by the same
  :func:`rllib_ext.cli.train.build_algo_config` (hence identical env runners, hyper-parameters
  and seed, RLlib's own learner and GAE) and a bare ``algo.train()`` loop.

Timed: from ``build_algo()`` to the end of the iteration whose
``env_runners/episode_return_mean`` reaches the target (Ray start-up and the final checkpoint
are outside). The two orders alternate across repeats (seed = --seed + repeat).

Measured on the 2-vCPU dev box (``--repeats 5``, seeds 0-4; every run reached 450):

* rllib-ext: 19.9 s mean (16.0-26.0 s), 18.6 iterations, 1.07 s/iteration;
* stock: 16.5 s mean (13.3-19.0 s), 17.0 iterations, 0.97 s/iteration;
* ratio rllib-ext / stock: 1.20 in time to 450 (0.92 in an earlier 3-seed run), 1.04-1.10 per
  iteration.

A later run (``--repeats 4``, quiet machine): rllib-ext 18.3 s vs stock 17.3 s to 450, ratio 1.06
in time and 1.03 per iteration (1.00 vs 0.97 s). With vectorized batching (``--repeats 4``,
quiet machine): rllib-ext 18.8 s vs stock 18.4 s, ratio 1.02 in time to 450 and 0.99 per
iteration (1.03 vs 1.04 s).

``--curves FILE.jsonl`` also writes one row per iteration and run (``run``, ``seed``,
``env_steps``, ``episode_return_mean``, ``wall_s`` = Tune's ``time_total_s``) for
``benchmarks/plot_curves.py``::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/train_cartpole.py --repeats 2 \
        --curves benchmarks/results/cartpole/cartpole_curves.jsonl
    .venv/bin/python benchmarks/plot_curves.py benchmarks/results/cartpole/cartpole_curves.jsonl \
        --out benchmarks/results/cartpole/cartpole_curves.png --hline 450

Each path is deterministic per seed, and with ``--gae rllib`` the rllib-ext path reproduces the
stock run exactly (seed 0: 20 iterations, 40,068 env steps, in 19.5 s against 18.8 s). With the
compiled GAE the float32 rounding differs (about 1e-6), trajectories diverge after a few
iterations, and the number of iterations to 450 (14-24 here) dominates the time ratio; compare
seconds per iteration for the cost of the CLI path itself.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import ray
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

from rllib_ext.cli.options import DEFAULT_TRAINING
from rllib_ext.cli.runconfig import TrainSettings, resolve_settings
from rllib_ext.cli.train import (
    build_algo_config,
    env_steps_of,
    episode_return_of,
    ray_init_kwargs,
    train,
)


@dataclasses.dataclass
class Run:
    name: str
    seed: int
    seconds: float
    env_steps: int
    iterations: int
    final_return: float
    reached: bool
    curve: list[dict[str, float]] = dataclasses.field(default_factory=list)


def _curve_row(env_steps: float, episode_return: float, wall_s: float) -> dict[str, float]:
    return {
        "env_steps": int(env_steps),
        "episode_return_mean": round(float(episode_return), 2),
        "wall_s": round(float(wall_s), 2),
    }


def _curve_of_run_dir(run_dir: Path) -> list[dict[str, float]]:
    """Rows of the run's ``progress.csv`` (Tune's layout, written by ``rllib-ext train``)."""
    with (run_dir / "progress.csv").open(newline="") as f:
        return [
            _curve_row(
                float(row["num_env_steps_sampled_lifetime"]),
                float(row["env_runners/episode_return_mean"] or "nan"),
                float(row["time_total_s"]),
            )
            for row in csv.DictReader(f)
        ]


def run_rllib_ext(settings: TrainSettings, run_dir: Path) -> Run:
    result = train(dataclasses.replace(settings, run_dir=str(run_dir)), progress=False)
    return Run(
        "rllib-ext",
        settings.seed,
        result.train_time_s,
        result.env_steps,
        result.iterations,
        result.episode_return_mean,
        result.stop_reason == "stop_reward",
        _curve_of_run_dir(run_dir),
    )


def run_stock(settings: TrainSettings, max_env_steps: int) -> Run:
    config = build_algo_config(settings, config_cls=StockPPOConfig)
    started = time.perf_counter()
    algo = config.build_algo()
    curve = []
    try:
        while True:
            result = algo.train()
            episode_return, steps = episode_return_of(result), env_steps_of(result)
            curve.append(_curve_row(steps, episode_return, result["time_total_s"]))
            if episode_return >= settings.stop_reward or steps >= max_env_steps:
                break
        seconds = time.perf_counter() - started
    finally:
        algo.stop()
    return Run(
        "stock",
        settings.seed,
        seconds,
        steps,
        int(result["training_iteration"]),
        episode_return,
        episode_return >= settings.stop_reward,
        curve,
    )


def _row(run: Run) -> str:
    return (
        f"{run.name:<10} {run.seed:>5} {run.seconds:>9.1f} {run.env_steps:>10,} "
        f"{run.iterations:>6} {run.seconds / max(run.iterations, 1):>7.2f} "
        f"{run.final_return:>8.1f} {'yes' if run.reached else 'NO':>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument(
        "--max-env-steps", type=int, default=400_000, help="give up a run after this many steps"
    )
    parser.add_argument(
        "--curves",
        type=Path,
        default=None,
        metavar="FILE",
        help="write per-iteration rows (JSON lines) for benchmarks/plot_curves.py",
    )
    args = parser.parse_args()
    logging.getLogger("rllib_ext.cli").setLevel(logging.WARNING)

    base = resolve_settings(
        {
            "stop_reward": str(args.stop_reward),
            "stop_timesteps": str(args.max_env_steps),
            "checkpoint_freq": "0",
            "gae": "compiled",
        }
    )
    ray.init(**ray_init_kwargs(base))
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench_cartpole_") as tmp:
        for repeat in range(args.repeats):
            settings = dataclasses.replace(base, seed=args.seed + repeat)
            order = ("rllib-ext", "stock") if repeat % 2 == 0 else ("stock", "rllib-ext")
            for name in order:
                if name == "rllib-ext":
                    run = run_rllib_ext(settings, Path(tmp) / f"run{repeat}")
                else:
                    run = run_stock(settings, args.max_env_steps)
                runs.append(run)
                print(_row(run), flush=True)
    ray.shutdown()
    if args.curves is not None:
        args.curves.parent.mkdir(parents=True, exist_ok=True)
        with args.curves.open("w") as f:
            for run in runs:
                for row in run.curve:
                    f.write(json.dumps({"run": run.name, "seed": run.seed, **row}) + "\n")
        print(f"curves: {args.curves}")

    print()
    print(
        f"{'':<10} {'seed':>5} {'seconds':>9} {'env steps':>10} {'iters':>6} {'return':>8} "
        f"{'reached':>8}"
    )
    for run in runs:
        print(_row(run))
    means = {}
    for name in ("rllib-ext", "stock"):
        mine = [r for r in runs if r.name == name]
        seconds = statistics.mean(r.seconds for r in mine)
        steps = statistics.mean(r.env_steps for r in mine)
        iters = statistics.mean(r.iterations for r in mine)
        per_iter = sum(r.seconds for r in mine) / sum(r.iterations for r in mine)
        means[name] = (seconds, per_iter)
        print(
            f"mean {name:<9}: {seconds:6.1f} s to {args.stop_reward:g}  {steps:9,.0f} env steps  "
            f"{iters:5.1f} iterations  {per_iter:.2f} s/iteration"
        )
    time_ratio = means["rllib-ext"][0] / means["stock"][0]
    iteration_ratio = means["rllib-ext"][1] / means["stock"][1]
    print(
        f"ratio rllib-ext / stock: time to {args.stop_reward:g} {time_ratio:.2f}, "
        f"time per iteration {iteration_ratio:.2f}"
    )
    print(
        f"settings: num_env_runners={base.num_env_runners}, "
        f"num_envs_per_env_runner={base.num_envs_per_env_runner}, PPO {DEFAULT_TRAINING}"
    )


if __name__ == "__main__":
    main()
