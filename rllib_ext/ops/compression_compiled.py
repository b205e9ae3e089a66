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


def _build() -> CodecKernels:
    from rllib_ext.ops import _codec_kernels as k  # imports numba

    return CodecKernels(
        encode=k.encode,
        residual=k.residual,
        decode_mean=k.decode_mean,
        add_error_and_p=k.add_error_and_p,
        decode_with_error=k.decode_with_error,
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
