"""Tutorial chapter 6 (性能调优): its two snippets, pointed at what rllib_ext ships.

1. Profiler. The tutorial wraps a toy model in ``torch.profiler``. For an RLlib PPO run the
   same question (where does an iteration's time go?) is answered by ``rllib-ext profile``:
   a breakdown of sampling / learner connector / GAE / forward-backward / optimizer per
   iteration plus a PyTorch-profiler trace of one learner update
   (``trace/learner.pt.trace.json.gz``, open in TensorBoard or chrome://tracing)::

       rllib-ext profile --env CartPole-v1 --iterations 2 --warmup 1 --out ./profile

   Tune users add :class:`rllib_ext.profiling.ProfilerCallback` to their own config instead.

2. Vectorized discounted returns. The tutorial's ``F.conv1d`` version has two faults:

   * as printed it does not run: its kernel (``max_steps=1000`` taps) is longer than the
     10-step input, and ``padding=0`` leaves no output (``RuntimeError``);
   * with the padding fixed it is exact for separate, equally long trajectories only. On a
     rollout stream (episodes back to back, as RLlib's env runners produce them) it sums
     rewards across episode ends, so every step before an episode end is wrong.

   :func:`rllib_ext.ops.gae.discounted_suffix_sum` is the loop-free version that stops at
   episode ends (``y_t = r_t + gamma * (1 - done_t) * y_{t+1}``), exact against the loop, and
   what the PPO learner's GAE uses (``.training(gae="compiled")``, the default).

Run: ``python examples/tutorial/chapter6.py`` (add ``--profile`` for the ``rllib-ext profile`` run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from rllib_ext.ops.gae import discounted_suffix_sum

GAMMA = 0.99
MAX_STEPS = 1000


def loop_returns(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """The tutorial's ``compute_discounted_reward`` loop, stopping at episode ends. ``[N] -> [N]``."""
    out = np.zeros_like(rewards, dtype=np.float64)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        out[t] = running
    return out


def tutorial_conv1d_as_printed(rewards: torch.Tensor) -> torch.Tensor:
    """The tutorial's call, unchanged: ``[B, T]`` rewards, a ``max_steps``-tap kernel, no padding."""
    discounts = torch.pow(GAMMA, torch.arange(MAX_STEPS, dtype=rewards.dtype)).view(1, 1, -1)
    return F.conv1d(rewards.unsqueeze(1), discounts, padding=0).squeeze(1)


def tutorial_conv1d_padded(rewards: torch.Tensor) -> torch.Tensor:
    """The tutorial's idea with the padding fixed (kernel = length, right-padded): ``[B, T] -> [B, T]``.

    Exact for separate trajectories; blind to episode ends inside a row.
    """
    length = rewards.shape[-1]
    discounts = torch.pow(GAMMA, torch.arange(length, dtype=rewards.dtype)).view(1, 1, -1)
    padded = F.pad(rewards.unsqueeze(1), (0, length - 1))
    return F.conv1d(padded, discounts).squeeze(1)


def compare(seed: int = 0) -> dict[str, float]:
    """Max abs error against the loop: conv1d vs ``discounted_suffix_sum``, on a rollout stream.

    The stream: 2000 steps of CartPole-like rewards (1 per step), episodes of 5-60 steps
    back to back, ``done`` at each episode's last step.
    """
    rng = np.random.default_rng(seed)
    n = 2000
    lengths = []
    while sum(lengths) < n:
        lengths.append(int(rng.integers(5, 61)))
    dones = np.zeros(n, dtype=bool)
    ends = np.cumsum(lengths) - 1
    dones[ends[ends < n]] = True
    rewards = np.ones(n, dtype=np.float64)
    expected = loop_returns(rewards, dones, GAMMA)

    conv = tutorial_conv1d_padded(torch.from_numpy(rewards).unsqueeze(0))[0].numpy()
    ours = discounted_suffix_sum(rewards, dones, GAMMA)
    # Separate trajectories (what the tutorial tested): conv1d is right there.
    per_episode = torch.ones(32, 10, dtype=torch.float64)
    conv_separate = tutorial_conv1d_padded(per_episode)[0].numpy()
    separate_expected = loop_returns(np.ones(10), np.eye(1, 10, 9, dtype=bool)[0], GAMMA)
    return {
        "conv1d_error_separate_trajectories": float(
            np.abs(conv_separate - separate_expected).max()
        ),
        "conv1d_error_rollout_stream": float(np.abs(conv - expected).max()),
        "conv1d_error_at_episode_ends": float(np.abs(conv - expected)[dones].max()),
        "rllib_ext_error_rollout_stream": float(np.abs(ours - expected).max()),
    }


def run_profile(out_dir: str, iterations: int = 1) -> None:
    """``rllib-ext profile`` on CartPole (the CLI, as a user would type it)."""
    cmd = [sys.executable, "-m", "rllib_ext.cli.main", "profile", "--env", "CartPole-v1"]
    cmd += ["--iterations", str(iterations), "--warmup", "0", "--out", out_dir]
    print("$", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="also run `rllib-ext profile`")
    parser.add_argument("--out", default=None, help="profile output folder (default: a temp dir)")
    args = parser.parse_args()

    try:
        tutorial_conv1d_as_printed(torch.rand(32, 10))
    except RuntimeError as err:
        print(f"tutorial conv1d as printed: RuntimeError: {str(err).splitlines()[0]}")
    for name, value in compare().items():
        print(f"{name}: {value:.3g}")
    if args.profile:
        run_profile(args.out or tempfile.mkdtemp(prefix="rllib_ext_profile_"))


if __name__ == "__main__":
    main()
