"""The tutorial's chapter 5 (SMAC 3s5z_vs_3s6z, one shared policy) on rllib_ext.

The config is the tutorial's, on RLlib's new API stack:

* ``.environment("smac_v2", env_config={"map_name": "3s5z_vs_3s6z"})``: StarCraft II through
  SMACv2 when it is installed (SC2PATH, maps, ``pip install git+https://github.com/oxwhirl/smacv2.git``),
  otherwise JaxMARL's SMAX (``pip install "rllib-ext[smax]"``); ``--backend`` forces one;
* one policy shared by all 8 agents, action-masked, optionally with a central critic on the
  global state (``--central-critic``, MAPPO-style);
* ``num_epochs=5`` (the tutorial's ``num_sgd_iter``), ``kl_coeff=0.5``, ``lambda_=0.95``;
* mixed precision (the tutorial's ``fp16=True``) as ``amp="fp16"``, only when a GPU is present.

Defaults are laptop-sized (local env runner, small batches, 2 iterations). The tutorial's cluster
run: ``--num-env-runners 24 --num-learners 4 --num-gpus-per-learner 1 --train-batch-size 4000
--iterations 1000`` after ``ray.init(address="auto")`` (``--address auto``).

Run: ``python examples/smac_3s5z_vs_3s6z.py [--backend smax] [--iterations 2]``. Flags share
``rllib-ext train``'s names where they mean the same (``--num-env-runners``, ``--num-learners``,
``--num-gpus-per-learner``, ``--stop-win-rate``, ``--address``, ``--seed``, ``--run-dir``); the
results (``result.json``, one line per iteration, and the final ``checkpoint``) go to ``--run-dir`` (default
``rllib_ext_runs/smac_3s5z_vs_3s6z_<time>``), not ``~/ray_results``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import ray
import torch
from ray.train.constants import DEFAULT_STORAGE_PATH

import rllib_ext


def build_config(args: argparse.Namespace) -> rllib_ext.PPOConfig:
    gpu = torch.cuda.is_available() and args.num_gpus_per_learner > 0
    training = {
        "num_epochs": 5,
        "kl_coeff": 0.5,
        "lambda_": 0.95,
        "train_batch_size_per_learner": args.train_batch_size,
        "minibatch_size": args.minibatch_size,
        "lr": args.lr,
    }
    if gpu:
        training["amp"] = "fp16"  # the tutorial's fp16=True; CPUs train in fp32
    # rllib_ext.PPOConfig sees a SMAC env and adds what the tutorial wrote by hand: one
    # "shared_policy" for all agents, the action-masked module (central critic from
    # model_config) and SMACMetricsCallback (env_runners/rllib_ext/win_rate). Explicit settings win.
    return (
        rllib_ext.PPOConfig()
        .environment(
            "smac_v2",
            env_config={"map_name": args.map_name, "backend": args.backend, "seed": args.seed},
        )
        .rl_module(
            model_config={"fcnet_hiddens": [256, 256], "central_critic": args.central_critic}
        )
        .training(**training)
        .env_runners(num_env_runners=args.num_env_runners)
        .learners(
            num_learners=args.num_learners,
            num_gpus_per_learner=args.num_gpus_per_learner if gpu else 0,
        )
        .debugging(seed=args.seed)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--map-name", default="3s5z_vs_3s6z")
    parser.add_argument("--backend", default="auto", choices=["auto", "smacv2", "smac", "smax"])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--train-batch-size", type=int, default=1000, help="env steps/iter")
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--central-critic", action="store_true")
    parser.add_argument("--num-env-runners", type=int, default=0)
    parser.add_argument("--num-learners", type=int, default=0)
    parser.add_argument("--num-gpus-per-learner", type=float, default=1.0, help="used if CUDA")
    parser.add_argument("--stop-win-rate", type=float, default=None)
    parser.add_argument("--address", default=None, help='"auto" joins a running Ray cluster')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--run-dir",
        default=f"rllib_ext_runs/smac_3s5z_vs_3s6z_{time.strftime('%Y%m%d-%H%M%S')}",
        help="results directory (default: rllib_ext_runs/smac_3s5z_vs_3s6z_<time>)",
    )
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()

    ray.init(address=args.address, include_dashboard=False)
    algo = build_config(args).build_algo()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"backend: {algo.env_runner.env.envs[0].unwrapped.env_info['backend']}"
        if args.num_env_runners == 0
        else "backend: see env runner logs"
    )
    start = time.perf_counter()
    try:
        for iteration in range(1, args.iterations + 1):
            result = algo.train()
            runners = result["env_runners"]
            with (run_dir / "result.json").open("a") as f:  # one line per iteration, as Tune's
                f.write(json.dumps(result, default=str) + "\n")
            print(
                f"iter {iteration:4d}  env steps {result['num_env_steps_sampled_lifetime']:>8}  "
                f"win_rate {runners.get('rllib_ext/win_rate', float('nan')):.3f}  "
                f"return {runners.get('episode_return_mean', float('nan')):7.3f}  "
                f"dead enemies {runners.get('rllib_ext/dead_enemies', float('nan')):.2f}  "
                f"{time.perf_counter() - start:7.1f}s"
            )
            if (
                args.stop_win_rate is not None
                and runners.get("rllib_ext/win_rate", 0.0) >= args.stop_win_rate
            ):
                break
        print(f"checkpoint: {algo.save_to_path(str(run_dir / 'checkpoint'))}")
    finally:
        logdir = Path(algo.logdir)
        algo.stop()
        ray.shutdown()
        # Outside Tune every Algorithm makes an empty ~/ray_results/<date> directory.
        if logdir.parent == Path(DEFAULT_STORAGE_PATH):
            with contextlib.suppress(OSError):
                logdir.rmdir()


if __name__ == "__main__":
    main()
