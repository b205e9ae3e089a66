"""Chapter 2 of the 2023 RLlib tutorial, PPO on CartPole-v1, on rllib_ext and Ray 2.58.

Run (about 1-3 minutes on a 2-core laptop)::

    python examples/cartpole_ppo.py
    python examples/cartpole_ppo.py --num-env-runners 2 --stop-reward 200   # quicker look

Flags share ``rllib-ext train``'s names (``--num-env-runners``, ``--stop-reward``, ``--run-dir``);
the Tune experiment goes to ``--run-dir`` (default ``rllib_ext_runs/cartpole_ppo_<time>``), not
``~/ray_results``.

The tutorial's settings are kept (torch, gamma=0.99, lr=3e-4, the rest PPO's defaults); only
the names changed. Old (2023, Ray 2.x old API stack) -> new (Ray 2.58 new API stack):

* ``.rollouts(num_rollout_workers=6)`` -> ``.env_runners(num_env_runners=N)`` (the old call
  now raises ValueError);
* ``.resources(num_gpus=2)`` -> ``.learners(num_learners=K, num_gpus_per_learner=1)``
  (RLlib's new stack stores ``num_gpus`` and ignores it; ``rllib_ext.PPOConfig`` refuses it, and
  ``rllib_ext.compat.PPOConfig`` maps it);
* ``.framework("torch")`` -> torch is the only framework of the new stack; the call is harmless;
* ``stop={"episode_reward_mean": 450}`` -> ``stop={"env_runners/episode_return_mean": 450}``
  (the old key no longer exists, and Tune would only warn and never stop);
* ``tune.run("PPO", config=config.to_dict())`` -> ``tune.Tuner(rllib_ext.PPO,
  param_space=config).fit()`` (pass the class: it keeps rllib_ext's learner through Tune's
  dict round-trip, and string names also import DreamerV3's PIL dependency);
* ``result["episode_reward_mean"]`` -> ``result.metrics["env_runners"]["episode_return_mean"]``.

``rllib-ext train`` runs the same job without Tune and with faster CartPole defaults.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ray
from ray import tune

import rllib_ext

RETURN_METRIC = "env_runners/episode_return_mean"  # was "episode_reward_mean"


def build_config(num_env_runners: int, num_gpus: int) -> rllib_ext.PPOConfig:
    return (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        # The tutorial used 6 rollout workers; a laptop has a few cores, and under Tune each
        # EnvRunner takes one CPU next to the trainable's own, so one or two fit.
        .env_runners(num_env_runners=num_env_runners)
        # The tutorial's `.resources(num_gpus=2)`: here one learner per GPU (none on a laptop:
        # num_learners=0 keeps one learner inside the trainable's process).
        .learners(num_learners=num_gpus, num_gpus_per_learner=1 if num_gpus else 0)
        .training(gamma=0.99, lr=3e-4)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-env-runners", type=int, default=1)
    parser.add_argument("--num-gpus", type=int, default=0, help="the tutorial used 2")
    parser.add_argument("--stop-reward", type=float, default=450.0)
    parser.add_argument(
        "--run-dir",
        default=f"rllib_ext_runs/cartpole_ppo_{time.strftime('%Y%m%d-%H%M%S')}",
        help="where the Tune experiment goes (default: rllib_ext_runs/cartpole_ppo_<time>)",
    )
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()

    config = build_config(args.num_env_runners, args.num_gpus)
    ray.init(include_dashboard=False)
    tuner = tune.Tuner(
        rllib_ext.PPO,  # was tune.run("PPO", ...)
        param_space=config,
        run_config=tune.RunConfig(
            name=run_dir.name,
            storage_path=str(run_dir.parent),
            stop={RETURN_METRIC: args.stop_reward},  # was {"episode_reward_mean": 450}
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=10, checkpoint_at_end=True
            ),
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(metric=RETURN_METRIC, mode="max")
    print(
        f"mean return {best.metrics['env_runners']['episode_return_mean']:.1f} after "
        f"{best.metrics['training_iteration']} iterations; checkpoint: {best.checkpoint}"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
