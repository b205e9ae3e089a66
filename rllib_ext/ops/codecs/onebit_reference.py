"""Plain reference of :mod:`rllib_ext.ops.codecs.onebit`, for tests: loops over bits, float64."""

from __future__ import annotations

import numpy as np

__all__ = ["decode_mean_reference", "encode_reference", "pack_signs_reference"]


def pack_signs_reference(values: np.ndarray) -> np.ndarray:
    """Bit ``i`` of byte ``j`` = sign bit of element ``8j + i``; ``[ceil(n/8)]`` uint8."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    out = np.zeros((flat.size + 7) // 8, dtype=np.uint8)
    for j in range(out.size):
        byte = 0
        for i in range(8):
            k = 8 * j + i
            if k < flat.size and np.signbit(flat[k]):
                byte |= 1 << i
        out[j] = byte
    return out


def _signs(packed: np.ndarray, numel: int) -> np.ndarray:
    """``[numel]`` float64 of +1 (bit clear) / -1 (bit set)."""
    out = np.empty(numel, dtype=np.float64)
    for k in range(numel):
        out[k] = -1.0 if (int(packed[k // 8]) >> (k % 8)) & 1 else 1.0
    return out


def encode_reference(
    grad: np.ndarray, residual: np.ndarray | None, precond: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(payload, new residual)`` for ``c = grad / precond + residual`` (fp32 ``c``).

    The scale ``mean(|c|)`` is summed in float64; the new residual is ``c - s sign(c)``, or zeros
    when ``s`` is not finite.
    """
    c: np.ndarray = np.asarray(grad, dtype=np.float32)
    if precond is not None:
        c = c / np.asarray(precond, dtype=np.float32)
    if residual is not None:
        c = np.asarray(residual, dtype=np.float32) + c
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.float32(np.abs(c.astype(np.float64)).sum() / c.size) if c.size else np.float32(0)
        payload = np.concatenate(
            [np.array([scale], dtype=np.float32).view(np.uint8), pack_signs_reference(c)]
        )
        if residual is None:
            return payload, None
        if not np.isfinite(scale):
            return payload, np.zeros_like(c)
        return payload, (c - scale * _signs(payload[4:], c.size)).astype(np.float32)


def decode_mean_reference(
    payloads: np.ndarray, numel: int, precond: np.ndarray | None = None
) -> np.ndarray:
    """``precond * mean_r(scale_r * sign_r)`` over ``[W, 4 + m]`` uint8 payloads, float64 sums."""
    total = np.zeros(numel, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        for row in payloads:
            scale = np.float64(np.ascontiguousarray(row[:4]).view(np.float32)[0])
            total += scale * _signs(row[4:], numel)
        mean = (total / len(payloads)).astype(np.float32)
    return mean if precond is None else mean * np.asarray(precond, dtype=np.float32)
