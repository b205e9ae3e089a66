"""The numba kernels behind :mod:`rllib_ext.ops.codecs.onebit` and :mod:`~.powersgd` (imports numba).

Load them only through :func:`rllib_ext.ops.codecs._select.select_kernels`, which falls back to
torch ops where numba is missing. Module-level functions so that numba's on-disk cache works
(jitted closures are recompiled in every process). Arrays are contiguous numpy views of CPU
tensors (``tensor.numpy()`` shares memory).

The torch ops of the 1-bit codec each make a pass over the bucket (add the residual, divide by
the preconditioner, sign bits, pack, scale, residual update, unpack, multiply back): about nine
passes. Fused here into three (timings: benchmarks/README.md, "Gradient compression"):

* :func:`encode` (one pass): ``c = acc + g / precond`` written to ``acc``, ``sum |c|``, and the
  sign bits of ``c`` packed 8 per byte (block by block while ``c`` is in L1);
* :func:`residual` (one pass): ``acc -= scale * sign(acc)``;
* :func:`decode_mean` (one pass): the mean over ranks of ``scale_r * sign_r``, times the
  preconditioner, from a ``2^W``-entry table (:func:`decode_table`; every rank decodes
  bit-identically).

PowerSGD's error feedback around a gradient matrix ``M [n, m]`` costs five torch passes
(``M += E``, ``P = M Q``, ``E = M``, ``M = P Q^T``, ``E -= M``); fused into two, row by row:

* :func:`add_error_and_p` (one pass): ``M += E`` and ``P = M Q`` (``Q`` given as ``Qt [r, m]``);
* :func:`decode_with_error` (one pass): ``M = P Qt`` and ``E = M_old - M``.

Their float32 sums run in another order than BLAS's (rounding-level differences); the decodes
have no fastmath, so ranks holding the same inputs decode bit-identically.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

Array = Any  # numba types the kernels from their numpy arguments; no static contract here

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
# loop (about 3x slower).
@_sum_jit
def corrected_block(
    grad: Array, precond: Array, has_precond: bool, acc: Array, accumulate: bool
) -> float:  # pragma: no cover
    total = 0.0
    for i in range(acc.shape[0]):
        g = grad[i] / precond[i] if has_precond else grad[i]
        c = acc[i] + g if accumulate else g
        acc[i] = c
        total += abs(c)
    return total


@_jit
def pack(
    values: Array, signs: Array, words: Array, packed: Array
) -> None:  # pragma: no cover - compiled
    m = values.shape[0]
    for i in range(m):
        signs[i] = np.signbit(values[i])
    for i in range(m, signs.shape[0]):
        signs[i] = 0
    # Eight 0/1 bytes as one little-endian word; the multiply gathers them into the top
    # byte without carries (see onebit.pack_signs).
    for w in range(packed.shape[0]):
        packed[w] = (words[w] * SPREAD) >> SHIFT


@_jit
def encode(
    grad: Array, precond: Array, has_precond: bool, acc: Array, accumulate: bool, packed: Array
) -> float:  # pragma: no cover
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
def residual(acc: Array, scale: np.float32) -> None:  # pragma: no cover - compiled
    for i in range(acc.shape[0]):
        acc[i] = acc[i] - np.copysign(scale, acc[i])


@_jit
def or_rank_bits(row: Array, rank: int, words: Array) -> None:  # pragma: no cover - compiled
    # Byte b of rank r -> bit r of eight index bytes at once.
    r = np.uint64(rank)
    for j in range(row.shape[0]):
        words[j] |= EXPAND[row[j]] << r


@_jit
def lookup(
    table: Array, idx: Array, precond: Array, has_precond: bool, out: Array
) -> None:  # pragma: no cover - compiled
    if has_precond:
        for i in range(out.shape[0]):
            out[i] = table[idx[i]] * precond[i]
    else:
        for i in range(out.shape[0]):
            out[i] = table[idx[i]]


@_jit
def decode_mean(
    bits: Array, table: Array, precond: Array, has_precond: bool, out: Array
) -> None:  # pragma: no cover - compiled
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
def add_row(m: Array, e: Array) -> None:  # pragma: no cover - compiled
    for j in range(m.shape[0]):
        m[j] = m[j] + e[j]


@_sum_jit
def dot(a: Array, b: Array) -> Any:  # pragma: no cover - compiled; a float32 sum
    total = np.float32(0.0)
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@_jit
def add_error_and_p(
    m: Array, e: Array, qt: Array, p: Array, has_error: bool
) -> None:  # pragma: no cover - compiled
    for i in range(m.shape[0]):
        if has_error:
            add_row(m[i], e[i])
        for k in range(qt.shape[0]):
            p[i, k] = dot(m[i], qt[k])


@_jit
def scaled(a: float, x: Array, out: Array) -> None:  # pragma: no cover - compiled
    for j in range(out.shape[0]):
        out[j] = a * x[j]


@_jit
def add_scaled(a: float, x: Array, out: Array) -> None:  # pragma: no cover - compiled
    for j in range(out.shape[0]):
        out[j] = out[j] + a * x[j]


@_jit
def split_row(m: Array, e: Array, approx: Array) -> None:  # pragma: no cover - compiled
    for j in range(m.shape[0]):
        e[j] = m[j] - approx[j]
        m[j] = approx[j]


@_jit
def decode_with_error(
    m: Array, e: Array, p: Array, qt: Array, has_error: bool
) -> None:  # pragma: no cover - compiled
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


def decode_table(scales: np.ndarray) -> np.ndarray:
    """``[2^W]`` float32: entry ``idx`` = ``(sum_r (-1)^bit_r(idx) * s_r) / W``, summed in rank
    order in float32 (bit ``r`` of ``idx`` is rank ``r``'s sign bit), as the torch decode.

    Args:
        scales: ``[W]`` float32, rank order.
    """
    world_size = scales.shape[0]
    idx = np.arange(1 << world_size)
    total = np.zeros(1 << world_size, dtype=np.float32)
    for r in range(world_size):
        negative = ((idx >> r) & 1).astype(bool)
        total += np.where(negative, -scales[r], scales[r]).astype(np.float32)
    table: np.ndarray = (total / np.float32(world_size)).astype(np.float32)
    return table


def smoke() -> None:
    """Calls every signature the codecs use, so compilation (or the cache load) happens at load."""
    x = np.ones(9, dtype=np.float32)
    packed = np.empty(2, dtype=np.uint8)
    encode(x, x, True, x.copy(), True, packed)
    residual(x.copy(), np.float32(0.5))
    # The codec passes rows of the gathered [W, 4 + ceil(n/8)] payloads: a strided view.
    bits = np.zeros((2, 6), dtype=np.uint8)[:, 4:]
    decode_mean(bits, decode_table(np.ones(2, np.float32)), x, True, x.copy())
    m = np.ones((3, 5), dtype=np.float32)
    qt = np.ones((2, 5), dtype=np.float32)
    p = np.empty((3, 2), dtype=np.float32)
    add_error_and_p(m, m.copy(), qt, p, True)
    decode_with_error(m, m.copy(), p, qt, True)
