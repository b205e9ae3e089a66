"""Exact, loop-free generalized advantage estimation (GAE) over flat episode batches.

Same contract as RLlib's ``ray.rllib.utils.postprocessing.value_predictions.compute_value_targets``
(Schulman et al. 2016, https://arxiv.org/abs/1506.02438), computed without a Python loop over
time steps and without truncating the geometric filter.

Recurrence, for t = N-1 .. 0 (``A_N = 0``)::

    delta_t = r_t + gamma * (1 - terminated_t) * V_{t+1} - V_t       (V_N = 0)
    A_t     = delta_t + c * (1 - terminated_t) * (1 - truncated_t) * A_{t+1},   c = gamma*lambda

How it is vectorized (all float64, O(N) memory whatever the segment lengths):

1. Without resets, ``S = suffix(x)`` with ``S_t = x_t + c S_{t+1}`` is a linear map. Cut the
   array into rows of ``K`` steps: inside a row it is one small matmul with the ``K x K``
   Toeplitz matrix ``c^(j-i)`` (entries <= 1, so nothing overflows); the rows are then chained
   by the same recurrence on the ``N/K`` row-start values with coefficient ``c^K``, solved
   recursively.
2. Resets (a step that is terminated or truncated stops the recursion) are a sparse
   correction of the input: ``A = suffix(delta - w)`` where ``w_e = c * A_{e+1}`` at each stop
   ``e``. ``A`` at a segment start needs only ``S = suffix(delta)`` at segment starts:
   ``A_s = S_s - c^L S_{s+L}`` for a segment of length ``L``, so the correction costs O(#segments).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg.blas import dger
from scipy.signal import lfilter

__all__ = ["compute_value_targets", "compute_advantages", "discounted_suffix_sum"]

_BLOCK = 8
_SMALL = 16384
_TOEPLITZ_CACHE: dict[tuple[float, int], tuple[np.ndarray, np.ndarray]] = {}


def _toeplitz(c: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``T[j, i] = c^(j-i)`` for ``j >= i`` (else 0), and ``c^(k-i)`` for ``i < k``."""
    key = (c, k)
    hit = _TOEPLITZ_CACHE.get(key)
    if hit is None:
        powers = np.power(c, np.arange(k + 1, dtype=np.float64))
        i = np.arange(k)
        diff = i[:, None] - i[None, :]
        t = np.where(diff >= 0, powers[np.clip(diff, 0, k)], 0.0)
        hit = (t, powers[k - i].copy())
        if len(_TOEPLITZ_CACHE) > 64:
            _TOEPLITZ_CACHE.clear()
        _TOEPLITZ_CACHE[key] = hit
    return hit


