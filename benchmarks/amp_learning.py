"""Does AMP learn as well as fp32? PPO CartPole-v1 to a mean return of 450 in fp32, fp16, bf16.

Same config and seed for every mode; prints env steps and wall time to reach the target and
the env-step ratio against fp32 (the test `tests/learners/test_amp_learning.py` asserts
ratio <= 1.25 with the same loop, `rllib_ext.testing.learning.steps_to_return`).

    python benchmarks/amp_learning.py                       # all three modes, MLP [64, 64]
    python benchmarks/amp_learning.py --modes fp32,bf16 --seed 1

On a CPU without native bf16/fp16 the AMP modes run emulated and take several times longer in
wall time; env steps are what this compares.
"""

from __future__ import annotations

import argparse

import ray

import rllib_ext
from rllib_ext.testing.learning import steps_to_return

HIDDEN = [64, 64]


def amp_config(mode: str, *, seed: int = 0):
    """The PPO CartPole-v1 config every mode shares; ``mode`` is "fp32", "fp16" or "bf16"."""
    return (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .rl_module(model_config={"fcnet_hiddens": HIDDEN})
        .training(amp=False if mode == "fp32" else mode)
        .debugging(seed=seed)
    )


def steps_to_reward(
    mode: str, *, seed: int = 0, target: float = 450.0, max_steps: int = 200_000
) -> dict:
    """Trains until ``env_runners/episode_return_mean >= target``; returns steps and seconds."""
    report = steps_to_return(amp_config(mode, seed=seed), target=target, max_env_steps=max_steps)
    learner = report.learners.get("default_policy", {})
    return {
        "mode": mode,
        "reached": report.reached,
        "return": report.episode_return,
        "env_steps": report.env_steps,
        "wall_s": report.wall_s,
        "dtype": learner.get("rllib_ext/amp/dtype", "float32"),
        "skipped_steps": learner.get("rllib_ext/amp/skipped_steps_lifetime", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fp32,fp16,bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=450.0)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"# PPO CartPole-v1, MLP {HIDDEN}, seed {args.seed}, target {args.target}")
    print(f"{'mode':5} {'dtype':9} {'reached':7} {'env steps':>10} {'x fp32':>7} {'wall s':>7}")
    base = None
    for mode in args.modes.split(","):
        r = steps_to_reward(mode, seed=args.seed, target=args.target)
        base = base or r
        print(
            f"{r['mode']:5} {r['dtype']:9} {r['reached']!s:7} {r['env_steps']:10d} "
            f"{r['env_steps'] / base['env_steps']:7.2f} {r['wall_s']:7.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
