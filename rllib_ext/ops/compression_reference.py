"""Plain reference versions of :mod:`rllib_ext.ops.compression`, for tests only.

Written for obviousness, not speed: Python loops over bytes and columns, NumPy float64 where the
fast version accumulates in fp32. Same shape contracts as the fast versions; inputs and outputs
are NumPy arrays.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "cast_compress_reference",
    "round_to_bf16_reference",
    "pack_signs_reference",
    "unpack_signs_reference",
    "onebit_scale_reference",
    "onebit_decode_reference",
    "onebit_decode_mean_reference",
    "should_compress_low_rank_reference",
    "orthogonalize_reference",
    "low_rank_approximation_reference",
]


def cast_compress_reference(values: np.ndarray, dtype: str, *, divisor: int = 1) -> np.ndarray:
    """fp32 -> ``dtype`` ("float16" or "bfloat16"), then divide by ``divisor`` in that dtype.

    Returns float32 holding the ``dtype`` values (NumPy has no bfloat16).
    """
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            half = values.astype(np.float16)  # IEEE round-to-nearest-even, overflow -> inf
            return (half / np.float16(divisor)).astype(np.float32)
    if dtype == "bfloat16":
        rounded = round_to_bf16_reference(values)
        return round_to_bf16_reference(rounded / np.float32(divisor))
    raise ValueError(f"dtype={dtype!r}: expected 'float16' or 'bfloat16'")


def round_to_bf16_reference(values: np.ndarray) -> np.ndarray:
    """Round fp32 to the nearest bfloat16 (ties to even) by bit arithmetic; returns fp32."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32).copy()
    nan = np.isnan(values)
    out[nan] = values[nan]  # rounding arithmetic could turn a NaN payload into inf
    return out


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


def unpack_signs_reference(packed: np.ndarray, numel: int) -> np.ndarray:
    """``[numel]`` float32 of +1 (bit clear) / -1 (bit set)."""
    out = np.empty(numel, dtype=np.float32)
    for k in range(numel):
        bit = (int(packed[k // 8]) >> (k % 8)) & 1
        out[k] = -1.0 if bit else 1.0
    return out


def onebit_scale_reference(values: np.ndarray) -> np.float32:
    """``mean(|x|)`` accumulated in float64, returned as float32 (0 for empty input)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size == 0:
        return np.float32(0.0)
    with np.errstate(invalid="ignore"):
        return np.float32(np.abs(flat).sum() / flat.size)


def onebit_decode_reference(packed: np.ndarray, scale: float, numel: int) -> np.ndarray:
    """``scale * sign``: ``[numel]`` float32."""
    return (np.float32(scale) * unpack_signs_reference(packed, numel)).astype(np.float32)


def onebit_decode_mean_reference(
    messages: list[tuple[np.ndarray, float]], numel: int
) -> np.ndarray:
    """``mean_r scale_r * sign_r`` over ``messages = [(packed_r, scale_r), ...]`` in float64."""
    total = np.zeros(numel, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        for packed, scale in messages:
            total += np.float64(scale) * unpack_signs_reference(packed, numel)
    return (total / len(messages)).astype(np.float32)


def should_compress_low_rank_reference(
    num_rows: int, num_cols: int, rank: int, min_compression_rate: float
) -> bool:
    """Compress iff P and Q (rank capped at min(rows, cols)) are ``min_rate`` x smaller than M."""
    rank = min(rank, num_rows, num_cols)
    uncompressed = num_rows * num_cols
    compressed = (num_rows + num_cols) * rank
    return compressed * min_compression_rate < uncompressed


def orthogonalize_reference(matrix: np.ndarray, *, epsilon: float = 0.0) -> np.ndarray:
    """Gram-Schmidt on the columns of one ``[n, r]`` matrix, float64 copy."""
    out = np.array(matrix, dtype=np.float64)
    for i in range(out.shape[1]):
        for j in range(i):
            out[:, i] -= np.dot(out[:, j], out[:, i]) * out[:, j]
        out[:, i] /= np.linalg.norm(out[:, i]) + epsilon
    return out


def low_rank_approximation_reference(
    matrix: np.ndarray, q: np.ndarray, *, num_iterations: int = 1, epsilon: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Subspace iteration ``P = orth(M Q); Q = M^T P`` on one ``[n, m]`` matrix, float64."""
    matrix = np.asarray(matrix, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p = None
    for _ in range(num_iterations):
        p = orthogonalize_reference(matrix @ q, epsilon=epsilon)
        q = matrix.T @ p
    return p, q
