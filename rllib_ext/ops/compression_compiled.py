"""Compiled (numba) 1-bit and low-rank codecs: the CPU fast path of :mod:`rllib_ext.ops.compression`.

The torch ops of the 1-bit hook each make a pass over the bucket (add the residual, divide by
the preconditioner, sign bits, pack, scale, residual update, unpack, multiply back): about nine
passes, ~23 ms per 6.25M floats on one core. These kernels fuse them into three passes:

* :func:`onebit_encode` (one pass): ``c = acc + g / precond`` written to ``acc``, ``sum |c|``,
  and the sign bits of ``c`` packed 8 per byte (block by block while ``c`` is in L1);
* :func:`onebit_residual` (one pass): ``acc -= scale * sign(acc)``;
* :func:`onebit_decode_mean` (one pass): the mean over ranks of ``scale_r * sign_r``, times the
  preconditioner, from a ``2^W``-entry table (every rank decodes bit-identically).

Same conventions and rounding as the torch versions (sign = IEEE sign bit; ``c`` and the
residual are bit-identical; the decoded mean too for two ranks); only ``sum |c|`` is
accumulated in float64 in a different order than torch's float32 dot.

PowerSGD's error feedback around a gradient matrix ``M [n, m]`` costs five torch passes
(``M += E``, ``P = M Q``, ``E = M``, ``M = P Q^T``, ``E -= M``); two fused row-by-row kernels
do it in two:

* :func:`add_error_and_p` (one pass): ``M += E`` and ``P = M Q`` (``Q`` given as ``Qt [r, m]``);
* :func:`decode_with_error` (one pass): ``M = P Qt`` and ``E = M_old - M``, per row while the
  row is in L1.

Their float32 sums run in another order than BLAS's (rounding-level differences); the decode
has no fastmath, so ranks holding the same ``P`` and ``Qt`` decode bit-identically.

Arrays are contiguous numpy views of CPU tensors (``tensor.numpy()`` shares memory).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rllib_ext.ops._jit import LazyKernels

__all__ = ["KERNELS", "MAX_DECODE_RANKS", "CodecKernels", "decode_table", "load"]

_BLOCK = 4096
"""Elements per encode block (16 KB of float32: the block's signs are packed from L1)."""
MAX_DECODE_RANKS = 8
"""The decode table has ``2^W`` entries; larger groups use the torch decode."""


class CodecKernels:
    """The jitted kernels (see the module docstring for what each computes).

    ``encode(grad, precond, has_precond, acc, accumulate, packed) -> float``:
        ``grad``, ``precond``, ``acc`` ``[n]`` float32 (``precond`` ignored unless
        ``has_precond``); ``acc = (acc if accumulate else 0) + grad / precond``;
        ``packed`` ``[ceil(n / 8)]`` uint8 receives the sign bits; returns ``sum |acc|``.
    ``residual(acc, scale)``: ``acc -= copysign(scale, acc)`` in place.
    ``decode_mean(bits, table, precond, has_precond, out)``: ``bits`` ``[W, ceil(n/8)]``
        uint8 (row ``r`` from rank ``r``), ``table`` ``[2^W]`` float32 from
        :func:`decode_table`; ``out[i] = table[index of the W sign bits of i] * precond[i]``.
    ``add_error_and_p(m, e, qt, p, has_error)``: ``m`` ``[n, k]`` float32 in place
        (``m += e`` if ``has_error``), ``qt`` ``[r, k]``, ``p`` ``[n, r]`` out: ``m @ qt.T``.
    ``decode_with_error(m, e, p, qt, has_error)``: ``m = p @ qt``; first, if ``has_error``,
        ``e = m_old - p @ qt``.
    """

    def __init__(self, **kernels: Callable) -> None:
        self.encode = kernels["encode"]
        self.residual = kernels["residual"]
        self.decode_mean = kernels["decode_mean"]
        self.add_error_and_p = kernels["add_error_and_p"]
        self.decode_with_error = kernels["decode_with_error"]


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
    return (total / np.float32(world_size)).astype(np.float32)


def _expand_table() -> np.ndarray:
    """``[256]`` uint64: byte ``b`` spread out, bit ``k`` of ``b`` -> bit 0 of byte ``k``."""
    table = np.zeros(256, dtype=np.uint64)
    for k in range(8):
        table |= ((np.arange(256, dtype=np.uint64) >> np.uint64(k)) & np.uint64(1)) << np.uint64(
            8 * k
        )
    return table


def _build() -> CodecKernels:
    import numba

    # error_model="numpy": no ZeroDivisionError branch per division (it blocks vectorizing).
    # fastmath only in the encode sums, and only "reassoc", for the sum |c| reduction: c itself
    # is one rounding (acc + g/p) that reassociation cannot change; inf/NaN still propagate.
    sum_jit = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
    # No fastmath elsewhere: the decode must round identically on every rank and CPU.
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")
    block = _BLOCK
    spread = np.uint64(0x0102040810204080)  # sum_i 2^(56 - 7i): byte i's bit 0 -> bit 56 + i
    shift = np.uint64(56)
    expand = _expand_table()

    # The loops sit in small functions called on block slices: LLVM vectorizes these, but not
    # the same loops written inline in the block loop (measured 2.3 vs 6.5 ms per 6.25M).
    @sum_jit
    def acc_div(grad, precond, acc):  # pragma: no cover - compiled
        total = 0.0
        for i in range(acc.shape[0]):
            c = acc[i] + grad[i] / precond[i]
            acc[i] = c
            total += abs(c)
        return total

    @sum_jit
    def acc_add(grad, acc):  # pragma: no cover - compiled
        total = 0.0
        for i in range(acc.shape[0]):
            c = acc[i] + grad[i]
            acc[i] = c
            total += abs(c)
        return total

    @sum_jit
    def set_div(grad, precond, acc):  # pragma: no cover - compiled
        total = 0.0
        for i in range(acc.shape[0]):
            c = grad[i] / precond[i]
            acc[i] = c
            total += abs(c)
        return total

    @sum_jit
    def set_copy(grad, acc):  # pragma: no cover - compiled
        total = 0.0
        for i in range(acc.shape[0]):
            c = grad[i]
            acc[i] = c
            total += abs(c)
        return total

    @jit
    def pack(values, signs, words, packed):  # pragma: no cover - compiled
        m = values.shape[0]
        for i in range(m):
            signs[i] = np.signbit(values[i])
        for i in range(m, signs.shape[0]):
            signs[i] = 0
        # Eight 0/1 bytes as one little-endian word; the multiply gathers them into the top
        # byte without carries (see compression.pack_signs).
        for w in range(packed.shape[0]):
            packed[w] = (words[w] * spread) >> shift

    @jit
    def encode(grad, precond, has_precond, acc, accumulate, packed):  # pragma: no cover
        n = grad.shape[0]
        signs = np.zeros(block, dtype=np.uint8)
        words = signs.view(np.uint64)
        total = 0.0
        for lo in range(0, n, block):
            hi = min(lo + block, n)
            if has_precond and accumulate:
                total += acc_div(grad[lo:hi], precond[lo:hi], acc[lo:hi])
            elif has_precond:
                total += set_div(grad[lo:hi], precond[lo:hi], acc[lo:hi])
            elif accumulate:
                total += acc_add(grad[lo:hi], acc[lo:hi])
            else:
                total += set_copy(grad[lo:hi], acc[lo:hi])
            pack(acc[lo:hi], signs, words, packed[lo // 8 : (hi + 7) // 8])
        return total

    @jit
    def residual(acc, scale):  # pragma: no cover - compiled
        for i in range(acc.shape[0]):
            acc[i] = acc[i] - np.copysign(scale, acc[i])

    @jit
    def or_rank_bits(row, rank, words):  # pragma: no cover - compiled
        # Byte b of rank r -> bit r of eight index bytes at once.
        r = np.uint64(rank)
        for j in range(row.shape[0]):
            words[j] |= expand[row[j]] << r

    @jit
    def lookup(table, idx, precond, has_precond, out):  # pragma: no cover - compiled
        if has_precond:
            for i in range(out.shape[0]):
                out[i] = table[idx[i]] * precond[i]
        else:
            for i in range(out.shape[0]):
                out[i] = table[idx[i]]

    @jit
    def decode_mean(bits, table, precond, has_precond, out):  # pragma: no cover - compiled
        n = out.shape[0]
        idx = np.zeros(block, dtype=np.uint8)
        words = idx.view(np.uint64)
        for lo in range(0, n, block):
            hi = min(lo + block, n)
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

    @jit
    def add_row(m, e):  # pragma: no cover - compiled
        for j in range(m.shape[0]):
            m[j] = m[j] + e[j]

    @sum_jit
    def dot(a, b):  # pragma: no cover - compiled
        total = np.float32(0.0)
        for j in range(a.shape[0]):
            total += a[j] * b[j]
        return total

    @jit
    def add_error_and_p(m, e, qt, p, has_error):  # pragma: no cover - compiled
        for i in range(m.shape[0]):
            if has_error:
                add_row(m[i], e[i])
            for k in range(qt.shape[0]):
                p[i, k] = dot(m[i], qt[k])

    @jit
    def scaled(a, x, out):  # pragma: no cover - compiled
        for j in range(out.shape[0]):
            out[j] = a * x[j]

    @jit
    def add_scaled(a, x, out):  # pragma: no cover - compiled
        for j in range(out.shape[0]):
            out[j] = out[j] + a * x[j]

    @jit
    def split_row(m, e, approx):  # pragma: no cover - compiled
        for j in range(m.shape[0]):
            e[j] = m[j] - approx[j]
            m[j] = approx[j]

    @jit
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

    return CodecKernels(
        encode=encode,
        residual=residual,
        decode_mean=decode_mean,
        add_error_and_p=add_error_and_p,
        decode_with_error=decode_with_error,
    )


def _smoke(kernels: CodecKernels) -> None:
    x = np.ones(9, dtype=np.float32)
    packed = np.empty(2, dtype=np.uint8)
    kernels.encode(x, x, True, x.copy(), True, packed)
    kernels.residual(x.copy(), np.float32(0.5))
    # The hook passes rows of the gathered [W, 4 + ceil(n/8)] payloads: a strided view.
    bits = np.zeros((2, 6), dtype=np.uint8)[:, 4:]
    kernels.decode_mean(bits, decode_table(np.ones(2, np.float32)), x, True, x.copy())
    m = np.ones((3, 5), dtype=np.float32)
    qt = np.ones((2, 5), dtype=np.float32)
    p = np.empty((3, 2), dtype=np.float32)
    kernels.add_error_and_p(m, m.copy(), qt, p, True)
    kernels.decode_with_error(m, m.copy(), p, qt, True)


KERNELS: LazyKernels[CodecKernels] = LazyKernels("compression codecs", _build, _smoke)


def load() -> CodecKernels | None:
    """The compiled codec kernels, or ``None`` where numba is missing or cannot compile."""
    return KERNELS.load()
