"""GAE benchmark: the compiled kernel and the whole PPO learner-connector pipeline.

Reproduce (the machine has 2 cores shared with other jobs; the lock keeps runs apart)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/gae.py

Options: ``--repeats N`` (best-of-N for the fast timings), ``--skip-pipeline``,
``--default-malloc`` (see below).

Part 1, kernel: 1,000,000 steps in RLlib's learner layout (episode chunks of 150-250 steps,
each followed by its bootstrap step; half terminated, half truncated), float32 values and
rewards, bool flags. Timed in one process, best of N:

* ``rllib_ext.ops.gae.compute_value_targets`` (numba, compiled single pass);
* RLlib's ``compute_value_targets`` (the Python loop);
* the streaming bound: copy the 4 input arrays and write the 2 outputs (float64 advantages,
  float32 targets) with numpy, i.e. the memory traffic any implementation must pay.

glibc returns freed 8 MB blocks to the kernel or keeps them depending on the allocation
history (dynamic mmap/trim thresholds), so the same numpy code pays ~1 ms of page faults per
8 MB on some runs and not on others (the streaming bound moved between 1.0 and 8.8 ms here).
The benchmark therefore pins both thresholds with ``mallopt`` before allocating anything:
every timing is steady-state compute. ``--default-malloc`` skips that.

Part 2, pipeline: real CartPole episodes (8k and 32k env steps, sampled once with the
algorithm's local env runner), then the learner's own ``_learner_connector(...)`` call on a
deep copy of them, for a stock RLlib PPO learner and for ``PPOExtTorchLearner`` with its defaults
(``VectorizedEpisodesToBatch`` in place of RLlib's seven batching pieces, ``CompiledGAE``) with
identical module weights. Best of N; the per-piece profile at 32k
shows where the pipeline time goes.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import os
import platform
import sys
import time
from collections.abc import Callable

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _pin_malloc() -> bool:
    """Keep freed blocks in the heap (no re-faulting); glibc only."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1


def _best_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best wall ms, CPU/wall ratio of that run) over ``repeats`` calls after one warm-up."""
    fn()
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if wall < best[0]:
            best = (wall, cpu / wall if wall > 0 else 0.0)
    return best[0] * 1e3, best[1]


def _machine_line() -> str:
    import numpy as np
    import ray
    import torch

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, load {load:.2f} | python "
        f"{platform.python_version()}, numpy {np.__version__}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), ray {ray.__version__}"
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        return (
            "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"
        )

    return "\n".join(
        [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        + [line(r) for r in rows]
    )


def kernel_data(n: int = 1_000_000, seed: int = 0):
    """RLlib learner layout: chunks of 150-250 real steps + 1 bootstrap step each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(150, 251, size=n // 150 + 1) + 1
    ends = np.cumsum(lengths)
    ends = ends[ends <= n] - 1  # index of each bootstrap step
    last_real = ends - 1
    terminated = rng.random(last_real.size) < 0.5
    term = np.zeros(n, dtype=bool)
    trunc = np.zeros(n, dtype=bool)
    term[last_real[terminated]] = True
    trunc[last_real[~terminated]] = True
    values = rng.normal(size=n).astype(np.float32)
    rewards = rng.normal(size=n).astype(np.float32)
    return values, rewards, term, trunc, last_real.size


def bench_kernel(repeats: int) -> str:
    import numpy as np
    from ray.rllib.utils.postprocessing.value_predictions import (
        compute_value_targets as rllib_value_targets,
    )

    from rllib_ext.ops.gae import compute_value_targets, kernel_backend

    values, rewards, term, trunc, chunks = kernel_data()
    n = values.size
    gamma, lambda_ = 0.99, 0.95

    def streaming_bound():
        copies = (values.copy(), rewards.copy(), term.copy(), trunc.copy())
        adv = np.empty(n, dtype=np.float64)
        targets = np.empty(n, dtype=np.float32)
        adv[:] = copies[0]
        targets[:] = copies[1]

    ours = compute_value_targets(values, rewards, term, trunc, gamma, lambda_)
    ref = rllib_value_targets(values, rewards, term, trunc, gamma, lambda_)
    max_diff = float(np.max(np.abs(ours - ref)))

    stream_ms, _ = _best_ms(streaming_bound, repeats)
    ours_ms, ours_cpu = _best_ms(
        lambda: compute_value_targets(values, rewards, term, trunc, gamma, lambda_), repeats
    )
    rllib_ms, _ = _best_ms(
        lambda: rllib_value_targets(values, rewards, term, trunc, gamma, lambda_), 3
    )
    stream_ms = min(stream_ms, _best_ms(streaming_bound, repeats)[0])  # bracket ours
    rows = [
        ["RLlib compute_value_targets (loop)", f"{rllib_ms:.1f}", f"{rllib_ms / ours_ms:.0f}x"],
        [
            f"rllib_ext compute_value_targets ({kernel_backend()})",
            f"{ours_ms:.2f}",
            f"1x (CPU/wall {ours_cpu:.2f})",
        ],
        [
            "streaming bound (numpy copies)",
            f"{stream_ms:.2f}",
            f"ours = {ours_ms / stream_ms:.1f}x",
        ],
    ]
    return (
        f"kernel: {n:,} steps, {chunks} chunks (150-250 + 1 bootstrap step), half terminated,"
        f" gamma={gamma} lambda={lambda_}; max |ours - RLlib| = {max_diff:.1e}\n"
        + _table(["implementation", "best ms", "vs ours"], rows)
    )


def _pipeline_configs():
    from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

    import rllib_ext

    def common(config):
        return (
            config.environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=8)
            .training(train_batch_size_per_learner=32_000)
            .debugging(seed=0)
        )

    return common(StockPPOConfig()), common(rllib_ext.PPOConfig())


