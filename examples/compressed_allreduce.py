"""Chapter 3 of the 2023 tutorial ("communication optimisation") on rllib_ext.

The tutorial's config dict has a ``communication`` block (``type: NCCL``, ``compression:
True``, ``grad_clip: 0.5``), ``use_kl_loss=True`` / ``kl_coeff=0.3``, a [256, 256] tanh MLP,
6 rollout workers and 2 GPUs, run with ``tune.run("PPO", ...)`` until
``episode_reward_mean`` 450. On RLlib's new API stack that becomes:

* ``communication={...}`` passed to ``rllib_ext.compat.PPOConfig.training()`` as written:
  ``compression: True`` means fp16 gradients on the wire, ``type`` is checked against the
  learners (RLlib picks NCCL on GPU learners, gloo on CPU; ``NCCL`` without GPU learners is an
  error: on a CPU machine use ``GLOO`` or ``AUTO``), ``grad_clip`` is RLlib's ``grad_clip``;
* the 2 GPUs as ``.learners(num_learners=2, num_gpus_per_learner=1)`` (2 CPU learners here);
  gradient compression only acts between learners, so ``num_learners >= 2``;
* ``--compression powersgd`` / ``onebit`` swap in the stronger compressors;
* ``tune.Tuner(rllib_ext.compat.PPO, ...)`` with the new stop key ``env_runners/episode_return_mean``.

    python examples/compressed_allreduce.py                       # CPU: gloo, fp16 wire
    python examples/compressed_allreduce.py --compression onebit --num-env-runners 2
    python examples/compressed_allreduce.py --num-gpus-per-learner 1 --backend NCCL   # 2 GPUs
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray
from ray import tune

from rllib_ext import compat  # the 2023 API: the tutorial's flags as written


def build_config(args: argparse.Namespace) -> compat.PPOConfig:
    communication = {"type": args.backend, "compression": True, "grad_clip": 0.5}
    config = (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.num_env_runners)
        .learners(num_learners=2, num_gpus_per_learner=args.num_gpus_per_learner)
        .training(
            communication=communication,  # the tutorial's block, unchanged
            use_kl_loss=True,
            kl_coeff=0.3,
            # rllib-ext train's CartPole settings (the tutorial left these to RLlib's defaults)
            lr=3e-4,
            train_batch_size=2000,
            minibatch_size=250,
            num_epochs=10,
            model={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
        )
        .debugging(seed=args.seed)
    )
    if args.compression != "fp16":
        config.training(grad_compression=args.compression)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compression", default="fp16", choices=["fp16", "bf16", "powersgd", "onebit"]
    )
    parser.add_argument("--backend", default="AUTO", choices=["AUTO", "GLOO", "NCCL"])
    parser.add_argument("--num-gpus-per-learner", type=float, default=0)
    parser.add_argument("--num-env-runners", type=int, default=0)
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument("--stop-iters", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--run-dir",
        default=f"rllib_ext_runs/compressed_allreduce_{time.strftime('%Y%m%d-%H%M%S')}",
        help="where the Tune experiment goes (default: rllib_ext_runs/compressed_allreduce_<time>)",
    )
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()

    # The trial needs 1 CPU for the algorithm, 1 per learner and 1 per EnvRunner; a laptop with
    # fewer cores still runs it (logical CPUs, oversubscribed).
    ray.init(num_cpus=max(os.cpu_count() or 1, 3 + args.num_env_runners), include_dashboard=False)
    tuner = tune.Tuner(
        compat.PPO,
        param_space=build_config(args),
        run_config=tune.RunConfig(
            stop={
                "env_runners/episode_return_mean": args.stop_reward,
                "training_iteration": args.stop_iters,
            },
            name=run_dir.name,
            storage_path=str(run_dir.parent),
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=10, checkpoint_at_end=True
            ),
            verbose=1,
        ),
    )
    best = tuner.fit().get_best_result(metric="env_runners/episode_return_mean", mode="max")
    learner = best.metrics["learners"]["default_policy"]
    print(
        f"return {best.metrics['env_runners']['episode_return_mean']:.1f} after "
        f"{best.metrics['num_env_steps_sampled_lifetime']:,} env steps; compression ratio "
        f"{learner.get('rllib_ext/comm/compression_ratio', float('nan')):.1f}x"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
