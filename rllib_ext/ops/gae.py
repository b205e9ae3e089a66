"""Exact, loop-free generalized advantage estimation (GAE) over flat episode batches.

Same contract as RLlib's ``ray.rllib.utils.postprocessing.value_predictions.compute_value_targets``
(Schulman et al. 2016, https://arxiv.org/abs/1506.02438), computed without a Python loop over
time steps and without truncating the geometric filter.

Two kernels behind one API (``kernel=`` on every function):

* ``"numba"`` (:mod:`rllib_ext.ops.gae_compiled`): one compiled backward pass, bit-identical to
  the reference loop, about 2x the time of copying the arrays once. The default where numba
  is installed (it is a dependency; ``kernel="auto"`` picks it).
* ``"numpy"``: the blocked scan below, for platforms without numba. Same results up to
  rounding (float64 sums in a different order).

Recurrence, for t = N-1 .. 0 (``A_N = 0``)::

    delta_t = r_t + gamma * (1 - terminated_t) * V_{t+1} - V_t       (V_N = 0)
    A_t     = delta_t + c * (1 - terminated_t) * (1 - truncated_t) * A_{t+1},   c = gamma*lambda

Both kinds of episode end are a *stop*: the recursion does not cross it.

The numpy kernel, vectorized (float64 throughout, O(N) time and memory whatever the segment lengths):

1. Blocks. The flat array is cut into rows of ``K = 8`` steps. Without stops, the suffix sum
   inside a row is one matmul with the ``K x K`` Toeplitz matrix ``c^(j-i)`` (entries <= 1,
   nothing overflows). The rows are chained by the same recurrence one level up, on the
   ``N/K`` row sums with ratio ``c^K``, solved by the same function (a loop over ~log8(N)
   levels, no loop over steps); the next row's value enters each row through its last step.
2. Stops as a sparse correction of the input. ``A = S(x - w)``, where ``S`` is the stop-free
   suffix sum of step 1 and ``w_e = c * A_{e+1}`` at each stop ``e``: subtracting it cancels
   exactly what would flow across the stop. ``A`` at a segment start ``s`` (length ``L``) is
   ``S_s - c^L S_{s+L}``, so only ``#stops`` values of ``S`` and powers are needed: ``S`` at a
   segment start is the rest of its row plus ``c^(K-o)`` times the row-level ``S``.
3. The corrected row sums (``O(#stops)`` updates) give ``A`` at every row start with a second
   row-level scan; one last matmul over the corrected rows gives ``A`` everywhere.

Per call the N-sized work is: the deltas (3 passes), one gemv (row sums), one strided column
update, one ``[N/8, 8] @ [8, 8]`` matmul, one float32 output pass. Everything else is
``O(N/8 + #stops)``. Peak memory is about 2.5 x 8 bytes per step with sparse stops (input
and output of the last matmul, float32 result), about 9.5 x 8 bytes when every step is a stop.

BLAS calls go in batches of ``_BLAS_ROWS`` rows (numpy loops over the batch in C), so each
call stays below OpenBLAS's multithreading threshold: threaded calls on these small shapes
gain little on 2 cores and, when another process holds the other core, stall for whole
scheduler slices (measured: 0.5 ms median -> 12 ms).

Numerics: powers ``c^d`` below ``1e-250`` (and such ``c``) are treated as 0. That keeps
denormals out of the BLAS kernels (denormal operands are slow on x86); a dropped term is below
``1e-250 * max|A|``, far under float32 resolution of any value target.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

import numpy as np

from rllib_ext.ops import gae_compiled

__all__ = [
    "KERNEL_CHOICES",
    "compute_advantages",
    "compute_value_targets",
    "discounted_suffix_sum",
    "kernel_backend",
]

Kernel = Literal["auto", "numba", "numpy"]
KERNEL_CHOICES: tuple[str, ...] = ("auto", "numba", "numpy")

_BLOCK = 8
"""Row width K of the blocked scan (the gemm is memory-bound; wider rows only add flops)."""
_BASE = 64
"""A level this short is solved as a single row (no further recursion)."""
_BLAS_ROWS = 2048
"""Rows per BLAS call: 2048 * 8 * 8 = 131072 multiply-adds per gemm, under OpenBLAS's
threading threshold (262144 by default), so every call runs on the calling thread."""
_GATHER = 16384
"""Stops handled per gather block (bounds the ``[block, K]`` temporaries)."""
_FLUSH = 1e-250
"""Powers of c below this are set to 0 (see module docstring)."""


@lru_cache(maxsize=64)
def _toeplitz(c: float, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(T, T.T, p)`` for ratio ``c`` and row width ``k``. Read-only, cached.

    ``T[j, i] = c^(j-i)`` for ``j >= i`` else 0 (``[k, k]``),
    ``T.T`` C-contiguous (row ``o`` holds the weights of a suffix sum from offset ``o``) and
    ``p[d] = c^d`` for ``d = 0..k``.
    """
    powers = np.power(c, np.arange(k + 1, dtype=np.float64))
    powers[powers < _FLUSH] = 0.0
    i = np.arange(k)
    diff = i[:, None] - i[None, :]
    t = np.where(diff >= 0, powers[np.clip(diff, 0, k)], 0.0)
    tt = np.ascontiguousarray(t.T)
    for a in (t, tt, powers):
        a.setflags(write=False)
    return t, tt, powers