def bench_pipeline(repeats: int) -> str:
    import numpy as np
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    stock_config, ext_config = _pipeline_configs()
    stock_algo, ext_algo = stock_config.build_algo(), ext_config.build_algo()
    try:
        stock, ext = stock_algo.learner_group._learner, ext_algo.learner_group._learner
        stock.module.set_state(ext.module.get_state())  # same weights in both

        def call(learner, episodes):
            return learner._learner_connector(
                rl_module=learner.module,
                batch={},
                episodes=copy.deepcopy(episodes),
                shared_data={},
                metrics=None,
            )

        def timed(learner, episodes, n):
            best = float("inf")
            call(learner, episodes)
            for _ in range(n):
                eps = copy.deepcopy(episodes)
                t0 = time.perf_counter()
                learner._learner_connector(
                    rl_module=learner.module, batch={}, episodes=eps, shared_data={}, metrics=None
                )
                best = min(best, time.perf_counter() - t0)
            return best * 1e3

        rows, profile_eps = [], None
        for steps in (8_000, 32_000):
            episodes = ext_algo.env_runner.sample(num_timesteps=steps, random_actions=False)
            n_steps = sum(len(e) for e in episodes)
            s_batch, e_batch = call(stock, episodes), call(ext, episodes)
            mid = next(iter(e_batch))
            mask = s_batch[mid]["loss_mask"].numpy()
            diff = float(
                np.max(
                    np.abs(
                        s_batch[mid]["advantages"].numpy()[mask]
                        - e_batch[mid]["advantages"].numpy()[mask]
                    )
                )
            )
            n = max(3, repeats // 4)
            stock_ms, ext_ms = timed(stock, episodes, n), timed(ext, episodes, n)
            rows.append(
                [
                    f"{n_steps:,} steps / {len(episodes)} episodes",
                    f"{stock_ms:.1f}",
                    f"{ext_ms:.1f}",
                    f"{stock_ms / ext_ms:.2f}x",
                    f"{diff:.0e}",
                ]
            )
            profile_eps = episodes
        out = [
            "pipeline: learner._learner_connector(...) on real CartPole episodes, "
            "default PPO RLModule, best of "
            f"{max(3, repeats // 4)}",
            _table(["batch", "stock RLlib ms", "rllib_ext ms", "speedup", "max |adv diff|"], rows),
            "",
            f"per-piece profile at {sum(len(e) for e in profile_eps):,} steps (best of 3, ms):",
            _piece_table(stock, ext, profile_eps),
        ]
        return "\n".join(out)
    finally:
        stock_algo.stop()
        ext_algo.stop()


def _piece_times(learner, episodes, n: int = 3) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(n):
        eps, batch, shared = copy.deepcopy(episodes), {}, {}
        for piece in learner._learner_connector.connectors:
            t0 = time.perf_counter()
            batch = piece(
                rl_module=learner.module,
                batch=batch,
                episodes=eps,
                explore=None,
                shared_data=shared,
                metrics=None,
            )
            name = type(piece).__name__
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) * 1e3)
    return best


def _piece_table(stock, ext, episodes) -> str:
    s, e = _piece_times(stock, episodes), _piece_times(ext, episodes)
    rows = []
    for name in dict.fromkeys([*s, *e]):
        rows.append(
            [name, f"{s[name]:.1f}" if name in s else "-", f"{e[name]:.1f}" if name in e else "-"]
        )
    rows.append(["total", f"{sum(s.values()):.1f}", f"{sum(e.values()):.1f}"])
    return _table(["piece", "stock", "rllib_ext"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="best-of-N for fast timings")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--default-malloc", action="store_true", help="do not pin glibc malloc")
    args = parser.parse_args(argv)
    pinned = False if args.default_malloc else _pin_malloc()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    print(_machine_line())
    print(f"malloc thresholds pinned: {pinned}; command: {' '.join([sys.executable, *sys.argv])}")
    print()
    print(bench_kernel(args.repeats))
    if not args.skip_pipeline:
        print()
        print(bench_pipeline(args.repeats))


if __name__ == "__main__":
    main()
