"""SMAX benchmarks for the SMAC env: learning curves with shared-policy PPO, and env throughput.

Not part of CI (minutes of CPU). Two parts:

``learn``: shared-policy PPO (rllib_ext.PPOConfig, action-masked module, optional central critic)
on SMAX maps. Prints one line per iteration (env steps, wall time, ``env_runners/rllib_ext/win_rate`` over
the last 100 training episodes of the stochastic policy, and every ``--eval-every`` iterations
the greedy win rate over 100 fresh episodes, SMAC's usual "test win rate"), then a final greedy
evaluation over ``--eval-episodes``. Stops when the greedy win rate reaches
``--target-win-rate`` (3m: 0.9) or at the step / time budget.

``throughput``: env steps per second, one env, random legal actions chosen the same way (numpy,
from the mask) in every loop:

* ``jaxmarl``: JaxMARL as its README uses it: jitted ``env.step`` (auto-reset) and
  ``env.get_avail_actions`` per step, actions as a dict;
* ``jaxmarl-fused``: a hand-fused direct loop (one jitted function: ``step_env`` + masks +
  stacking, one device->host copy), the fastest direct use we could write;
* ``wrapper``: ``rllib_ext.envs.smac.SMACEnv.step`` with per-agent dicts, as RLlib calls it.

Ratio = direct steps/s / wrapper steps/s (target <= 1.3 against ``jaxmarl-fused``).

Run (2-core machine: serialise CPU-heavy jobs)::

    flock /tmp/cpu.lock python benchmarks/smax_learning.py throughput
    flock /tmp/cpu.lock python benchmarks/smax_learning.py learn --map 3m --max-env-steps 400000

The 3m runs quoted in benchmarks/README.md (seeds 0 and 1) used::

    python benchmarks/smax_learning.py learn --map 3m --central-critic --num-env-runners 2 \
        --train-batch-size 8000 --minibatch-size 2000 --num-epochs 10 --hiddens 256 256 \
        --entropy-coeff 0.0 --lr 5e-4 --lr-end 5e-5 --lr-decay-steps 800000 --grad-clip 1.0 \
        --max-env-steps 1000000 --max-wall-s 2700 --eval-every 5 --eval-episodes-periodic 200 \
        --eval-episodes 500 --seed 0 \
        --smax-options '{"see_enemy_actions": true, "walls_cause_death": true}'

(seed 1: ``--seed 1 --keep-going``, the full 1M-step budget), and the 2s3z curve ``--map 2s3z --keep-going --max-wall-s 900`` with entropy 0.01, lr 5e-4 ->
1e-4 over 1M steps and no gradient clipping (the settings of the earlier 3m runs).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def _legal(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.argmax(rng.random(mask.shape) * (mask > 0), axis=-1)


# ----------------------------------------------------------------------------- throughput
# Each factory builds one env and returns `run(n)`, which takes n steps (compiled already).
def _jaxmarl_loop(map_name: str) -> Any:
    import jax
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario

    env = HeuristicEnemySMAX(scenario=map_name_to_scenario(map_name))
    agents = env.agents
    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    obs, state = env.reset(key)
    carry = [key, state, jax.device_get(env.get_avail_actions(state))]

    def run(n: int) -> None:
        key, state, avail = carry
        for _ in range(n):
            key, step_key = jax.random.split(key)
            mask = np.stack([avail[a] for a in agents])
            actions = dict(zip(agents, _legal(mask, rng), strict=True))
            obs, state, _, dones, _ = env.step(step_key, state, actions)  # auto-resets
            avail = jax.device_get(env.get_avail_actions(state))
            jax.device_get((obs, dones))  # a host-side RL loop needs these as numpy
        carry[:] = [key, state, avail]

    run(20)
    return run


def _fused_loop(map_name: str) -> Any:
    import jax
    import jax.numpy as jnp
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario

    env = HeuristicEnemySMAX(scenario=map_name_to_scenario(map_name))
    agents = env.agents
    n_agents, n_actions = len(agents), env.num_ally_actions

    @jax.jit
    def fused_reset(key: Any) -> tuple:
        obs, state = env.reset(key)
        avail = env.get_avail_actions(state)
        return state, jnp.stack([avail[a] for a in agents])

    @jax.jit
    def fused_step(key: Any, state: Any, actions: Any) -> tuple:
        key, step_key = jax.random.split(key)
        obs, state, rewards, dones, _ = env.step_env(
            step_key, state, {a: actions[i] for i, a in enumerate(agents)}
        )
        avail = env.get_avail_actions(state)
        host = jnp.concatenate(
            [
                jnp.stack([obs[a] for a in agents]).ravel(),
                obs["world_state"],
                jnp.stack([avail[a] for a in agents]).ravel().astype(jnp.float32),
                jnp.stack([rewards[agents[0]], dones["__all__"]]).astype(jnp.float32),
            ]
        )
        return key, state, host

    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    state, mask = fused_reset(key)
    avail_start = n_agents * env.obs_size + env.state_size
    avail_stop = avail_start + n_agents * n_actions
    carry = [key, state, np.asarray(mask)]

    def run(n: int) -> None:
        key, state, mask = carry
        for _ in range(n):
            key, state, host = fused_step(key, state, _legal(mask, rng).astype(np.int32))
            host = np.asarray(host)
            if host[-1] > 0:
                key, reset_key = jax.random.split(key)
                state, mask = fused_reset(reset_key)
                mask = np.asarray(mask)
            else:
                mask = host[avail_start:avail_stop].reshape(n_agents, n_actions)
        carry[:] = [key, state, mask]

    run(20)
    return run


def _wrapper_loop(map_name: str) -> Any:
    from rllib_ext.envs.smac import SMACEnv

    env = SMACEnv({"map_name": map_name, "backend": "smax", "seed": 0})
    agents = env.possible_agents
    rng = np.random.default_rng(0)
    carry = [env.reset()[0]]

    def run(n: int) -> None:
        obs = carry[0]
        for _ in range(n):
            mask = np.stack([obs[a]["action_mask"] for a in agents])
            obs, _, terminateds, truncateds, _ = env.step(
                dict(zip(agents, _legal(mask, rng), strict=True))
            )
            if terminateds["__all__"] or truncateds["__all__"]:
                obs, _ = env.reset()
        carry[0] = obs

    run(20)
    return run


def throughput(args: argparse.Namespace) -> None:
    """Median steps/s over ``--rounds`` interleaved windows (the machine is shared)."""
    for map_name in args.maps:
        loops = {
            "jaxmarl": _jaxmarl_loop(map_name),
            "jaxmarl-fused": _fused_loop(map_name),
            "wrapper": _wrapper_loop(map_name),
        }
        samples: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, run in loops.items():
                start = time.perf_counter()
                run(args.steps)
                samples[name].append(args.steps / (time.perf_counter() - start))
        rates = {name: float(np.median(values)) for name, values in samples.items()}
        row = {
            "map": map_name,
            **{f"{k}_steps_per_s": round(v, 1) for k, v in rates.items()},
            "overhead_vs_fused": round(rates["jaxmarl-fused"] / rates["wrapper"], 3),
            "overhead_vs_jaxmarl": round(rates["jaxmarl"] / rates["wrapper"], 3),
            "rounds": args.rounds,
            "steps_per_round": args.steps,
        }
        print(json.dumps(row), flush=True)


# ----------------------------------------------------------------------------- learning
def _config(args: argparse.Namespace) -> Any:
    import rllib_ext
    from rllib_ext.envs import register_envs
    from rllib_ext.envs.smac import SMACMetricsCallback
    from rllib_ext.modules import smac_module_spec

    register_envs()
    model = json.loads(args.model_options)
    return (
        rllib_ext.PPOConfig()
        .environment(
            "smax",
            env_config={
                "map_name": args.map,
                "seed": args.seed,
                "smax_options": json.loads(args.smax_options),
                **json.loads(args.env_options),
            },
        )
        .multi_agent(
            policies={"shared_policy"},
            policy_mapping_fn=lambda agent_id, *a, **kw: "shared_policy",
        )
        .rl_module(
            rl_module_spec=smac_module_spec(
                central_critic=args.central_critic, recurrent_cell=model.pop("recurrent_cell", None)
            ),
            model_config={"fcnet_hiddens": args.hiddens, "fcnet_activation": "relu", **model},
        )
        .callbacks(SMACMetricsCallback)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.envs_per_runner,
            # The first sample call compiles the jitted SMAX step; on a busy 2-core machine
            # that can exceed RLlib's 60 s default and return an empty iteration.
            sample_timeout_s=600.0,
        )
        .training(
            **{
                "train_batch_size_per_learner": args.train_batch_size,
                "minibatch_size": args.minibatch_size,
                "num_epochs": args.num_epochs,
                # Linear decay to --lr-end over --lr-decay-steps env steps (RLlib's [[t, lr], ...]).
                "lr": [[0, args.lr], [args.lr_decay_steps, args.lr_end]]
                if args.lr_end
                else args.lr,
                "gamma": 0.99,
                "lambda_": 0.95,
                "entropy_coeff": args.entropy_coeff,
                "vf_loss_coeff": 0.5,
                "clip_param": 0.2,
                "use_kl_loss": args.kl_coeff > 0,
                "kl_coeff": args.kl_coeff,
                "grad_clip": args.grad_clip,
                **json.loads(args.training_options),
            }
        )
        .debugging(seed=args.seed)
    )


def _greedy_win_rate(
    module: Any,
    map_name: str,
    episodes: int,
    seed: int,
    smax_options: dict | None = None,
    env_options: dict | None = None,
) -> tuple[float, int, float]:
    """Greedy (argmax) win rate over fresh episodes, the env steps the spy checked, and the share
    of episodes the time limit ended (neither side won)."""
    import torch
    from ray.rllib.core.columns import Columns

    from rllib_ext.envs.smac import SMACEnv
    from rllib_ext.testing import BackendSpy

    env = SMACEnv(
        {
            "map_name": map_name,
            "backend": "smax",
            "smax_options": smax_options or {},
            **(env_options or {}),
        }
    )
    # Raises if a masked action ever reaches SMAX (the wrapper itself also rejects them).
    spy = BackendSpy.install(env, record=False)
    agents = env.possible_agents
    # A recurrent module: one state row per agent, a time axis of 1, zeros at each reset.
    initial = {k: torch.as_tensor(v) for k, v in module.get_initial_state().items()}

    def fresh_state() -> dict[str, Any]:
        return {k: v.expand(len(agents), *v.shape).clone() for k, v in initial.items()}

    state = fresh_state()
    obs, _ = env.reset(seed=seed + 10_000)
    wins = done = timeouts = 0
    while done < episodes:
        batch: dict[str, Any] = {
            Columns.OBS: {
                key: torch.as_tensor(np.stack([obs[a][key] for a in agents]))
                for key in obs[agents[0]]
            }
        }
        if state:
            batch = {
                Columns.OBS: {k: v.unsqueeze(1) for k, v in batch[Columns.OBS].items()},
                Columns.STATE_IN: state,
            }
        with torch.no_grad():
            out = module.forward_inference(batch)
        logits = out[Columns.ACTION_DIST_INPUTS]
        if state:
            logits, state = logits[:, 0], out[Columns.STATE_OUT]
        actions = logits.argmax(-1).numpy()
        obs, _, terminateds, truncateds, infos = env.step(
            dict(zip(agents, actions.tolist(), strict=True))
        )
        if terminateds["__all__"] or truncateds["__all__"]:
            done += 1
            wins += bool(infos[agents[0]]["battle_won"])
            timeouts += not terminateds["__all__"]  # the time limit ended it: neither side won
            obs, _ = env.reset()
            state = fresh_state()
    return wins / episodes, spy.steps, timeouts / episodes


def learn(args: argparse.Namespace) -> None:
    """Trains until the greedy win rate (SMAC's "test win rate") reaches the target or budget.

    Every ``--eval-every`` iterations the current policy plays ``--eval-episodes-periodic``
    greedy episodes (MAPPO evaluates 32); the wall time includes these evaluations.
    """
    import ray

    ray.init(num_cpus=max(2, args.num_env_runners + 1), include_dashboard=False)
    algo = _config(args).build_algo()
    start = time.perf_counter()
    reached = None
    try:
        while True:
            result = algo.train()
            runners = result.get("env_runners", {})  # absent when a sample call timed out
            steps = int(result["num_env_steps_sampled_lifetime"])
            iteration = int(result["training_iteration"])
            win_rate = float(runners.get("rllib_ext/win_rate", float("nan")))
            row = {
                "iter": iteration,
                "env_steps": steps,
                "wall_s": round(time.perf_counter() - start, 1),
                "train_win_rate": round(win_rate, 3),
                "return": round(float(runners.get("episode_return_mean", np.nan)), 3),
                "dead_enemies": round(float(runners.get("rllib_ext/dead_enemies", np.nan)), 2),
                "iter_s": round(float(result.get("time_this_iter_s", np.nan)), 2),
            }
            if iteration % args.eval_every == 0:
                greedy, _, _ = _greedy_win_rate(
                    algo.get_module("shared_policy"),
                    args.map,
                    args.eval_episodes_periodic,
                    args.seed + iteration,
                    json.loads(args.smax_options),
                    json.loads(args.env_options),
                )
                row["greedy_win_rate"] = round(greedy, 3)
                if reached is None and greedy >= args.target_win_rate:
                    reached = {"env_steps": steps, "wall_s": round(time.perf_counter() - start, 1)}
            print(json.dumps(row), flush=True)
            if reached is not None and not args.keep_going:
                break
            elapsed = time.perf_counter() - start
            if steps >= args.max_env_steps or elapsed >= args.max_wall_s:
                break
        if args.save_module:
            # Reload with RLModule.from_checkpoint(args.save_module) to replay the policy.
            algo.get_module("shared_policy").save_to_path(args.save_module)
        greedy, checked_steps, timeouts = _greedy_win_rate(
            algo.get_module("shared_policy"),
            args.map,
            args.eval_episodes,
            args.seed,
            json.loads(args.smax_options),
            json.loads(args.env_options),
        )
        print(
            json.dumps(
                {
                    "map": args.map,
                    "central_critic": args.central_critic,
                    "final_env_steps": steps,
                    "final_wall_s": round(time.perf_counter() - start, 1),
                    "train_win_rate": round(win_rate, 3),
                    "greedy_eval_win_rate": round(greedy, 3),
                    "eval_episodes": args.eval_episodes,
                    "eval_steps_without_illegal_action": checked_steps,
                    "eval_timeout_rate": round(timeouts, 3),
                    "target": args.target_win_rate,
                    "target_reached": reached,
                }
            ),
            flush=True,
        )
    finally:
        algo.stop()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="SMAX learning and throughput benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)
    tp = sub.add_parser("throughput")
    tp.add_argument("--maps", nargs="+", default=["3m", "2s3z", "3s5z_vs_3s6z"])
    tp.add_argument("--steps", type=int, default=1000, help="steps per measured window")
    tp.add_argument("--rounds", type=int, default=7)
    lp = sub.add_parser("learn")
    lp.add_argument("--map", default="3m")
    lp.add_argument("--target-win-rate", type=float, default=0.9)
    lp.add_argument("--keep-going", action="store_true", help="run the full budget")
    lp.add_argument("--max-env-steps", type=int, default=500_000)
    lp.add_argument("--max-wall-s", type=float, default=1500.0)
    lp.add_argument("--central-critic", action="store_true")
    lp.add_argument("--num-env-runners", type=int, default=1)
    lp.add_argument("--envs-per-runner", type=int, default=4)
    lp.add_argument("--train-batch-size", type=int, default=4000, help="env steps per iter")
    lp.add_argument("--minibatch-size", type=int, default=1000)
    lp.add_argument("--num-epochs", type=int, default=5)
    lp.add_argument("--lr", type=float, default=1e-3)
    lp.add_argument("--lr-end", type=float, default=None, help="linear decay target")
    lp.add_argument("--lr-decay-steps", type=int, default=300_000)
    lp.add_argument("--entropy-coeff", type=float, default=0.01)
    lp.add_argument("--hiddens", type=int, nargs="+", default=[128, 128])
    lp.add_argument("--eval-episodes", type=int, default=100, help="final greedy evaluation")
    lp.add_argument("--eval-every", type=int, default=5, help="iterations between greedy evals")
    lp.add_argument("--eval-episodes-periodic", type=int, default=100)
    lp.add_argument("--kl-coeff", type=float, default=0.0, help="0 disables the KL loss")
    lp.add_argument("--grad-clip", type=float, default=None, help="global grad-norm clip")
    lp.add_argument("--seed", type=int, default=0)
    lp.add_argument(
        "--save-module", default=None, help="directory for the final policy module (RLlib format)"
    )
    lp.add_argument(
        "--smax-options",
        default="{}",
        help="HeuristicEnemySMAX arguments as JSON, e.g. '{\"see_enemy_actions\": true}'",
    )
    lp.add_argument(
        "--env-options",
        default="{}",
        help='extra SMACEnv env_config keys as JSON, e.g. \'{"state_mode": "agent_specific"}\'',
    )
    lp.add_argument(
        "--training-options",
        default="{}",
        help="extra training() keys as JSON (RLlib's or rllib_ext's), e.g. "
        '\'{"amp": "bf16", "clip_param": 0.1}\'',
    )
    lp.add_argument(
        "--model-options",
        default="{}",
        help="extra model_config keys of the masked module as JSON, e.g. "
        '\'{"value_norm": true, "death_masking": true}\'',
    )
    args = parser.parse_args()
    throughput(args) if args.command == "throughput" else learn(args)


if __name__ == "__main__":
    main()