def _layout(n: int) -> tuple[int, int]:
    """``(K, P)``: row width and padded length of a level with ``n`` values.

    ``P`` is a multiple of ``K``, and of ``K * _BLAS_ROWS`` once there are more rows than one
    BLAS batch holds, so the rows reshape into equal batches.
    """
    if n <= _BASE:
        k = max(_BLOCK, -(-n // _BLOCK) * _BLOCK)
        return k, k
    rows = -(-n // _BLOCK)
    if rows > _BLAS_ROWS:
        rows = -(-rows // _BLAS_ROWS) * _BLAS_ROWS
    return _BLOCK, rows * _BLOCK


def _row_sums(rows: np.ndarray, powers: np.ndarray) -> np.ndarray:
    """``g[b] = sum_i c^i rows[b, i]``, laid out for the next level plus one trailing zero.

    The buffer has ``_layout(m)[1] + 1`` entries, zero past ``m``: the next level scans the
    first ``_layout(m)[1]``; the extra zero is ``A`` one past the last row. One gemv per
    ``_BLAS_ROWS`` rows (numpy loops over the batches in C).
    """
    m, k = rows.shape
    g = np.empty(_layout(m)[1] + 1, dtype=np.float64)
    g[m:] = 0.0
    if m > _BLAS_ROWS:
        b = m // _BLAS_ROWS
        np.matmul(rows.reshape(b, _BLAS_ROWS, k), powers[:k], out=g[:m].reshape(b, _BLAS_ROWS))
    else:
        np.matmul(rows, powers[:k], out=g[:m])
    return g


def _suffix_in_row(
    rows: np.ndarray, row: np.ndarray, off: np.ndarray, tt: np.ndarray
) -> np.ndarray:
    """``sum_{j >= off} c^(j - off) rows[row, j]`` per entry: the stop-free sum to the row end.

    Gathers ``[E, K]`` blocks of at most ``_GATHER`` entries, so the temporaries stay small
    even when every step is a stop.
    """
    out = np.empty(row.size, dtype=np.float64)
    for lo in range(0, row.size, _GATHER):
        hi = lo + _GATHER
        np.einsum(
            "ij,ij->i",
            np.take(rows, row[lo:hi], axis=0),
            np.take(tt, off[lo:hi], axis=0),
            out=out[lo:hi],
        )
    return out


def _row_scan(rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``rows @ T`` (the stop-free suffix sum inside every row), flat ``[M * K]`` float64.

    Batched like :func:`_row_sums`. (An in-place BLAS ``trmm`` is twice as fast on an idle
    machine, but OpenBLAS threads it for ``K >= 8``: on a loaded 2-core box its median went
    from 0.5 to 12 ms, while these batched gemm calls stayed at 1.1-1.3 ms.)
    """
    m, k = rows.shape
    out = np.empty(m * k, dtype=np.float64)
    if m > _BLAS_ROWS:
        b = m // _BLAS_ROWS
        np.matmul(rows.reshape(b, _BLAS_ROWS, k), t, out=out.reshape(b, _BLAS_ROWS, k))
    else:
        np.matmul(rows, t, out=out.reshape(m, k))
    return out


def _scan_free(x: np.ndarray, n: int, c: float) -> np.ndarray:
    """Stop-free ``S_t = x_t + c * S_{t+1}`` (``S_n = 0``).

    Args:
        x: ``[P]`` float64, ``P = _layout(n)[1]``, zero past ``n``. Overwritten.
        n: number of real values.
        c: ratio in ``[0, 1]``.

    Returns:
        ``[P]`` float64 ``S`` (``x`` itself when ``c`` is 0), zero past ``n``.
    """
    if c < _FLUSH:
        return x
    k, p = _layout(n)
    m = p // k
    t, _, powers = _toeplitz(c, k)
    rows = x.reshape(m, k)
    if m > 1:
        s_row = _scan_free(_row_sums(rows, powers)[:-1], m, float(powers[k]))
        # The next row's start value enters through the row's last step.
        rows[:-1, k - 1] += c * s_row[1:m]
    return _row_scan(rows, t)


def _scan(x: np.ndarray, n: int, ends: np.ndarray, c: float) -> np.ndarray:
    """``A_t = x_t + c * [t not in ends] * A_{t+1}`` (``A_n = 0``).

    Stops become a sparse correction of ``x`` (``x_e -= c * A_{e+1}``); ``A`` at the segment
    starts comes from the stop-free sums ``S``: ``A_s = S_s - c^L S_{s+L}`` for a segment of
    length ``L``. ``S_s`` and ``c^L`` are needed only at the ``#stops`` segment starts.

    Args:
        x: ``[P]`` float64 with ``P = _layout(n)[1]``, zero past ``n``. Overwritten.
        n: number of real values.
        ends: sorted int positions in ``[0, n - 1)`` after which the recursion stops.
        c: ratio in ``[0, 1]``.

    Returns:
        ``[P]`` float64 ``A`` (``x`` itself when ``c`` is 0), zero past ``n``.
    """
    if c < _FLUSH:
        return x
    if not ends.size:
        return _scan_free(x, n, c)
    k, p = _layout(n)
    m = p // k
    t, tt, powers = _toeplitz(c, k)
    rows = x.reshape(m, k)
    starts = ends + 1
    start_row, start_off = np.divmod(starts, k)
    # S at the segment starts: rest of the row, then the stop-free sum from the next row on.
    s_start = _suffix_in_row(rows, start_row, start_off, tt)
    if m > 1:
        g = _row_sums(rows, powers)
        s_row = np.zeros(m + 1, dtype=np.float64)  # s_row[m] = 0: S one past the last row
        s_row[:m] = _scan_free(g[:-1].copy(), m, float(powers[k]))[:m]
        start_row += 1
        from_next_row = np.take(s_row, start_row)
        from_next_row *= np.take(powers, k - start_off)
        s_start += from_next_row
        del s_row, from_next_row
    del start_row, start_off
    # A at the segment starts, in place of s_start. Each segment runs to the next start
    # (the last one to n, where S_n = 0).
    next_term = np.power(c, np.diff(starts, append=n).astype(np.float64))
    del starts
    next_term[next_term < _FLUSH] = 0.0
    next_term[:-1] *= s_start[1:]
    next_term[-1] = 0.0
    correction = s_start
    correction -= next_term
    correction *= c  # c * A_{e+1}
    del next_term

    end_row, end_off = np.divmod(ends, k)
    # A stop on a row's last step cuts the carry into that row: no carry and no correction
    # (the two would cancel up to rounding).
    at_row_end = end_row[end_off == k - 1]
    if m > 1:
        # The row sums of the corrected input, whose stop-free scan is A at the row starts.
        weighted = np.take(powers, end_off)
        weighted *= correction
        np.subtract.at(g, end_row, weighted)
        del weighted
    del end_row
    correction[end_off == k - 1] = 0.0
    x[ends] -= correction
    if m > 1:
        a_row = _scan_free(g[:-1], m, float(powers[k]))
        carry = np.empty(m, dtype=np.float64)
        np.multiply(a_row[1:m], c, out=carry[:-1])
        carry[-1] = 0.0
        carry[at_row_end] = 0.0
        rows[:, k - 1] += carry
        del a_row, carry
    return _row_scan(rows, t)


def _check_rate(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(
            f"{name}={value!r} is outside [0, 1]; the scan needs gamma*lambda_ <= 1. "
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


def _compiled(kernel: str) -> gae_compiled.CompiledKernels | None:
    """The numba kernels for ``kernel`` ("auto": where available), ``None`` for numpy."""
    if kernel == "numpy":
        return None
    if kernel not in KERNEL_CHOICES:
        raise ValueError(
            f"kernel={kernel!r} is not one of {KERNEL_CHOICES}. Fix: pass kernel='auto' (numba where "
            "installed, else numpy), 'numba' or 'numpy'."
        )
    compiled = gae_compiled.load()
    if compiled is None and kernel == "numba":
        raise ValueError(
            "kernel='numba' but numba is not importable here (or failed to compile). "
            "Fix: pip install numba, or pass kernel='auto' to fall back to the numpy scan."
        )
    return compiled


def kernel_backend(kernel: Kernel = "auto") -> str:
    """Which kernel ``kernel`` resolves to in this process: ``"numba"`` or ``"numpy"``."""
    return "numpy" if _compiled(kernel) is None else "numba"


def _stop_positions(term: np.ndarray, trunc: np.ndarray) -> np.ndarray:
    """Sorted indices where ``term | trunc``; both contiguous bool ``[N]``.

    Stops are usually sparse (one per episode chunk), so the scan runs over 8 flags per
    uint64 word and only the nonzero words are expanded: about 4x faster than ``flatnonzero``
    on the bool array at 1M steps. Dense stops take the plain route.
    """
    n = term.shape[0]
    n8 = n - n % 8
    words = term[:n8].view(np.uint64) | trunc[:n8].view(np.uint64)
    hit = np.flatnonzero(words)
    if hit.size > words.size // 16:
        return np.flatnonzero(term | trunc)
    if hit.size:
        flags = words[hit].view(np.bool_).reshape(-1, 8)
        word_pos, bit = np.nonzero(flags)
        body = hit[word_pos] * 8 + bit
    else:
        body = hit
    tail = np.flatnonzero(term[n8:] | trunc[n8:]) + n8
    return np.concatenate((body, tail)) if tail.size else body


def discounted_suffix_sum(x: Any, stops: Any, c: float, *, kernel: Kernel = "auto") -> np.ndarray:
    """``y_t = x_t + c * (1 - stops_t) * y_{t+1}`` with ``y_N = 0``.

    Args:
        x: ``[N]`` float array (numpy or torch).
        stops: ``[N]`` bool or 0/1 array; ``True`` cuts the recursion after step ``t``.
        c: ratio per step, in ``[0, 1]``.
        kernel: ``"auto"`` (numba where installed), ``"numba"`` or ``"numpy"``.

    Returns:
        ``[N]`` float64 numpy array.
    """
    c = _check_rate("c", c)
    x = _floats(x)
    stops = _flags(stops)
    n = x.shape[0]
    if stops.shape[0] != n:
        raise ValueError(f"x has {n} steps but stops has {stops.shape[0]}; pass equal lengths.")
    compiled = _compiled(kernel)
    if compiled is not None:
        out = np.empty(n, dtype=np.float64)
        compiled.suffix_sum(x, stops, c, out)
        return out
    _, p = _layout(n)
    buf = np.empty(p, dtype=np.float64)
    buf[:n] = x
    buf[n:] = 0.0
    ends = np.flatnonzero(stops[: max(n - 1, 0)])
    return _scan(buf, n, ends, c)[:n]


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
    *,
    kernel: Kernel = "auto",
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
        kernel: ``"auto"`` (numba where installed), ``"numba"`` or ``"numpy"``.

    Returns:
        ``[N]`` float64 numpy array (also for torch input).

    Raises:
        ValueError: for lengths that differ, ``gamma``/``lambda_`` outside ``[0, 1]`` or an
            unknown ``kernel``.
    """
    v, r, term, trunc, gamma, lambda_ = _checked(
        values, rewards, terminateds, truncateds, gamma, lambda_
    )
    n = v.shape[0]
    compiled = _compiled(kernel)
    if compiled is not None:
        adv = np.empty(n, dtype=np.float64)
        compiled.advantages(v, r, term, trunc, gamma, gamma * lambda_, adv)
        return adv
    _, p = _layout(n)
    buf = np.empty(p, dtype=np.float64)
    buf[n:] = 0.0
    if n == 0:
        return buf[:0]
    stops = _stop_positions(term, trunc)
    # delta = gamma * (1 - term) * V_{t+1} + r - V, in RLlib's float64 operation order (the
    # sum is commutative, so bit-identical to its td_residuals).
    delta = buf[:n]
    np.multiply(v[1:], gamma, out=delta[:-1], dtype=np.float64)
    delta[-1] = 0.0
    delta[stops[term[stops]]] = 0.0
    np.add(delta, r, out=delta, dtype=np.float64)
    np.subtract(delta, v, out=delta, dtype=np.float64)
    ends = stops[: np.searchsorted(stops, n - 1)]
    return _scan(buf, n, ends, gamma * lambda_)[:n]


def compute_value_targets(
    values: Any,
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    lambda_: float,
    *,
    kernel: Kernel = "auto",
) -> np.ndarray:
    """GAE value targets ``A_t + V_t`` (float32), a drop-in for RLlib's function of this name.

    Arguments as in :func:`compute_advantages`. Returns ``[N]`` float32 numpy (also for torch
    input), rounded like RLlib: advantages to float32 first, then ``+ values``.
    """
    compiled = _compiled(kernel)
    if compiled is not None:
        v, r, term, trunc, gamma, lambda_ = _checked(
            values, rewards, terminateds, truncateds, gamma, lambda_
        )
        out = np.empty(v.shape[0], dtype=np.float32)
        compiled.value_targets(v, r, term, trunc, gamma, gamma * lambda_, out)
        return out
    adv = compute_advantages(
        values, rewards, terminateds, truncateds, gamma, lambda_, kernel=kernel
    )
    v = _to_numpy(values)
    if v.dtype == np.float32:
        # One pass: the float32 loop casts adv first, then adds, as RLlib's float32 buffer does.
        return np.add(adv, v, dtype=np.float32)
    return (adv.astype(np.float32) + v).astype(np.float32, copy=False)