def _row_buffer(n: int, k: int) -> np.ndarray:
    """``[ceil(n/k) * k]`` float64 buffer whose tail past ``n`` is zero.

    ``np.empty`` rather than ``np.zeros``: calloc'ed pages fault in on first write, which
    costs more than the whole scan at 1M steps.
    """
    m = -(-n // k)
    buf = np.empty(m * k, dtype=np.float64)
    buf[n:] = 0.0
    return buf


def _as_rows(x: np.ndarray, k: int) -> np.ndarray:
    """Zero-pads the 1-D array ``x`` to a multiple of ``k`` (float64 copy); ``[M, k]``."""
    n = x.shape[0]
    buf = _row_buffer(n, k)
    buf[:n] = x
    return buf.reshape(-1, k)


def _suffix_rows(rows: np.ndarray, c: float) -> np.ndarray:
    """Reset-free suffix sum over the flattened ``[M, K]`` float64 array ``rows`` (in a new array)."""
    m, k = rows.shape
    t, carry_pow = _toeplitz(c, k)
    local = rows @ t
    if m > 1:
        # Chain the rows: the value at the start of row b+1 feeds row b with weight c^(K-i).
        starts = _suffix_1d(np.ascontiguousarray(local[:, 0]), c**k)
        next_start = np.empty(m, dtype=np.float64)
        next_start[:-1] = starts[1:]
        next_start[-1] = 0.0
        # In-place rank-1 update local += next_start (x) carry_pow; local.T is the
        # column-major [K, M] view BLAS expects.
        dger(1.0, carry_pow, next_start, a=local.T, overwrite_a=1)
    return local


def _suffix_1d(x: np.ndarray, c: float) -> np.ndarray:
    """Reset-free ``S_t = x_t + c S_{t+1}`` for a 1-D float64 array."""
    n = x.shape[0]
    if c == 0.0 or n == 0:
        return x.astype(np.float64, copy=True)
    if n <= _SMALL:
        return lfilter([1.0], [1.0, -c], x[::-1])[::-1].copy()
    return _suffix_rows(_as_rows(x, _BLOCK), c).reshape(-1)[:n]


def discounted_suffix_sum(x: Any, stops: Any, c: float) -> np.ndarray:
    """``y_t = x_t + c * (1 - stops_t) * y_{t+1}`` with ``y_N = 0``.

    Args:
        x: ``[N]`` float array.
        stops: ``[N]`` bool array; ``True`` cuts the recursion after step ``t``.
        c: discount per step, in ``[0, 1]``.

    Returns:
        ``[N]`` float64 array.
    """
    x = np.asarray(x, dtype=np.float64)
    stops = np.asarray(stops, dtype=bool)
    n = x.shape[0]
    if n == 0 or c == 0.0:
        return x.copy()
    rows = _as_rows(x.copy(), _BLOCK)
    ends = np.flatnonzero(stops[:-1])
    if ends.size:
        _inject_resets(rows, ends, n, c)
    return _suffix_rows(rows, c).reshape(-1)[:n]


def _inject_resets(rows: np.ndarray, ends: np.ndarray, n: int, c: float) -> None:
    """Subtracts ``c * A_{e+1}`` at each cut ``e`` (in place) so a reset-free sum yields ``A``.

    ``ends`` are the cut positions (excluding ``n-1``), strictly increasing.
    """
    m, k = rows.shape
    t, carry_pow = _toeplitz(c, k)
    # Reset-free suffix sums S at the segment starts 0, e+1, ...: row-local part plus the
    # chained row starts (same algebra as _suffix_rows, evaluated only where needed).
    row_starts = _suffix_1d(rows @ t[:, 0], c**k)
    next_row_start = np.empty(m, dtype=np.float64)
    next_row_start[:-1] = row_starts[1:]
    next_row_start[-1] = 0.0
    seg_starts = np.concatenate(([0], ends + 1))
    r, o = np.divmod(seg_starts, k)
    s_at = np.einsum("sk,ks->s", rows[r], t[:, o]) + carry_pow[o] * next_row_start[r]
    # A at a segment start s of length L: S_s - c^L * S_{s+L}  (S_n = 0).
    lengths = np.diff(np.concatenate((seg_starts, [n])))
    s_next = np.zeros_like(s_at)
    s_next[:-1] = s_at[1:]
    a_start = s_at - np.power(c, lengths) * s_next
    flat = rows.reshape(-1)
    flat[ends] -= c * a_start[1:]


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor without importing torch here
        return x.detach().cpu().numpy()
    return np.asarray(x)


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
        values: ``[N]`` value predictions ``V(s_t)``.
        rewards: ``[N]`` rewards ``r_t``.
        terminateds: ``[N]`` bool/0-1; ``True`` at a step after which there is no next state
            (no bootstrap from ``V_{t+1}``, recursion stops).
        truncateds: ``[N]`` bool/0-1; ``True`` at a step that ends a chunk whose next state
            exists (bootstrap from ``V_{t+1}``, recursion stops).
        gamma: discount in ``[0, 1]``.
        lambda_: GAE lambda in ``[0, 1]``.

    Returns:
        ``[N]`` float64 advantages.
    """
    v = _to_numpy(values).reshape(-1)
    n = v.shape[0]
    term = _to_numpy(terminateds).astype(bool, copy=False).reshape(-1)
    trunc = _to_numpy(truncateds).astype(bool, copy=False).reshape(-1)
    c = float(gamma) * float(lambda_)

    # delta_t = r_t + gamma * (1 - term_t) * V_{t+1} - V_t, in float64 (as RLlib), written
    # straight into the padded rows.
    buf = _row_buffer(n, _BLOCK)
    delta = buf[:n]
    if n:
        np.multiply(v[1:], gamma, out=delta[:-1], dtype=np.float64)
        delta[-1] = 0.0
        np.copyto(delta, 0.0, where=term)
        np.add(delta, _to_numpy(rewards).reshape(-1), out=delta, dtype=np.float64)
        np.subtract(delta, v, out=delta, dtype=np.float64)
    if n == 0 or c == 0.0:
        return delta.copy()
    rows = buf.reshape(-1, _BLOCK)
    ends = np.flatnonzero((term | trunc)[:-1])
    if ends.size:
        _inject_resets(rows, ends, n, c)
    return _suffix_rows(rows, c).reshape(-1)[:n]


def compute_value_targets(
    values: Any,
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """GAE value targets ``A_t + V_t`` (float32), a drop-in for RLlib's function of this name.

    Arguments as in :func:`compute_advantages`. Returns ``[N]`` float32 (numpy, also for
    torch input). Rounded like RLlib: advantages to float32 first, then ``+ values`` in float32.
    """
    adv = compute_advantages(values, rewards, terminateds, truncateds, gamma, lambda_)
    vals = _to_numpy(values).reshape(-1).astype(np.float32, copy=False)
    out = adv.astype(np.float32)
    out += vals
    return out
