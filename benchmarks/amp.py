"""AMP learner benchmark: PPO update throughput and peak memory, fp32 vs fp16 vs bf16.

Each mode runs in its own subprocess (clean peak-memory reading) through the real
``PPOExtTorchLearner`` update step (forward + PPO loss under autocast, backward, unscale,
clip, optimizer step) on an MLP with ``--hidden`` x ``--layers`` hidden units, one minibatch
of ``--minibatch`` samples per step. Printed as ratios against fp32 measured in the same run.

    python benchmarks/amp.py                              # 3x1024 MLP, minibatch 16384
    python benchmarks/amp.py --minibatch 4096 --steps 3   # quicker on a CPU without bf16

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the process's peak RSS
growth over the idle process (``ru_maxrss``), which includes allocator slack.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import torch

MODES = ("fp32", "fp16", "bf16")


def _batch(n: int, obs_dim: int, n_actions: int, device: torch.device) -> dict:
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing

    rng = np.random.default_rng(0)

    def t(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(device)

    logits = rng.standard_normal((n, n_actions)).astype(np.float32)
    actions = rng.integers(0, n_actions, n)
    logp = logits[np.arange(n), actions] - np.log(np.exp(logits).sum(-1))
    return {
        Columns.OBS: t(rng.standard_normal((n, obs_dim)).astype(np.float32)),
        Columns.ACTIONS: t(actions),
        Columns.ACTION_LOGP: t(logp.astype(np.float32)),
        Columns.ACTION_DIST_INPUTS: t(logits),
        Columns.LOSS_MASK: t(np.ones(n, dtype=bool)),
        Postprocessing.ADVANTAGES: t(rng.standard_normal(n).astype(np.float32)),
        Postprocessing.VALUE_TARGETS: t(rng.standard_normal(n).astype(np.float32)),
    }


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    import rllib_ext

    obs_space = gym.spaces.Box(-1.0, 1.0, (args.obs_dim,), np.float32)
    act_space = gym.spaces.Discrete(args.n_actions)
    cfg = (
        rllib_ext.PPOConfig()
        .environment(observation_space=obs_space, action_space=act_space)
        .rl_module(model_config={"fcnet_hiddens": [args.hidden] * args.layers})
        .learners(num_gpus_per_learner=1 if torch.cuda.is_available() else 0)
        .training(amp=False if mode == "fp32" else mode, grad_clip=0.5)
    )
    learner = cfg.build_learner(env=None, spaces={"__env__": (obs_space, act_space)})
    device = learner._device
    mid = next(iter(learner.module.keys()))
    batch = {mid: _batch(args.minibatch, args.obs_dim, args.n_actions, device)}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    learner._update(batch)  # warm-up (allocator, autocast caches)
    times = []
    for _ in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        learner._update(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    best = min(times)
    return {
        "mode": mode,
        "device": str(device),
        "step_s": best,
        "samples_per_s": args.minibatch / best,
        "peak_mb": peak_mb,
        "dtype": learner.amp.dtype_name,
        "params": sum(p.numel() for p in learner.module[mid].parameters()),
        # fp16: steps GradScaler skipped (inf/nan gradients), and the scale after the last.
        "skipped_steps": learner.amp.skipped_steps.get(mid, 0),
        "loss_scale": learner.amp.scaler(mid).get_scale() if learner.amp.scaling else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--minibatch", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--obs-dim", type=int, default=128)
    parser.add_argument("--n-actions", type=int, default=16)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_mode(args.child, args)))
        return

    from rllib_ext.amp_choice import cpu_has_native_bf16

    print(
        f"# machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        f"threads, cuda={torch.cuda.is_available()}, native CPU bf16={cpu_has_native_bf16()}, "
        f"torch {torch.__version__}"
    )
    print(
        f"# MLP {args.layers}x{args.hidden}, minibatch {args.minibatch}, best of {args.steps} steps"
    )
    rows = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", mode] + [
            a for a in sys.argv[1:] if not a.startswith("--child")
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    base = next(r for r in rows if r["mode"] == "fp32")
    print(
        f"{'mode':6} {'device':8} {'step s':>8} {'samples/s':>11} {'x fp32':>7} "
        f"{'peak MB':>9} {'x fp32':>7}"
    )
    for r in rows:
        print(
            f"{r['mode']:6} {r['device']:8} {r['step_s']:8.3f} {r['samples_per_s']:11.0f} "
            f"{r['samples_per_s'] / base['samples_per_s']:7.2f} {r['peak_mb']:9.1f} "
            f"{r['peak_mb'] / max(base['peak_mb'], 1e-9):7.2f}"
        )


if __name__ == "__main__":
    main()
