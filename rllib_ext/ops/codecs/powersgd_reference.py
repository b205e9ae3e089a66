"""Plain reference of :mod:`rllib_ext.ops.codecs.powersgd`, for tests: float64 NumPy loops."""

from __future__ import annotations

import numpy as np

__all__ = ["orthogonalize_reference", "powersgd_step_reference", "should_compress_reference"]


def should_compress_reference(
    num_rows: int, num_cols: int, rank: int, min_compression_rate: float
) -> bool:
    """Compress iff P and Q (rank capped at min(rows, cols)) are ``min_rate`` x smaller than M."""
    rank = min(rank, num_rows, num_cols)
    return (num_rows + num_cols) * rank * min_compression_rate < num_rows * num_cols


def orthogonalize_reference(matrix: np.ndarray, *, epsilon: float = 0.0) -> np.ndarray:
    """Gram-Schmidt on the columns of one ``[n, r]`` matrix, float64 copy."""
    out = np.array(matrix, dtype=np.float64)
    for i in range(out.shape[1]):
        for j in range(i):
            out[:, i] -= np.dot(out[:, j], out[:, i]) * out[:, j]
        out[:, i] /= np.linalg.norm(out[:, i]) + epsilon
    return out


def powersgd_step_reference(
    matrices: list[np.ndarray],
    qts: list[np.ndarray],
    errors: list[np.ndarray] | None,
    *,
    world_size: int = 1,
    epsilon: float = 0.0,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """One PowerSGD step on ``world_size`` ranks that all hold these gradients, float64.

    ``M_r = G + E``, ``P = orth(sum_r M_r Qt^T)``, ``Qt = mean_r P^T M_r``; returns
    ``(decoded P Qt, new errors M - P Qt, new Qt)`` per matrix.
    """
    decoded, new_errors, new_qts = [], [], []
    for k, (grad, qt) in enumerate(zip(matrices, qts, strict=True)):
        m = np.asarray(grad, dtype=np.float64)
        if errors is not None:
            m = m + errors[k]
        p = orthogonalize_reference(
            world_size * (m @ np.asarray(qt, np.float64).T), epsilon=epsilon
        )
        qt_new = p.T @ m  # the mean over identical ranks
        approx = p @ qt_new
        decoded.append(approx)
        new_errors.append(m - approx)
        new_qts.append(qt_new)
    return decoded, new_errors, new_qts
