"""The numba kernels of :mod:`rllib_ext.ops.compression_compiled` (imports numba at import).

Module-level functions so that numba's on-disk cache works (jitted closures are recompiled in
every process). Import this module only through :func:`rllib_ext.ops.compression_compiled.load`,
which falls back to torch ops where numba is missing.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 4096
"""Elements per encode/decode block (16 KB of float32: the block's signs stay in L1)."""


def _expand_table() -> np.ndarray:
    """``[256]`` uint64: byte ``b`` spread out, bit ``k`` of ``b`` -> bit 0 of byte ``k``."""
    table = np.zeros(256, dtype=np.uint64)
    for k in range(8):
        table |= ((np.arange(256, dtype=np.uint64) >> np.uint64(k)) & np.uint64(1)) << np.uint64(
            8 * k
        )
    return table


# error_model="numpy": no ZeroDivisionError branch per division (it blocks vectorizing).
# fastmath only in the encode sums, and only "reassoc", for the sum |c| reduction: c itself
# is one rounding (acc + g/p) that reassociation cannot change; inf/NaN still propagate.
_sum_jit = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
# No fastmath elsewhere: the decode must round identically on every rank and CPU.
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
SPREAD = np.uint64(0x0102040810204080)  # sum_i 2^(56 - 7i): byte i's bit 0 -> bit 56 + i
SHIFT = np.uint64(56)
EXPAND = _expand_table()


# The loops sit in small functions called on block slices: LLVM vectorizes these (and hoists
# the loop-invariant flags out of the loop), but not the same loops written inline in the block
# loop (measured 2.3 vs 6.5 ms per 6.25M).
@_sum_jit
def corrected_block(grad, precond, has_precond, acc, accumulate):  # pragma: no cover
    total = 0.0
    for i in range(acc.shape[0]):
        g = grad[i] / precond[i] if has_precond else grad[i]
        c = acc[i] + g if accumulate else g
        acc[i] = c
        total += abs(c)
    return total


@_jit
def pack(values, signs, words, packed):  # pragma: no cover - compiled
    m = values.shape[0]
    for i in range(m):
        signs[i] = np.signbit(values[i])
    for i in range(m, signs.shape[0]):
        signs[i] = 0
    # Eight 0/1 bytes as one little-endian word; the multiply gathers them into the top
    # byte without carries (see compression.pack_signs).
    for w in range(packed.shape[0]):
        packed[w] = (words[w] * SPREAD) >> SHIFT


@_jit
def encode(grad, precond, has_precond, acc, accumulate, packed):  # pragma: no cover
    n = grad.shape[0]
    signs = np.zeros(BLOCK, dtype=np.uint8)
    words = signs.view(np.uint64)
    total = 0.0
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        factor = precond[lo:hi] if has_precond else precond
        total += corrected_block(grad[lo:hi], factor, has_precond, acc[lo:hi], accumulate)
        pack(acc[lo:hi], signs, words, packed[lo // 8 : (hi + 7) // 8])
    return total


@_jit
def residual(acc, scale):  # pragma: no cover - compiled
    for i in range(acc.shape[0]):
        acc[i] = acc[i] - np.copysign(scale, acc[i])


@_jit
def or_rank_bits(row, rank, words):  # pragma: no cover - compiled
    # Byte b of rank r -> bit r of eight index bytes at once.
    r = np.uint64(rank)
    for j in range(row.shape[0]):
        words[j] |= EXPAND[row[j]] << r


@_jit
def lookup(table, idx, precond, has_precond, out):  # pragma: no cover - compiled
    if has_precond:
        for i in range(out.shape[0]):
            out[i] = table[idx[i]] * precond[i]
    else:
        for i in range(out.shape[0]):
            out[i] = table[idx[i]]


@_jit
def decode_mean(bits, table, precond, has_precond, out):  # pragma: no cover - compiled
    n = out.shape[0]
    idx = np.zeros(BLOCK, dtype=np.uint8)
    words = idx.view(np.uint64)
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        words[:] = 0
        for r in range(bits.shape[0]):
            or_rank_bits(bits[r, lo // 8 : (hi + 7) // 8], r, words)
        lookup(
            table,
            idx[: hi - lo],
            precond[lo:hi] if has_precond else precond,
            has_precond,
            out[lo:hi],
        )


@_jit
def add_row(m, e):  # pragma: no cover - compiled
    for j in range(m.shape[0]):
        m[j] = m[j] + e[j]


@_sum_jit
def dot(a, b):  # pragma: no cover - compiled
    total = np.float32(0.0)
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@_jit
def add_error_and_p(m, e, qt, p, has_error):  # pragma: no cover - compiled
    for i in range(m.shape[0]):
        if has_error:
            add_row(m[i], e[i])
        for k in range(qt.shape[0]):
            p[i, k] = dot(m[i], qt[k])


@_jit
def scaled(a, x, out):  # pragma: no cover - compiled
    for j in range(out.shape[0]):
        out[j] = a * x[j]


@_jit
def add_scaled(a, x, out):  # pragma: no cover - compiled
    for j in range(out.shape[0]):
        out[j] = out[j] + a * x[j]


@_jit
def split_row(m, e, approx):  # pragma: no cover - compiled
    for j in range(m.shape[0]):
        e[j] = m[j] - approx[j]
        m[j] = approx[j]


@_jit
def decode_with_error(m, e, p, qt, has_error):  # pragma: no cover - compiled
    approx = np.empty(m.shape[1], dtype=np.float32)
    for i in range(m.shape[0]):
        # Row i of P Qt, one rank-1 term at a time (vectorised over the row).
        scaled(p[i, 0], qt[0], approx)
        for k in range(1, qt.shape[0]):
            add_scaled(p[i, k], qt[k], approx)
        if has_error:
            split_row(m[i], e[i], approx)
        else:
            m[i] = approx
