"""rllib_ext.ops.codecs.powersgd (what the PowerSGD hook calls), numba and torch, against the
float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_ext.ops.codecs import powersgd, select_kernels
from rllib_ext.ops.codecs import powersgd_reference as ref

KERNELS = ["torch", "numba"]


def _step(matrix, qt, error, new_error, kernel):
    """The hook's codec sequence on one rank (its all-reduces are identities at W = 1)."""
    kernels = select_kernels(kernel, matrix)
    assert (kernels is not None) == (kernel == "numba")
    p = torch.full((matrix.shape[0], qt.shape[0]), 9.0)
    powersgd.orthogonalize_(qt.T, epsilon=1e-8)
    powersgd.add_error_and_p(matrix, qt, p, error=error, kernels=kernels)
    powersgd.compute_qt(matrix, p, qt, epsilon=1e-8)
    powersgd.decode_with_error(matrix, p, qt, error=new_error, kernels=kernels)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("n", "m", "r"), [(1, 1, 1), (7, 13, 1), (64, 33, 4), (300, 257, 2)])
@pytest.mark.parametrize("with_error", [True, False])
def test_codec_step_matches_reference(kernel: str, n: int, m: int, r: int, with_error: bool):
    g = torch.Generator().manual_seed(n * m + r)
    grad, error = torch.randn(n, m, generator=g), torch.randn(n, m, generator=g)
    qt0 = torch.randn(r, m, generator=g)
    want_qt0 = powersgd.orthogonalize_(qt0.T.clone(), epsilon=1e-8).T  # as the step does
    decoded, errors, qts = ref.powersgd_step_reference(
        [grad.numpy()], [want_qt0.numpy()], [error.numpy()] if with_error else None, epsilon=1e-8
    )
    matrix, qt = grad.clone(), qt0.clone()
    new_error = torch.full((n, m), 9.0)
    _step(matrix, qt, error.clone() if with_error else None, new_error, kernel)
    scale = float(np.abs(decoded[0]).max()) + 1e-30
    np.testing.assert_allclose(matrix.numpy(), decoded[0], rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(new_error.numpy(), errors[0], rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(qt.numpy(), qts[0], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("kernel", KERNELS)
def test_exact_on_rank_r_matrix_once_q_spans_it(kernel: str) -> None:
    g = torch.Generator().manual_seed(5)
    target = torch.randn(50, 2, generator=g) @ torch.randn(2, 40, generator=g)
    qt = torch.randn(2, 40, generator=g)
    for _ in range(2):  # warm start: the second step starts from the first step's Q
        matrix, error = target.clone(), torch.empty(50, 40)
        _step(matrix, qt, None, error, kernel)
    torch.testing.assert_close(matrix, target, rtol=1e-4, atol=1e-4)
    assert float(error.abs().max()) < 1e-4


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_error_is_exact_difference(kernel: str) -> None:
    # E = M_old - P Qt to one rounding, and M = P Qt: nothing lost between them.
    g = torch.Generator().manual_seed(3)
    matrix = torch.randn(30, 20, generator=g)
    p, qt = torch.randn(30, 3, generator=g), torch.randn(3, 20, generator=g)
    old, error = matrix.clone(), torch.empty(30, 20)
    kernels = select_kernels(kernel, matrix)
    powersgd.decode_with_error(matrix, p, qt, error=error, kernels=kernels)
    np.testing.assert_array_equal(error.numpy(), (old - matrix).numpy())
    torch.testing.assert_close(matrix, p @ qt, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("rows", "cols", "rank", "rate"),
    [
        (64, 64, 4, 2),
        (4, 256, 4, 2),
        (256, 1, 1, 2),
        (10, 10, 5, 1),
        (10, 10, 6, 1),
        (3, 300, 8, 0.5),
    ],
)
def test_should_compress_matches_reference(rows: int, cols: int, rank: int, rate: float) -> None:
    got = powersgd.should_compress(rows, cols, rank, rate)
    assert got == ref.should_compress_reference(rows, cols, rank, rate)


@pytest.mark.parametrize("shape", [(5, 1), (6, 3), (64, 4), (100, 8)])
def test_orthogonalize_matches_reference(shape: tuple[int, int]) -> None:
    m = torch.randn(
        *shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64
    )
    got = powersgd.orthogonalize_(m.clone())
    np.testing.assert_allclose(got.numpy(), ref.orthogonalize_reference(m.numpy()), atol=1e-10)
    np.testing.assert_allclose((got.T @ got).numpy(), np.eye(shape[1]), atol=1e-10)


def test_orthogonalize_zero_column_with_epsilon_stays_zero() -> None:
    m = torch.zeros(8, 2)
    m[:, 0] = 1.0
    powersgd.orthogonalize_(m, epsilon=1e-8)
    assert torch.isfinite(m).all() and torch.equal(m[:, 1], torch.zeros(8))
    assert torch.isnan(powersgd.orthogonalize_(torch.zeros(4, 1))).all()  # epsilon=0: NaN


def test_random_qts_draw_order_and_global_generator() -> None:
    # Matrices of one shape draw consecutively (PyTorch's grouping), whatever their position.
    shapes = [(4, 3), (5, 3), (4, 3)]
    qts = [torch.empty(2, 3) for _ in shapes]
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    powersgd.random_qts_(qts, shapes, seed=7)
    assert torch.equal(torch.rand(1), before)  # the global generator is untouched
    torch.manual_seed(7)
    first, second, third = (torch.randn(3, 2).T for _ in range(3))
    assert torch.equal(qts[0], first) and torch.equal(qts[2], second)
    assert torch.equal(qts[1], third)
