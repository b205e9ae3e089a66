"""Single-agent PPO throughput: stock RLlib, rllib-ext and Stable-Baselines3, configured alike.

Command (2-core machine; run alone, under the lock)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/ppo_throughput.py \\
        --json benchmarks/results/ppo_throughput/ppo_throughput.jsonl

Needs the ``bench`` extra (``pip install -c constraints.txt -e ".[bench]"``: Stable-Baselines3
and gymnasium's MuJoCo envs). Per env (CartPole-v1, Acrobot-v1, HalfCheetah-v5) and framework, one
process, one Ray instance, the same PPO settings: 8 envs x 250 steps = 2,000 env steps per
iteration, 10 epochs of 250-row minibatches, separate [256, 256] tanh actor and critic, Adam
lr 3e-4, gamma 0.99, lambda 0.95, clip 0.2, value coefficient 0.5, gradient-norm clip 0.5, no KL
term, no entropy bonus, local sampling (``num_env_runners=0``, what ``rllib-ext train`` does).

* **end to end**: env steps per second over ``--iters`` iterations after one warm-up iteration
  (RLlib: ``algo.train()``; SB3: ``learn()``); RLlib rows also give the warm-up iteration's
  seconds (``first_iter_s``: build-time work and, for ``rllib-ext-compiled``
  (``compile_update=True``), the compile);
* **sampling alone**: env steps per second of the sampling part: RLlib's env runner
  ``sample(num_timesteps=2000)`` calls, SB3's ``collect_rollouts`` (its ``learn`` minus ``train``).
* ``--to-450 SEEDS``: CartPole-v1 wall time and env steps until the mean return of the last
  episodes reaches 450 (RLlib: ``env_runners/episode_return_mean``, 100-episode window; SB3: its
  100-episode ``ep_info_buffer``), per seed, all three, stopping at ``--max-steps``.

Each measurement runs in a fresh process, so each framework gets its own thread defaults
(rllib-ext: one torch thread, set by its learner, ``cpu_threads`` auto; the others: torch's
default, one per core; every row records ``OMP_WAIT_POLICY`` as the environment had it). Rows: one
JSON line per measurement after a header row (command, commit, machine, versions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from run_header import append_rows, run_header

FRAMEWORKS = ("stock", "rllib-ext", "rllib-ext-compiled", "sb3")
ENVS = ("CartPole-v1", "Acrobot-v1", "HalfCheetah-v5")
NUM_ENVS, STEPS_PER_ENV = 8, 250
BATCH = NUM_ENVS * STEPS_PER_ENV
PPO = dict(lr=3e-4, gamma=0.99, lambda_=0.95, clip=0.2, vf_coeff=0.5, max_grad_norm=0.5)
EPOCHS, MINIBATCH = 10, 250


def _rllib_config(framework: str, env: str, seed: int) -> Any:
    if framework.startswith("rllib-ext"):
        from rllib_ext import PPOConfig

        ext = {"compile_update": framework == "rllib-ext-compiled"}
    else:
        from ray.rllib.algorithms.ppo import PPOConfig

        ext = {}
    return (
        PPOConfig()
        .environment(env)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=NUM_ENVS,
            rollout_fragment_length=STEPS_PER_ENV,
        )
        .training(
            lr=PPO["lr"],
            gamma=PPO["gamma"],
            lambda_=PPO["lambda_"],
            clip_param=PPO["clip"],
            vf_loss_coeff=PPO["vf_coeff"],
            grad_clip=PPO["max_grad_norm"],
            use_kl_loss=False,
            entropy_coeff=0.0,
            train_batch_size=BATCH,
            minibatch_size=MINIBATCH,
            num_epochs=EPOCHS,
            **ext,
        )
        .rl_module(model_config={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"})
        .debugging(seed=seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=100)
    )


def _sb3_model(env: str, seed: int) -> Any:
    import torch
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    class TimedPPO(SB3PPO):
        """Stable-Baselines3's PPO, timing its ``train()`` (the rest of ``learn`` samples)."""

        train_seconds = 0.0

        def train(self) -> None:
            start = time.perf_counter()
            super().train()
            self.train_seconds += time.perf_counter() - start

    return TimedPPO(
        "MlpPolicy",
        make_vec_env(env, n_envs=NUM_ENVS, seed=seed),
        learning_rate=PPO["lr"],
        n_steps=STEPS_PER_ENV,
        batch_size=MINIBATCH,
        n_epochs=EPOCHS,
        gamma=PPO["gamma"],
        gae_lambda=PPO["lambda_"],
        clip_range=PPO["clip"],
        vf_coef=PPO["vf_coeff"],
        ent_coef=0.0,
        max_grad_norm=PPO["max_grad_norm"],
        policy_kwargs=dict(
            net_arch=dict(pi=[256, 256], vf=[256, 256]), activation_fn=torch.nn.Tanh
        ),
        seed=seed,
        device="cpu",
        verbose=0,
    )


