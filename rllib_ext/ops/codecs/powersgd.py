"""PowerSGD codec (Vogels et al. 2019, https://arxiv.org/abs/1905.13727): rank-``r`` factors.

Used by the ``powersgd`` hook of :mod:`rllib_ext.distributed.powersgd`, which all-reduces
between the steps below; reference beside it in :mod:`rllib_ext.ops.codecs.powersgd_reference`.
For a gradient matrix ``M [n, m]`` (with error feedback ``E``) and the right factor stored
transposed, ``Qt [r, m]`` (contiguous, so every product reads ``M`` row-major):

1. :func:`add_error_and_p`: ``M += E``; ``P = M Qt^T`` ``[n, r]``  (all-reduce ``P``)
2. :func:`compute_qt`: orthonormalise ``P``; ``Qt = P^T M``        (all-reduce, average ``Qt``)
3. :func:`decode_with_error`: ``E = M - P Qt``; ``M = P Qt``

All three are linear in ``M`` (up to the orthonormalisation, which removes any scale), so the
all-reduced result equals one power-iteration step on the mean gradient; exact when
``rank(M) <= r`` and ``Q`` spans its row space. Steps 1 and 3 run as the fused numba kernels of
:mod:`rllib_ext.ops.codecs._numba` (``kernels``) or as torch ops (``None``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

__all__ = [
    "add_error_and_p",
    "compute_qt",
    "decode_with_error",
    "orthogonalize_",
    "random_qts_",
    "should_compress",
]


def should_compress(num_rows: int, num_cols: int, rank: int, min_compression_rate: float) -> bool:
    """Whether a ``[num_rows, num_cols]`` matrix is worth a rank-``rank`` factorisation.

    Same rule as PyTorch's PowerSGD: compress when ``(rows + cols) * rank * min_rate <
    rows * cols``, i.e. when P and Q together are at least ``min_rate`` times smaller than M.
    ``rank`` is first capped at ``min(rows, cols)``.
    """
    rank = min(num_rows, num_cols, rank)
    return (num_rows + num_cols) * rank * min_compression_rate < num_rows * num_cols


def orthogonalize_(matrices: torch.Tensor, *, epsilon: float = 0.0) -> torch.Tensor:
    """Orthonormalises the columns of each matrix in place (modified Gram-Schmidt).

    Args:
        matrices: ``[..., n, r]`` with ``r <= n``; floating dtype.
        epsilon: added to every column norm before dividing. With ``epsilon = 0`` an all-zero
            column (a layer whose gradient is exactly 0) becomes NaN; a tiny value such as 1e-8
            keeps it at 0 instead and changes nothing measurable otherwise.

    Returns:
        ``matrices`` (modified in place).
    """
    num_cols = matrices.shape[-1]
    for i in range(num_cols):
        col = matrices[..., i : i + 1]
        # The norm is taken in the matrix dtype: in fp16, col**2 can overflow; PowerSGD on fp16
        # buckets is therefore not recommended.
        col /= torch.linalg.vector_norm(col, dim=-2, keepdim=True) + epsilon
        if i + 1 < num_cols:
            rest = matrices[..., i + 1 :]
            rest -= (col * rest).sum(dim=-2, keepdim=True) * col
    return matrices


def random_qts_(qts: list[torch.Tensor], shapes: list[tuple[int, int]], seed: int) -> None:
    """Fills each ``Qt [r, m]`` with standard normal values, drawn as PyTorch's hook draws Q.

    One generator seeded with ``seed``, then ``randn(m, r)`` per matrix, matrices of the same
    shape (``shapes``, the ``[n, m]`` of each gradient matrix) grouped in first-appearance
    order; so both hooks start from the same Q, and ranks that pass the same seed draw the same
    Q. The global torch generator is left untouched.
    """
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(shapes):
        by_shape.setdefault(shape, []).append(i)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for indices in by_shape.values():
            for i in indices:
                rank, cols = qts[i].shape
                qts[i].copy_(torch.randn(cols, rank, dtype=qts[i].dtype).T)


def add_error_and_p(
    matrix: torch.Tensor,
    qt: torch.Tensor,
    p: torch.Tensor,
    *,
    error: torch.Tensor | None,
    kernels: ModuleType | None,
) -> None:
    """``matrix += error`` (unless ``None``), then ``p = matrix @ qt.T``.

    Args:
        matrix: ``[n, m]``, modified in place.
        qt: ``[r, m]``.
        p: ``[n, r]`` output.
        error: ``[n, m]`` error-feedback memory, or ``None``.
        kernels: the numba kernels (contiguous CPU float32), or ``None`` for torch ops.
    """
    if kernels is not None:
        _fused(kernels.add_error_and_p, matrix, error, qt, p)
        return
    if error is not None:
        matrix.add_(error)
    torch.mm(matrix, qt.T, out=p)


def compute_qt(matrix: torch.Tensor, p: torch.Tensor, qt: torch.Tensor, *, epsilon: float) -> None:
    """Orthonormalises ``p [n, r]`` in place, then ``qt = p^T @ matrix`` ``[r, m]``."""
    orthogonalize_(p, epsilon=epsilon)
    torch.mm(p.T, matrix, out=qt)


def decode_with_error(
    matrix: torch.Tensor,
    p: torch.Tensor,
    qt: torch.Tensor,
    *,
    error: torch.Tensor | None,
    kernels: ModuleType | None,
) -> None:
    """``error = matrix - p @ qt`` (unless ``None``), then ``matrix = p @ qt``.

    ``matrix`` ``[n, m]`` holds the corrected gradient and receives the decoded one; ``p``
    ``[n, r]`` and ``qt`` ``[r, m]`` are the averaged factors (identical on every rank);
    ``error`` ``[n, m]`` is an output; ``kernels`` as in :func:`add_error_and_p`.
    """
    if kernels is not None:
        _fused(kernels.decode_with_error, matrix, error, p, qt)
        return
    if error is not None:
        error.copy_(matrix)
    torch.mm(p, qt, out=matrix)
    if error is not None:
        error.sub_(matrix)


def _fused(
    kernel: Callable[..., None],
    matrix: torch.Tensor,
    error: torch.Tensor | None,
    first: torch.Tensor,
    second: torch.Tensor,
) -> None:
    """Calls a fused numba kernel ``kernel(m, e, first, second, has_error)``; it reads no error
    memory when ``has_error`` is false, so ``matrix`` stands in for a missing one."""
    memory = matrix if error is None else error
    kernel(matrix.numpy(), memory.numpy(), first.numpy(), second.numpy(), error is not None)
