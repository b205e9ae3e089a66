"""Compiled GAE kernel vs RLlib's own loop (outside oracle) and our plain-loop reference."""

from __future__ import annotations

import tracemalloc
import zlib

import numpy as np
import pytest
import torch
from ray.rllib.utils.postprocessing.value_predictions import (
    compute_value_targets as rllib_compute_value_targets,
)

from rllib_ext.ops import gae_compiled
from rllib_ext.ops.gae import (
    compute_advantages,
    compute_value_targets,
    discounted_suffix_sum,
    kernel_backend,
)
from rllib_ext.ops.gae_reference import (
    compute_advantages_reference,
    compute_value_targets_reference,
)

LAYOUTS = ("rllib_chunks", "length_one", "all_terminated", "all_truncated", "no_boundary", "random")
SIZES = (1, 2, 7, 8, 9, 64, 65, 517, 3001)
RATES = ((0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0), (0.99, 0.95), ("random", "random"))


def _layout(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(terminateds, truncateds)`` bool ``[n]`` for one kind of episode layout."""
    term = np.zeros(n, dtype=bool)
    trunc = np.zeros(n, dtype=bool)
    if kind == "length_one":
        flag = rng.random(n) < 0.5
        term[flag] = True
        trunc[~flag] = True
    elif kind == "random":  # sparse, dense, or both flags on one step
        p = rng.choice([0.01, 0.2, 0.7])
        term[:] = rng.random(n) < p
        trunc[:] = rng.random(n) < p
    elif kind != "no_boundary":
        # RLlib's learner layout: chunks of L real steps + 1 bootstrap step; the flag sits on
        # the last real step.
        last_real = []
        pos = 0
        while pos < n:
            length = int(rng.integers(1, 40))
            if pos + length - 1 < n:
                last_real.append(pos + length - 1)
            pos += length + 1
        last_real = np.asarray(last_real, dtype=np.int64)
        if kind == "all_terminated":
            term[last_real] = True
        elif kind == "all_truncated":
            trunc[last_real] = True
        else:
            half = rng.random(last_real.size) < 0.5
            term[last_real[half]] = True
            trunc[last_real[~half]] = True
    return term, trunc


def _inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=n).astype(np.float32)
    rewards = rng.normal(size=n).astype(np.float32)
    return values, rewards


def _rates(gamma, lambda_, rng: np.random.Generator) -> tuple[float, float]:
    gamma = float(rng.uniform(0.5, 1.0)) if gamma == "random" else gamma
    lambda_ = float(rng.uniform(0.0, 1.0)) if lambda_ == "random" else lambda_
    return gamma, lambda_


def _target_rel_err(actual: np.ndarray, expected: np.ndarray, values: np.ndarray) -> float:
    """Max elementwise error relative to the magnitudes summed into a value target."""
    if actual.size == 0:
        return 0.0
    scale = np.abs(expected) + np.abs(values) + 1e-6
    return float(np.max(np.abs(actual.astype(np.float64) - expected) / scale))


def _adv_rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """Max elementwise relative error, with a floor at 1e-6 of the largest advantage."""
    if actual.size == 0:
        return 0.0
    floor = 1e-6 * max(1.0, float(np.max(np.abs(expected))))
    return float(np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), floor)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("gamma", "lambda_"), RATES)
def test_matches_rllib_and_reference(layout, n, gamma, lambda_):
    seed = zlib.crc32(f"{layout}-{n}-{gamma}-{lambda_}".encode())
    rng = np.random.default_rng(seed)
    gamma, lambda_ = _rates(gamma, lambda_, rng)
    term, trunc = _layout(layout, n, rng)
    values, rewards = _inputs(n, seed)

    targets = compute_value_targets(values, rewards, term, trunc, gamma, lambda_)
    assert targets.dtype == np.float32 and targets.shape == (n,)
    expected = rllib_compute_value_targets(values, rewards, term, trunc, gamma, lambda_)
    assert _target_rel_err(targets, expected, values) < 1e-5
    reference = compute_value_targets_reference(values, rewards, term, trunc, gamma, lambda_)
    assert _target_rel_err(targets, reference, values) < 1e-5

    advantages = compute_advantages(values, rewards, term, trunc, gamma, lambda_)
    assert advantages.dtype == np.float64
    ref_adv = compute_advantages_reference(values, rewards, term, trunc, gamma, lambda_)
    assert _adv_rel_err(advantages, ref_adv) < 1e-9


@pytest.mark.parametrize("layout", ("rllib_chunks", "random", "no_boundary"))
def test_long_batch_matches_rllib(layout):
    """50k steps (thousands of chunks, or one long segment) in one call."""
    n = 50_003
    rng = np.random.default_rng(7)
    term, trunc = _layout(layout, n, rng)
    values, rewards = _inputs(n, 7)
    targets = compute_value_targets(values, rewards, term, trunc, 0.99, 0.95)
    expected = rllib_compute_value_targets(values, rewards, term, trunc, 0.99, 0.95)
    assert _target_rel_err(targets, expected, values) < 1e-5


@pytest.mark.parametrize("flag_dtype", (bool, np.float32, np.float64, np.int64))
def test_flag_dtypes(flag_dtype):
    rng = np.random.default_rng(3)
    term, trunc = _layout("rllib_chunks", 700, rng)
    values, rewards = _inputs(700, 3)
    expected = rllib_compute_value_targets(values, rewards, term, trunc, 0.99, 0.9)
    targets = compute_value_targets(
        values, rewards, term.astype(flag_dtype), trunc.astype(flag_dtype), 0.99, 0.9
    )
    assert _target_rel_err(targets, expected, values) < 1e-5


def test_torch_input_gives_numpy_float32():
    rng = np.random.default_rng(4)
    term, trunc = _layout("rllib_chunks", 999, rng)
    values, rewards = _inputs(999, 4)
    expected = rllib_compute_value_targets(values, rewards, term, trunc, 0.98, 0.9)
    targets = compute_value_targets(
        torch.from_numpy(values).requires_grad_(True),
        torch.from_numpy(rewards),
        torch.from_numpy(term),
        torch.from_numpy(trunc.astype(np.float32)),
        0.98,
        0.9,
    )
    assert isinstance(targets, np.ndarray) and targets.dtype == np.float32
    assert _target_rel_err(targets, expected, values) < 1e-5


def test_float64_values_round_like_rllib():
    rng = np.random.default_rng(5)
    term, trunc = _layout("rllib_chunks", 300, rng)
    values, rewards = _inputs(300, 5)
    values = values.astype(np.float64) / 3.0
    expected = rllib_compute_value_targets(values, rewards, term, trunc, 0.99, 0.95)
    targets = compute_value_targets(values, rewards, term, trunc, 0.99, 0.95)
    assert _target_rel_err(targets, expected, values) < 1e-6


@pytest.mark.parametrize(
    ("gamma", "lambda_"),
    ((1e-30, 1e-10), (1e-5, 1e-36), (1e-160, 1e-160), (1e-300, 1.0), (5e-324, 1.0)),
)
def test_tiny_ratio(gamma, lambda_):
    """gamma*lambda_ down to the denormal range: powers that underflow are exact zeros."""
    rng = np.random.default_rng(6)
    term, trunc = _layout("rllib_chunks", 20_000, rng)
    values, rewards = _inputs(20_000, 6)
    advantages = compute_advantages(values, rewards, term, trunc, gamma, lambda_)
    assert np.all(np.isfinite(advantages))
    reference = compute_advantages_reference(values, rewards, term, trunc, gamma, lambda_)
    assert _adv_rel_err(advantages, reference) < 1e-12


def test_hand_computed_example():
    """Two chunks in RLlib's learner layout (each ends with its bootstrap step).

    Chunk 1 terminates after 3 steps, chunk 2 is cut (truncated) after 2 steps; gamma = 0.5,
    lambda_ = 0.5, so c = 0.25.

    chunk 1: r = [1, 1, 1, 0], V = [0.5, 0.5, 0.5, 0.5(bootstrap, unused)], terminated at t=2
        delta_2 = 1 - 0.5 = 0.5 (no bootstrap)     A_2 = 0.5
        delta_1 = 1 + 0.5*0.5 - 0.5 = 0.75         A_1 = 0.75 + 0.25*0.5 = 0.875
        delta_0 = 0.75                              A_0 = 0.75 + 0.25*0.875 = 0.96875
    chunk 2: r = [1, 1, 0], V = [1, 2, 3 (= V(final obs))], truncated at t=1
        delta_1 = 1 + 0.5*3 - 2 = 0.5 (bootstrap, recursion stops)   A_1 = 0.5
        delta_0 = 1 + 0.5*2 - 1 = 1.0                                 A_0 = 1 + 0.25*0.5 = 1.125
    Bootstrap steps (masked from the loss) carry no flag, so RLlib's recursion runs through
    them: chunk 1's sees chunk 2's first value and advantage,
    A = (0 + 0.5*1 - 0.5) + 0.25*1.125 = 0.28125; the last one sees nothing: A = 0 - 3 = -3.
    """
    values = np.array([0.5, 0.5, 0.5, 0.5, 1.0, 2.0, 3.0], dtype=np.float32)
    rewards = np.array([1, 1, 1, 0, 1, 1, 0], dtype=np.float32)
    term = np.array([0, 0, 1, 0, 0, 0, 0], dtype=bool)
    trunc = np.array([0, 0, 0, 0, 0, 1, 0], dtype=bool)
    advantages = compute_advantages(values, rewards, term, trunc, 0.5, 0.5)
    expected = np.array([0.96875, 0.875, 0.5, 0.28125, 1.125, 0.5, -3.0])
    np.testing.assert_allclose(advantages, expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(
        compute_value_targets(values, rewards, term, trunc, 0.5, 0.5),
        expected + values,
        atol=1e-6,
    )


def test_one_long_segment_allocates_only_the_output():
    """200k steps without any boundary: float32 values and bool flags are read in place."""
    n = 200_000
    values, rewards = _inputs(n, 8)
    flags = np.zeros(n, dtype=bool)
    compute_value_targets(values[:8], rewards[:8], flags[:8], flags[:8], 0.999, 0.99)  # load
    tracemalloc.start()
    try:
        targets = compute_value_targets(values, rewards, flags, flags, 0.999, 0.99)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The float32 result (4 B/step) and no [N] float64 temporary (8 B/step).
    assert peak < 4 * n + 65536, f"peak {peak / 1e6:.2f} MB for {n} steps"
    reference = compute_value_targets_reference(values, rewards, flags, flags, 0.999, 0.99)
    assert _target_rel_err(targets, reference, values) < 1e-5


@pytest.mark.parametrize("c", (0.0, 0.3, 1.0))
def test_discounted_suffix_sum(c):
    rng = np.random.default_rng(10)
    x = rng.normal(size=2000)
    stops = rng.random(2000) < 0.05
    expected = np.empty_like(x)
    acc = 0.0
    for t in range(x.size - 1, -1, -1):
        acc = x[t] + (0.0 if stops[t] else c * acc)
        expected[t] = acc
    np.testing.assert_allclose(discounted_suffix_sum(x, stops, c), expected, rtol=1e-12, atol=1e-12)


def test_empty_batch():
    empty = np.zeros(0, dtype=np.float32)
    flags = np.zeros(0, dtype=bool)
    assert compute_value_targets(empty, empty, flags, flags, 0.99, 0.95).shape == (0,)


@pytest.mark.parametrize(("gamma", "lambda_"), ((1.01, 0.9), (0.99, -0.1), (float("nan"), 0.9)))
def test_rejects_rates_outside_unit_interval(gamma, lambda_):
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        compute_advantages(x, x, x, x, gamma, lambda_)


def test_rejects_mismatched_lengths():
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="4, 3, 4, 4 steps"):
        compute_advantages(x, x[:3], x, x, 0.99, 0.95)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiled_kernel_is_bit_identical_to_reference(layout):
    """The numba loop does the reference loop's float64 operations in the same order."""
    n = 3001
    rng = np.random.default_rng(zlib.crc32(layout.encode()))
    term, trunc = _layout(layout, n, rng)
    values, rewards = _inputs(n, 11)
    advantages = compute_advantages(values, rewards, term, trunc, 0.99, 0.95)
    reference = compute_advantages_reference(values, rewards, term, trunc, 0.99, 0.95)
    np.testing.assert_array_equal(advantages, reference)
    targets = compute_value_targets(values, rewards, term, trunc, 0.99, 0.95)
    expected = compute_value_targets_reference(values, rewards, term, trunc, 0.99, 0.95)
    np.testing.assert_array_equal(targets, expected)


def test_kernel_backend_reports_numba():
    """numba is a dependency: the compiled kernel loads (doctor and `gae/compiled` say so)."""
    assert kernel_backend() == "numba"


@pytest.fixture
def numba_broken(monkeypatch):
    """As if numba failed to import: the next load builds again and fails."""

    def fail() -> gae_compiled.CompiledKernels:
        raise ImportError("No module named 'numba'")

    gae_compiled.load.cache_clear()
    monkeypatch.setattr(gae_compiled, "_build", fail)
    yield
    monkeypatch.undo()
    gae_compiled.load.cache_clear()


def test_without_numba_the_error_says_how_to_fix_it(numba_broken):
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(ImportError, match="No module named 'numba'.*Fix: pip install 'numba"):
        compute_value_targets(x, x, x, x, 0.99, 0.95)
    assert kernel_backend() == "unavailable"