def throughput(framework: str, env: str, iters: int) -> dict[str, Any]:
    """End-to-end and sampling-alone env steps per second (see the module docstring)."""
    if framework == "sb3":
        model = _sb3_model(env, seed=0)
        model.learn(BATCH)  # warm-up iteration
        model.train_seconds = 0.0
        start = time.perf_counter()
        model.learn(BATCH * iters, reset_num_timesteps=False)
        total = time.perf_counter() - start
        sampling = total - model.train_seconds
        return dict(end_to_end=BATCH * iters / total, sampling=BATCH * iters / sampling)
    algo = _rllib_config(framework, env, seed=0).build_algo()
    try:
        start = time.perf_counter()
        warm_up = algo.train()
        first_iter_s = time.perf_counter() - start
        steps0 = warm_up["env_runners"]["num_env_steps_sampled_lifetime"]
        start = time.perf_counter()
        for _ in range(iters):
            result = algo.train()
        total = time.perf_counter() - start
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"] - steps0
        runner = algo.env_runner
        fused = result["env_runners"].get("rllib_ext/fused_sampling")
        start = time.perf_counter()
        sampled = sum(sum(len(e) for e in runner.sample(num_timesteps=BATCH)) for _ in range(iters))
        sampling = time.perf_counter() - start
        return dict(
            end_to_end=steps / total,
            sampling=sampled / sampling,
            fused_sampling=fused,
            first_iter_s=first_iter_s,
        )
    finally:
        algo.stop()


def to_450(framework: str, seed: int, max_steps: int) -> dict[str, Any]:
    """Wall time and env steps until CartPole-v1's mean return reaches 450."""
    start = time.perf_counter()
    if framework == "sb3":
        import numpy as np

        model = _sb3_model("CartPole-v1", seed=seed)
        steps = 0
        while steps < max_steps:
            model.learn(BATCH, reset_num_timesteps=False)
            steps = model.num_timesteps
            returns = [info["r"] for info in model.ep_info_buffer]
            if returns and float(np.mean(returns)) >= 450:
                return dict(reached=True, env_steps=steps, seconds=time.perf_counter() - start)
        return dict(reached=False, env_steps=steps, seconds=time.perf_counter() - start)
    algo = _rllib_config(framework, "CartPole-v1", seed=seed).build_algo()
    try:
        steps = 0
        while steps < max_steps:
            result = algo.train()
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            if result["env_runners"].get("episode_return_mean", 0.0) >= 450:
                return dict(reached=True, env_steps=steps, seconds=time.perf_counter() - start)
        return dict(reached=False, env_steps=steps, seconds=time.perf_counter() - start)
    finally:
        algo.stop()


def _header(args: argparse.Namespace) -> dict[str, Any]:
    import gymnasium
    import ray
    import stable_baselines3
    import torch

    versions = {
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "gymnasium": gymnasium.__version__,
        "stable_baselines3": stable_baselines3.__version__,
    }
    settings = {"batch": BATCH, "epochs": EPOCHS, "minibatch": MINIBATCH, **PPO}
    return run_header(versions=versions, settings=settings)


def _worker(task: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this (fresh) process: rllib-ext is imported first for its own rows
    (as a user's script would), never for the others."""
    if task["framework"].startswith("rllib-ext"):
        import rllib_ext  # noqa: F401
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        if task["kind"] == "throughput":
            return throughput(task["framework"], task["env"], task["iters"])
        return to_450(task["framework"], task["seed"], task["max_steps"])
    finally:
        ray.shutdown()


def _in_fresh_process(task: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(task)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        **{k: v for k, v in task.items() if k != "kind"},
        **result,
        "omp_wait_policy": result.get("omp_wait_policy"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per row")
    parser.add_argument("--to-450", type=int, nargs="*", default=[0, 1, 2, 3], metavar="SEED")
    parser.add_argument("--max-steps", type=int, default=200_000)
    parser.add_argument("--json", type=Path, help="append rows to this JSON-lines file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = _worker(json.loads(args.worker))
        result["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
        print(json.dumps(result), flush=True)
        return

    rows: list[dict[str, Any]] = [{"header": _header(args)}]
    print(json.dumps(rows[0]), flush=True)
    tasks = [
        {"kind": "throughput", "env": env, "framework": fw, "iters": args.iters}
        for env in args.envs
        for fw in args.frameworks
    ]
    tasks += [
        {
            "kind": "to_450",
            "env": "CartPole-v1",
            "framework": fw,
            "seed": seed,
            "max_steps": args.max_steps,
        }
        for seed in args.to_450
        for fw in args.frameworks
    ]
    for task in tasks:
        row = _in_fresh_process(task)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        append_rows(args.json, rows)


if __name__ == "__main__":
    main()
