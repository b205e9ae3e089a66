"""Probe: how fast could SMAX sampling go if the policy ran inside the jitted SMAX step?

A measurement, not a product path. ``SMAXVectorEnvRunner``'s fused loop runs the policy forward
in torch on the sampling thread, between two jitted SMAX steps. This probe copies the presets'
masked module ([256, 256] ReLU, float32) into JAX (the same weights; its logits are checked
against the torch module's on a real batch, legal actions only, and the probe exits with an
error past 1e-4) and jits *forward + masked categorical sampling + the SMAX step of all 64
battles* as one call. The Python thread then only waits for step ``t``, hands step ``t + 1`` to
JAX and records step ``t`` into the runner's episode tracks with the runner's own
``_record_step`` (and builds the 64 continuation chunks every 128 steps, as one
``sample(num_timesteps=8192)`` call does), while JAX computes step ``t + 1``.

Each round times the probe and then, in the same process, the real fused path (``fused``, the
presets' module, float32 forward, ``fused_groups="auto"``, 8,192 env steps per ``sample()``
call), and prints both and their ratio. Actions come from JAX's PRNG here, not torch's, so the
probe's episodes are not RLlib's; it measures speed only.

Run (2-core machine: nothing else running)::

    python benchmarks/smax_jax_policy_probe.py --rounds 3 \\
        --json benchmarks/results/smax_throughput/smax_jax_policy_probe.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_MAP = "3s5z_vs_3s6z"
_NUM_ENVS = 64
_STEPS_PER_CALL = 128
"""Steps per battle per ``sample()`` call that training asks for (8,192 env steps / 64)."""


def _machine() -> str:
    cpu, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16") if f in flags]
    return f"{cpu}, {os.cpu_count()} cores, flags {' '.join(shown)}, no GPU used"


def _jax_params(rl_module: Any) -> list[tuple[Any, Any]]:
    """``[(W [in, out], b [out]), ...]`` of the module's policy path (encoder, then pi head)."""
    import jax.numpy as jnp
    import torch

    parts = [*rl_module.encoder.modules(), *rl_module.pi.modules()]
    leaves = {type(m).__name__ for m in parts if not list(m.children())}
    if not leaves <= {"Linear", "ReLU"}:
        raise ValueError(f"The probe mirrors Linear + ReLU networks only; got layers {leaves}.")
    linears = [m for m in parts if isinstance(m, torch.nn.Linear)]
    return [
        (jnp.asarray(m.weight.detach().numpy().T), jnp.asarray(m.bias.detach().numpy()))
        for m in linears
    ]


