"""Plain reference of :mod:`rllib_ext.ops.codecs.cast`, for tests: NumPy bit arithmetic."""

from __future__ import annotations

import numpy as np

__all__ = ["bf16_mean_reference", "cast_compress_reference", "round_to_bf16_reference"]


def round_to_bf16_reference(values: np.ndarray) -> np.ndarray:
    """Round fp32 to the nearest bfloat16 (ties to even) by bit arithmetic; returns fp32."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    out: np.ndarray = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32).copy()
    nan = np.isnan(values)
    out[nan] = values[nan]  # rounding arithmetic could turn a NaN payload into inf
    return out


def cast_compress_reference(values: np.ndarray, dtype: str, *, divisor: int = 1) -> np.ndarray:
    """fp32 -> ``dtype`` ("float16" or "bfloat16"), then divide by ``divisor`` in that dtype.

    Returns float32 holding the ``dtype`` values (NumPy has no bfloat16).
    """
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            half = values.astype(np.float16)  # IEEE round-to-nearest-even, overflow -> inf
            out: np.ndarray = (half / np.float16(divisor)).astype(np.float32)
            return out
    if dtype == "bfloat16":
        rounded = round_to_bf16_reference(values)
        return round_to_bf16_reference(rounded / np.float32(divisor))
    raise ValueError(f"dtype={dtype!r}: expected 'float16' or 'bfloat16'")


def bf16_mean_reference(per_rank: list[np.ndarray]) -> np.ndarray:
    """bf16(mean over ranks of bf16(x_r)), summed in float32 in rank order; returns fp32."""
    total = np.zeros_like(per_rank[0], dtype=np.float32)
    with np.errstate(over="ignore"):  # 2 x 3e38 is inf, as in the codec
        for values in per_rank:
            total = total + round_to_bf16_reference(values)
    return round_to_bf16_reference(total / np.float32(len(per_rank)))
