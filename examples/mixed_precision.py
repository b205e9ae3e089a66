"""Chapter 4 of the 2023 tutorial ("mixed-precision training") on rllib_ext.

The tutorial builds a ``GradScaler(init_scale=1024, growth_factor=2, backoff_factor=0.5,
growth_interval=200)`` and a hand-written ``CustomTrainer`` with autocast, ``unscale_`` before
``clip_grad_norm_(max_norm=0.5)``, ``scaler.step`` and ``scaler.update``. With rllib_ext those
are flags: the learner does exactly those steps inside RLlib's PPO update (one scaler per
module, inf/nan steps skipped, scaler state in checkpoints). The tutorial's ``fp16=True`` and
``fp16_loss_scaling=1024.0`` are accepted as they were written by ``rllib_ext.compat.PPOConfig``
(``rllib_ext.PPOConfig`` takes the new names, ``amp="fp16"``, ``amp_init_scale=1024.0``).

    python examples/mixed_precision.py                 # fp16 on a GPU, otherwise 'auto'
    python examples/mixed_precision.py --amp bf16 --stop-reward 150

On a CPU without native bf16/fp16 (AVX2 only) autocast is emulated and much slower than fp32;
``amp="auto"`` then stays in fp32. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ray
import torch
from ray import tune

from rllib_ext import compat  # the 2023 API: the tutorial's flags as written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--amp", default=None, help="fp16 | bf16 | auto (default: tutorial's fp16 on GPU)"
    )
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument("--stop-timesteps", type=int, default=200_000)
    parser.add_argument(
        "--run-dir",
        default=f"rllib_ext_runs/mixed_precision_{time.strftime('%Y%m%d-%H%M%S')}",
        help="where the Tune experiment goes (default: rllib_ext_runs/mixed_precision_<time>)",
    )
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()

    on_gpu = torch.cuda.is_available()
    config = (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        # Tutorial: .resources(num_gpus=1). The new API stack places the learner instead:
        .learners(num_learners=0, num_gpus_per_learner=1 if on_gpu else 0)
        .env_runners(num_env_runners=1)
        .training(
            # The tutorial's mixed-precision switches, unchanged:
            fp16=True,
            fp16_loss_scaling=1024.0,
            lr=3e-4,
            clip_param=0.2,
            gamma=0.99,
            kl_coeff=0.3,
            grad_clip=0.5,  # the tutorial's clip_grad_norm_(max_norm=0.5), applied after unscale_
            model={"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"},
        )
    )
    if args.amp is not None or not on_gpu:
        # fp16 autocast on a CPU is emulated; 'auto' picks bf16 only where the CPU has it.
        config.training(amp=args.amp or "auto")

    ray.init(ignore_reinit_error=True)
    tuner = tune.Tuner(
        compat.PPO,  # keeps the extension and the 2023 API through Tune
        param_space=config,
        run_config=tune.RunConfig(
            name=run_dir.name,
            storage_path=str(run_dir.parent),
            stop={
                "env_runners/episode_return_mean": args.stop_reward,
                "num_env_steps_sampled_lifetime": args.stop_timesteps,
            },
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=10, checkpoint_at_end=True
            ),
            verbose=1,
        ),
    )
    result = tuner.fit().get_best_result(metric="env_runners/episode_return_mean", mode="max")
    learner = result.metrics["learners"]["default_policy"]
    print(
        f"return {result.metrics['env_runners']['episode_return_mean']:.1f}; "
        f"amp/dtype={learner.get('rllib_ext/amp/dtype', 'float32')} "
        f"loss_scale={learner.get('rllib_ext/amp/loss_scale', '-')} "
        f"skipped_steps={learner.get('rllib_ext/amp/skipped_steps_lifetime', '-')}"
    )


if __name__ == "__main__":
    main()