class Probe:
    """The runner's env and tracks, stepped by one jitted forward + sample + SMAX step call."""

    def __init__(self, runner: Any) -> None:
        import jax
        import jax.numpy as jnp

        self.runner, env = runner, runner.vector_env.battles
        if env.num_groups != 1:
            raise ValueError("The probe steps all battles as one group (fused_groups=1).")
        self.env = env
        module_id = next(iter(runner.module.keys()))
        self.rl_module = runner.module[module_id]
        runner.fused.module_id = module_id
        params = _jax_params(self.rl_module)
        spec, n_envs, n_agents = env.spec, env.num_envs, env.spec.n_agents
        obs_end, state_end, avail_end = env._obs_end, env._state_end, env._avail_end
        float_min = np.finfo(np.float32).min

        def policy_step(pkey: Any, keys: Any, states: Any, flat: Any, reset_idx: Any) -> Any:
            obs = flat[:, :obs_end].reshape(n_envs * n_agents, spec.obs_dim)
            avail = flat[:, state_end:avail_end].reshape(n_envs * n_agents, spec.n_actions)
            hidden = obs
            for weight, bias in params[:-1]:
                hidden = jax.nn.relu(hidden @ weight + bias)
            weight, bias = params[-1]
            logits = jnp.where(avail > 0.5, hidden @ weight + bias, float_min)
            pkey, sub = jax.random.split(pkey)
            actions = jax.random.categorical(sub, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[:, None], axis=1)
            keys, states, new_flat = env._step_fn(
                keys, states, actions.reshape(n_envs, n_agents).astype(jnp.int32), reset_idx
            )
            shape = (n_envs, n_agents)
            return (
                pkey,
                keys,
                states,
                new_flat,
                actions.reshape(shape),
                logp.reshape(shape),
                (logits.reshape(*shape, -1)),
            )

        self._step = jax.jit(policy_step)
        self._pkey = jax.random.PRNGKey(0)
        # A device-side flat observation to start from: one step with the first legal actions.
        batch = env.group_batch(0)
        env._keys[0], env._states[0], self._flat = env._step_fn(
            env._keys[0],
            env._states[0],
            np.argmax(batch.avail, axis=-1).astype(np.int32),
            env._reset_index(0),
        )
        self._batch = self._unpack(env.autoreset.copy())

    def _unpack(self, was_reset: np.ndarray) -> Any:
        batch = self.env._unpack(np.asarray(self._flat), was_reset)
        self.env.autoreset[:] = batch.terminated | batch.truncated
        return batch

    def max_logit_error(self) -> float:
        """Largest |JAX - torch| logit over the legal actions of the current batch."""
        import torch

        batch = self._batch
        rows = batch.obs.shape[0] * batch.obs.shape[1]
        with torch.no_grad():
            out = self.rl_module.forward_exploration(
                {
                    "obs": {
                        "observations": torch.from_numpy(batch.obs.reshape(rows, -1)),
                        "action_mask": torch.from_numpy(batch.avail.reshape(rows, -1)),
                    }
                }
            )
        torch_logits = out["action_dist_inputs"].numpy()
        jax_logits = np.asarray(
            self._step(
                self._pkey,
                self.env._keys[0],
                self.env._states[0],
                self._flat,
                self.env._reset_index(0),
            )[6]
        ).reshape(rows, -1)
        legal = batch.avail.reshape(rows, -1) > 0.5
        return float(np.abs(jax_logits - torch_logits)[legal].max())

    def run(self, seconds: float) -> dict[str, float]:
        """Env steps per second over ``seconds`` (new tracks for every battle at the start)."""
        from rllib_ext.envs.smac.sampling import gc_paused
        from rllib_ext.envs.smac.sampling.tracks import ActionRecord, StepRecord

        fused, env = self.runner.fused, self.env
        tracks = fused.tracks = [
            fused._new_track(self._batch, env.agent_states(self._batch), e)
            for e in range(env.num_envs)
        ]
        previous: tuple[np.ndarray, ...] | None = None
        env_steps, loops, record_s = 0, 0, 0.0
        start = time.perf_counter()
        with gc_paused(True):
            while time.perf_counter() - start < seconds:
                was_reset = env.autoreset.copy()
                self._pkey, env._keys[0], env._states[0], flat, *acted = self._step(
                    self._pkey, env._keys[0], env._states[0], self._flat, env._reset_index(0)
                )
                # JAX computes the next step meanwhile: record the one that produced _batch.
                tick = time.perf_counter()
                if previous is not None:
                    batch = self._batch
                    taken = ActionRecord(*previous, None, 0)
                    fused._record_step(StepRecord(batch, env.agent_states(batch), taken), offset=0)
                    env_steps += env.num_envs - int(batch.was_reset.sum())
                    loops += 1
                    if loops % _STEPS_PER_CALL == 0:
                        for e, track in enumerate(tracks):
                            if track is not None and track.steps > 0:
                                fused._chunk(track, terminated=False, truncated=False)
                                tracks[e] = track.continuation()
                record_s += time.perf_counter() - tick
                previous = tuple(np.asarray(x) for x in acted)
                self._flat = flat
                self._batch = self._unpack(was_reset)
        wall = time.perf_counter() - start
        return {"rate": env_steps / wall, "record_ms_per_step": record_s * 1e3 / max(loops, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", default=None, help="append one row per round here")
    args = parser.parse_args()

    import smax_throughput as st
    import torch

    from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner

    torch.set_num_threads(1)  # what Ray gives a remote env runner; the benchmark's default
    config = st._with_module(st._config(_MAP, _NUM_ENVS, "fused", seed=0), st._RECIPE["model"])
    runner = SMAXVectorEnvRunner(config=config)
    runner.fused_groups = 1
    runner.make_env()
    runner.sample(num_timesteps=_NUM_ENVS * st._WARMUP_STEPS)
    probe = Probe(runner)
    error = probe.max_logit_error()
    if error > 1e-4:
        raise SystemExit(f"JAX logits differ from the torch module's by {error:.2e} (> 1e-4).")
    probe.run(seconds=4.0)  # compiles the auto-reset variants of the jitted call
    machine = _machine()
    for r in range(args.rounds):
        jax_policy = probe.run(seconds=args.seconds)
        fused = st.measure_sampling(
            _MAP,
            "fused",
            num_envs=_NUM_ENVS,
            seconds=args.seconds,
            steps_per_env=_STEPS_PER_CALL,
            model=st._RECIPE["model"],
        )["rate"]
        row = {
            "round": r,
            "map": _MAP,
            "num_envs": _NUM_ENVS,
            "jax_policy_env_steps_per_s": round(jax_policy["rate"]),
            "record_ms_per_step": round(jax_policy["record_ms_per_step"], 2),
            "fused_fp32_env_steps_per_s": round(fused),
            "ratio": round(jax_policy["rate"] / fused, 2),
            "max_logit_error": error,
            "machine": machine,
        }
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(json.dumps(row) + "\n")
    runner.stop()


if __name__ == "__main__":
    main()
