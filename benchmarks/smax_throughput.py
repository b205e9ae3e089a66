"""SMAX env steps per second through RLlib: RLlib's per-env path against rllib_ext's batched one.

Two measurements per map, in one run, same machine, same process:

``sampling``: an env runner's ``sample()`` alone (no learning), ``--num-envs`` battles, the
masked PPO module choosing actions (``explore=True``):

* ``rllib``: RLlib's ``MultiAgentEnvRunner`` over its ``SyncVectorMultiAgentEnv`` of
  ``SMACEnv`` copies (what rllib_ext did before; one jitted SMAX step per env per step);
* ``batched``: ``SMAXVectorEnvRunner`` with ``fused_sampling=False``: all battles in one jitted,
  vmapped call, RLlib's own per-agent loop, connectors and episode bookkeeping on top;
* ``fused``: ``SMAXVectorEnvRunner`` as configured by default: one forward pass for all agents
  of all battles, arrays until the episode chunks are built (same episodes, see the tests).

``train``: ``algo.train()`` end to end (sampling + learning; one remote env runner, whose torch
runs one thread as Ray sets it, the learner in the driver with all cores), env steps per second
of wall time over ``--train-iters`` iterations after one warm-up iteration, for a ladder of
settings that adds one factor per step (each row's ratio is against the row above and against
the first):

* ``rllib-cli``: RLlib's per-env path with ``rllib-ext train``'s old SMAC defaults (8 envs,
  train batch 2000, minibatch 250, 10 epochs): where the issue started;
* ``fused-cli``: the batched, fused ``SMAXVectorEnvRunner``, same settings;
* ``fused-recipe``: the settings of the 3s5z_vs_3s6z learning run (64 envs, train batch 8192,
  minibatch 4096, 5 epochs; central critic, value normalization, death masking; [256, 256]);
* ``fused-recipe-bf16``: the same with ``amp="bf16"`` (bf16 autocast in the learner update;
  fast only on CPUs with native bf16, e.g. AVX512-BF16, and on GPUs);
* ``fused-recipe-bf16-local``: the same with ``num_env_runners=0``: the env runner samples in the
  learner's process, so the iteration's episodes (~128 MB on 3s5z_vs_3s6z) are not serialized
  between processes (what the ``smax-3s5z_vs_3s6z`` and ``smax-3m`` presets use);
* ``fused-recipe-bf16-local-inference``: the same with ``amp_inference=True``: the env runner's
  forward also runs under bf16 autocast (actions and ``action_logp`` from float32 logits).

``sampling`` also reports ``fused-train-call``: the ``fused`` path asked for
``_RECIPE["train_batch_size"]`` env steps per ``sample()`` call (128 per battle with 64 battles),
as training asks a local env runner (RLlib's ``rollout_fragment_length="auto"``), instead of the
16 per battle of the other columns (more of each episode chunk's fixed cost per step there), and
``env-only``: the batched, jitted SMAX step alone (random legal actions
from numpy, no module, no episodes), the ceiling for any sampling path over the same battles,
and ``fused-train-call-bf16``: ``fused-train-call`` with ``amp="bf16", amp_inference=True`` (the
forward under bf16 autocast; fast only with native bf16, e.g. AVX512-BF16), and
``fused-recipe-call`` / ``fused-recipe-call-bf16``: the same two with the module the presets
and the ``fused-recipe`` rows train ([256, 256] ReLU, central critic, value normalization,
death masking) instead of RLlib's default model config ([256, 256] tanh; tanh costs as much as
a 256x256 layer on this CPU).

Run (2-core machine: serialise CPU-heavy jobs)::

    flock /tmp/cpu.lock python benchmarks/smax_throughput.py \\
        --json benchmarks/results/smax_throughput/smax_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

os.environ.setdefault("RAY_DEDUP_LOGS", "0")

_WARMUP_STEPS = 120
"""Steps per battle before timing: past SMAX's time limit (101 steps), so the auto-reset variants
of the jitted step are compiled outside the timed window."""

_CLI = {"num_envs": 8, "train_batch_size": 2000, "minibatch_size": 250, "num_epochs": 10}
_RECIPE = {
    "num_envs": 64,
    "train_batch_size": 8192,
    "minibatch_size": 4096,
    "num_epochs": 5,
    "model": {"central_critic": True, "value_norm": True, "death_masking": True},
}
TRAIN_SETTINGS: dict[str, dict[str, Any]] = {
    "rllib-cli": {"path": "rllib", **_CLI},
    "fused-cli": {"path": "fused", **_CLI},
    "fused-recipe": {"path": "fused", **_RECIPE},
    "fused-recipe-bf16": {"path": "fused", **_RECIPE, "training": {"amp": "bf16"}},
    "fused-recipe-bf16-local": {
        "path": "fused",
        **_RECIPE,
        "training": {"amp": "bf16"},
        "num_env_runners": 0,
    },
    "fused-recipe-bf16-local-inference": {
        "path": "fused",
        **_RECIPE,
        "training": {"amp": "bf16", "amp_inference": True},
        "num_env_runners": 0,
    },
}
_AMP_INFERENCE = {"amp": "bf16", "amp_inference": True}


def _config(map_name: str, num_envs: int, path: str, seed: int, num_env_runners: int = 0) -> Any:
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    from rllib_ext import PPOConfig

    config = (
        PPOConfig()
        .environment("smax", env_config={"map_name": map_name, "seed": seed})
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=num_envs)
        .debugging(seed=seed)
    )
    if path == "rllib":
        config.env_runners(env_runner_cls=MultiAgentEnvRunner)
    return config


def _with_module(config: Any, model: dict[str, Any]) -> Any:
    """``config`` with the masked module of a ``TRAIN_SETTINGS`` row (``model``: its extra
    model_config keys; [256, 256] ReLU as the presets)."""
    from rllib_ext.modules import smac_module_spec

    model = {"fcnet_hiddens": [256, 256], "fcnet_activation": "relu", **model}
    return config.rl_module(
        rl_module_spec=smac_module_spec(central_critic=model.pop("central_critic", False)),
        model_config=model,
    )


_PHASES = ("sample", "env_step", "inference")
"""Phases the profiling runner times in the fused loop (``rllib_ext.profiling.env_runner``)."""


def measure_sampling(
    map_name: str,
    path: str,
    *,
    num_envs: int,
    seconds: float,
    steps_per_env: int = 16,
    training: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    phases: bool = False,
) -> dict[str, Any]:
    """``{"rate": env steps per second}`` of ``EnvRunner.sample(num_timesteps=num_envs *
    steps_per_env)`` (warm: compiled, episodes running); ``training``: extra ``.training()`` keys;
    ``model``: the module of a ``TRAIN_SETTINGS`` row (see ``_with_module``; ``None``: RLlib's
    default model config, [256, 256] tanh, no central critic).

    ``phases``: the runner is ``rllib-ext profile``'s timing subclass and the result also holds
    ``"ms_per_step"``: milliseconds per step of all battles for ``env_step`` (handing the step to
    JAX and waiting for it; the bookkeeping that overlaps it is not counted), ``inference`` (the
    forward and action sampling) and ``rest`` (the rest of ``sample()``: module batch, episode
    bookkeeping and chunk building outside the overlap).
    """
    from rllib_ext.profiling.env_runner import PROFILE_KEY, profiled_env_runner_class

    config = _config(map_name, num_envs, path, seed=0).training(**(training or {}))
    if model is not None:
        config = _with_module(config, model)
    runner_cls = config.env_runner_cls
    runner = (profiled_env_runner_class(runner_cls) if phases else runner_cls)(config=config)
    if path == "batched":
        runner.fused_sampling = False
    chunk = num_envs * steps_per_env
    runner.sample(num_timesteps=num_envs * _WARMUP_STEPS)

    def phase_seconds() -> dict[str, float]:
        return {p: runner.metrics.peek((PROFILE_KEY, f"{p}_s"), default=0.0) for p in _PHASES}

    before = phase_seconds() if phases else {}
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        episodes = runner.sample(num_timesteps=chunk)
        steps += sum(ep.env_steps() for ep in episodes)
    result: dict[str, Any] = {"rate": steps / (time.perf_counter() - start)}
    if phases:
        after = phase_seconds()
        ms = {p: (after[p] - before[p]) * 1e3 / (steps / num_envs) for p in _PHASES}
        ms["rest"] = ms["sample"] - ms["env_step"] - ms["inference"]
        result["ms_per_step"] = {k: round(float(v), 3) for k, v in ms.items()}
    runner.stop()
    return result


def measure_env_only(map_name: str, *, num_envs: int, seconds: float) -> float:
    """Env steps per second of ``SMAXBattles.step_arrays`` alone, random legal actions."""
    import numpy as np

    from rllib_ext.envs.smac.battles import SMAXBattles
    from rllib_ext.envs.smac.settings import SMACEnvSettings

    settings = SMACEnvSettings.from_env_config({"backend": "smax", "map_name": map_name, "seed": 0})
    env = SMAXBattles(settings, num_envs=num_envs)
    rng = np.random.default_rng(0)
    batch = env.reset_arrays()

    def step(batch: Any) -> Any:
        return env.step_arrays(np.argmax(rng.random(batch.avail.shape) * batch.avail, axis=-1))

    for _ in range(_WARMUP_STEPS):
        batch = step(batch)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = step(batch)
        steps += num_envs
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def measure_train(map_name: str, *, settings: str, iters: int) -> dict[str, float]:
    """Env steps per second of ``algo.train()`` over ``iters`` iterations after a warm-up one."""
    from rllib_ext.envs.smac.env_runner import SMAX_BATCHED_METRIC, SMAX_FUSED_METRIC

    spec = TRAIN_SETTINGS[settings]
    config = _config(
        map_name,
        spec["num_envs"],
        spec["path"],
        seed=0,
        num_env_runners=spec.get("num_env_runners", 1),
    )
    _with_module(config, spec.get("model", {})).training(
        train_batch_size_per_learner=spec["train_batch_size"],
        minibatch_size=spec["minibatch_size"],
        num_epochs=spec["num_epochs"],
        lr=3e-4,
        **spec.get("training", {}),
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        before = result["env_runners"]["num_env_steps_sampled_lifetime"]
        start = time.perf_counter()
        for _ in range(iters):
            result = algo.train()
        wall = time.perf_counter() - start
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"] - before
        runners = result["env_runners"]
        return {
            "env_steps_per_s": steps / wall,
            "batched_envs": float(runners.get(SMAX_BATCHED_METRIC, 0.0)),
            "fused": float(runners.get(SMAX_FUSED_METRIC, 0.0)),
        }
    finally:
        algo.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maps", nargs="+", default=["3m", "3s5z_vs_3s6z"])
    parser.add_argument("--num-envs", type=int, default=64, help="battles for the sampling part")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--train-iters", type=int, default=2)
    parser.add_argument(
        "--sampling-torch-threads",
        type=int,
        default=1,
        help="torch threads while measuring sampling (1: what Ray gives a remote env runner; "
        "two threads spinning next to XLA's pool slow both down on 2 cores)",
    )
    parser.add_argument("--train-settings", nargs="+", default=list(TRAIN_SETTINGS))
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument(
        "--fused-groups",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="SMAXVectorEnvRunner.fused_groups for the fused columns: groups of battles the loop "
        "alternates between, so the policy runs for one group while JAX steps another ('auto', "
        "the runner's default: 2 for large batches, else 1)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time the fused-train-call columns with rllib-ext profile's runner: ms per step of "
        "all battles in env_step / inference / rest",
    )
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()

    import ray
    import torch

    from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner

    SMAXVectorEnvRunner.fused_groups = args.fused_groups

    # address="local": a new Ray for this run even if another one is up on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    learner_threads = torch.get_num_threads()
    torch.set_num_threads(args.sampling_torch_threads)
    out: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch_threads_sampling": args.sampling_torch_threads,
        "torch_threads_learner": learner_threads,
        "num_envs_sampling": args.num_envs,
        "fused_groups": args.fused_groups,
        "sampling": {},
        "train": {},
    }
    for map_name in args.maps:
        rates = {
            path: measure_sampling(
                map_name, path, num_envs=args.num_envs, seconds=args.sample_seconds
            )["rate"]
            for path in ("rllib", "batched", "fused")
        }
        phase_ms: dict[str, Any] = {}
        for column, training, model in (
            ("fused-train-call", None, None),
            ("fused-train-call-bf16", _AMP_INFERENCE, None),
            ("fused-recipe-call", None, _RECIPE["model"]),
            ("fused-recipe-call-bf16", _AMP_INFERENCE, _RECIPE["model"]),
        ):
            measured = measure_sampling(
                map_name,
                "fused",
                num_envs=args.num_envs,
                seconds=args.sample_seconds,
                steps_per_env=max(1, _RECIPE["train_batch_size"] // args.num_envs),
                training=training,
                model=model,
                phases=args.phases,
            )
            rates[column] = measured["rate"]
            if args.phases:
                phase_ms[column] = measured["ms_per_step"]
                print(f"phases   {map_name:>13} {column}: {measured['ms_per_step']}", flush=True)
        rates["env-only"] = measure_env_only(
            map_name, num_envs=args.num_envs, seconds=args.sample_seconds
        )
        out["sampling"][map_name] = rates
        if phase_ms:
            out.setdefault("sampling_ms_per_step", {})[map_name] = phase_ms
        print(
            f"sampling {map_name:>13} E={args.num_envs}: rllib {rates['rllib']:8.0f}  "
            f"batched {rates['batched']:8.0f} ({rates['batched'] / rates['rllib']:.1f}x)  "
            f"fused {rates['fused']:8.0f} ({rates['fused'] / rates['rllib']:.1f}x)  "
            f"fused-train-call {rates['fused-train-call']:8.0f}  "
            f"(bf16 forward {rates['fused-train-call-bf16']:8.0f})  "
            f"fused-recipe-call {rates['fused-recipe-call']:8.0f}  "
            f"(bf16 forward {rates['fused-recipe-call-bf16']:8.0f})  "
            f"env-only {rates['env-only']:8.0f} env steps/s",
            flush=True,
        )
    torch.set_num_threads(learner_threads)
    if not args.skip_train:
        for map_name in args.maps:
            rows: dict[str, dict[str, float]] = {}
            for settings in args.train_settings:
                row = measure_train(map_name, settings=settings, iters=args.train_iters)
                rate = row["env_steps_per_s"]
                first, previous = (
                    (rows[next(iter(rows))], rows[list(rows)[-1]]) if rows else (row, row)
                )
                row["x_previous"] = rate / previous["env_steps_per_s"]
                row["x_first"] = rate / first["env_steps_per_s"]
                rows[settings] = row
                print(
                    f"train    {map_name:>13} {settings:>17}: {rate:8.0f} env steps/s "
                    f"({row['x_previous']:.2f}x previous, {row['x_first']:.2f}x first; "
                    f"batched envs {row['batched_envs']:.0f}, fused {row['fused']:.0f})",
                    flush=True,
                )
            out["train"][map_name] = rows
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    ray.shutdown()


if __name__ == "__main__":
    main()
