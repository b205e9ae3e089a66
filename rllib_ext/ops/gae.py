"""Exact, loop-free generalized advantage estimation (GAE) over flat episode batches.

Same contract as RLlib's ``ray.rllib.utils.postprocessing.value_predictions.compute_value_targets``
(Schulman et al. 2016, https://arxiv.org/abs/1506.02438), computed without a Python loop over
time steps and without truncating the geometric filter.

The work is one compiled backward pass (:mod:`rllib_ext.ops.gae_compiled`, numba, a dependency
of rllib-ext): bit-identical to the plain loop of :mod:`rllib_ext.ops.gae_reference` (timings:
benchmarks/README.md, "GAE"). This module validates and converts the inputs.

Recurrence, for t = N-1 .. 0 (``A_N = 0``)::

    delta_t = r_t + gamma * (1 - terminated_t) * V_{t+1} - V_t       (V_N = 0)
    A_t     = delta_t + c * (1 - terminated_t) * (1 - truncated_t) * A_{t+1},   c = gamma*lambda

Both kinds of episode end are a *stop*: the recursion does not cross it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rllib_ext.ops import gae_compiled

__all__ = [
    "compute_advantages",
    "compute_value_targets",
    "discounted_suffix_sum",
    "kernel_backend",
]


def _check_rate(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(
            f"{name}={value!r} is outside [0, 1]; the recursion needs gamma*lambda_ <= 1. "
            f"Fix: pass a {name} between 0 and 1."
        )
    return value


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x).reshape(-1)


def _flags(x: Any) -> np.ndarray:
    arr = _to_numpy(x)
    return np.ascontiguousarray(arr) if arr.dtype == np.bool_ else arr.astype(bool)


def _floats(x: Any) -> np.ndarray:
    """``[N]`` contiguous float32 or float64 (other dtypes become float64)."""
    arr = _to_numpy(x)
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    return np.ascontiguousarray(arr)


def kernel_backend() -> str:
    """``"numba"`` when the compiled kernel loads in this process, ``"unavailable"`` when not.

    For reports (``rllib-ext doctor``); the GAE functions raise
    the ``ImportError`` instead.
    """
    try:
        gae_compiled.load()
    except ImportError:
        return "unavailable"
    return "numba"


def discounted_suffix_sum(x: Any, stops: Any, c: float) -> np.ndarray:
    """``y_t = x_t + c * (1 - stops_t) * y_{t+1}`` with ``y_N = 0``.

    Args:
        x: ``[N]`` float array (numpy or torch).
        stops: ``[N]`` bool or 0/1 array; ``True`` cuts the recursion after step ``t``.
        c: ratio per step, in ``[0, 1]``.

    Returns:
        ``[N]`` float64 numpy array.
    """
    compiled = gae_compiled.load()
    c = _check_rate("c", c)
    xs = _floats(x)
    flags = _flags(stops)
    n = xs.shape[0]
    if flags.shape[0] != n:
        raise ValueError(f"x has {n} steps but stops has {flags.shape[0]}; pass equal lengths.")
    out = np.empty(n, dtype=np.float64)
    compiled.suffix_sum(xs, flags, c, out)
    return out


def _checked(
    values: Any, rewards: Any, terminateds: Any, truncateds: Any, gamma: float, lambda_: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float]:
    """Validated ``(v, r, term, trunc, gamma, lambda_)``: float arrays, contiguous bool flags."""
    gamma = _check_rate("gamma", gamma)
    lambda_ = _check_rate("lambda_", lambda_)
    v = _floats(values)
    r = _floats(rewards)
    term = _flags(terminateds)
    trunc = _flags(truncateds)
    n = v.shape[0]
    if not r.shape[0] == term.shape[0] == trunc.shape[0] == n:
        raise ValueError(
            f"values, rewards, terminateds, truncateds have {n}, {r.shape[0]}, "
            f"{term.shape[0]}, {trunc.shape[0]} steps; pass one entry per step in each."
        )
    return v, r, term, trunc, gamma, lambda_


def compute_advantages(
    values: Any,
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """GAE advantages (float64) over a flat batch of concatenated episode chunks.

    Args:
        values: ``[N]`` value predictions ``V(s_t)`` (numpy or torch, any float dtype).
        rewards: ``[N]`` rewards ``r_t``.
        terminateds: ``[N]`` bool or 0/1; ``True`` at a step after which there is no next
            state: no bootstrap from ``V_{t+1}``, the recursion stops.
        truncateds: ``[N]`` bool or 0/1; ``True`` at a step that ends a chunk whose next state
            exists (``V_{t+1}`` is its value): bootstrap from it, the recursion stops.
        gamma: discount in ``[0, 1]``.
        lambda_: GAE lambda in ``[0, 1]``.

    Returns:
        ``[N]`` float64 numpy array (also for torch input).

    Raises:
        ValueError: for lengths that differ or ``gamma``/``lambda_`` outside ``[0, 1]``.
        ImportError: numba is missing or cannot compile here.
    """
    compiled = gae_compiled.load()
    v, r, term, trunc, gamma, lambda_ = _checked(
        values, rewards, terminateds, truncateds, gamma, lambda_
    )
    adv = np.empty(v.shape[0], dtype=np.float64)
    compiled.advantages(v, r, term, trunc, gamma, gamma * lambda_, adv)
    return adv


def compute_value_targets(
    values: Any,
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """GAE value targets ``A_t + V_t`` (float32), a drop-in for RLlib's function of this name.

    Arguments and errors as in :func:`compute_advantages`. Returns ``[N]`` float32 numpy (also
    for torch input), rounded like RLlib: advantages to float32 first, then ``+ values``.
    """
    compiled = gae_compiled.load()
    v, r, term, trunc, gamma, lambda_ = _checked(
        values, rewards, terminateds, truncateds, gamma, lambda_
    )
    out = np.empty(v.shape[0], dtype=np.float32)
    compiled.value_targets(v, r, term, trunc, gamma, gamma * lambda_, out)
    return out
