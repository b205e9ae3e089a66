"""The compiled 1-bit codec against the torch ops and the NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_ext.ops import compression as fast
from rllib_ext.ops import compression_compiled as compiled
from rllib_ext.ops import compression_reference as ref

# Around the 4096-element block and the 8-element byte boundaries.
SIZES = [1, 7, 8, 9, 63, 4095, 4096, 4097, 10_001]


@pytest.fixture(scope="module")
def kernels() -> compiled.CodecKernels:
    loaded = compiled.load()
    assert loaded is not None, "numba is a dependency: the compiled codec must load"
    return loaded


def _values(numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 3, numel)
    if numel >= 4:
        x[:4] = torch.tensor([0.0, -0.0, 1e-40, -1e-40])  # signed zeros and denormals
    return x


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("has_precond", [True, False])
@pytest.mark.parametrize("accumulate", [True, False])
def test_encode_matches_torch_ops(kernels, numel: int, has_precond: bool, accumulate: bool):
    grad = _values(numel, numel)
    precond = torch.rand(numel, generator=torch.Generator().manual_seed(1)) + 0.1
    start = _values(numel, numel + 1) * 0.01
    # The torch hook's arithmetic: residual.addcdiv_ / add_, or a plain division / copy
    # without error feedback (which keeps a -0.0 gradient's sign bit).
    if accumulate:
        want = start.clone().addcdiv_(grad, precond) if has_precond else start + grad
    else:
        want = grad / precond if has_precond else grad.clone()
    acc = start.clone()
    packed = np.full((numel + 7) // 8, 0xFF, dtype=np.uint8)  # dirty: padding bits must clear
    abs_sum = kernels.encode(
        grad.numpy(),
        precond.numpy() if has_precond else grad.numpy(),
        has_precond,
        acc.numpy(),
        accumulate,
        packed,
    )
    np.testing.assert_array_equal(acc.numpy(), want.numpy())  # bit-identical c
    np.testing.assert_array_equal(packed, ref.pack_signs_reference(want.numpy()))
    np.testing.assert_allclose(abs_sum / numel, ref.onebit_scale_reference(want.numpy()), rtol=1e-6)


@pytest.mark.parametrize("numel", SIZES)
def test_residual_matches_torch_ops(kernels, numel: int):
    x = _values(numel, 2 * numel)
    scale = np.float32(0.37)
    want = fast.onebit_residual_(x.clone(), torch.tensor(scale))
    got = x.clone()
    kernels.residual(got.numpy(), scale)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel", [1, 13, 4097, 10_001])
def test_decode_mean_matches_reference(kernels, world_size: int, numel: int):
    messages = [fast.onebit_encode(_values(numel, 100 * r + numel)) for r in range(world_size)]
    payloads = torch.stack([fast.pack_onebit_payload(p, s) for p, s in messages])
    scales = payloads[:, :4].flatten().clone().view(torch.float32).numpy()
    table = compiled.decode_table(scales)
    precond = torch.rand(numel) + 0.5
    out = np.full(numel, 7.0, dtype=np.float32)
    kernels.decode_mean(payloads.numpy()[:, 4:], table, precond.numpy(), True, out)
    want = ref.onebit_decode_mean_reference([(p.numpy(), s.item()) for p, s in messages], numel)
    # Float32 sums of +-scales cancel: the error is relative to the largest decoded value.
    atol = 1e-6 * float(np.abs(want).max())
    np.testing.assert_allclose(out, want * precond.numpy(), rtol=1e-6, atol=1.5 * atol)
    plain = np.empty(numel, dtype=np.float32)
    kernels.decode_mean(payloads.numpy()[:, 4:], table, plain, False, plain)
    np.testing.assert_allclose(plain, want, rtol=1e-6, atol=atol)
    if world_size <= 2:  # same table arithmetic as the torch decode: bit-identical
        np.testing.assert_array_equal(plain, fast.onebit_decode_mean(payloads, numel).numpy())


def test_decode_table_order_and_values():
    table = compiled.decode_table(np.array([1.0, 10.0, 100.0], dtype=np.float32))
    # idx bit r set = rank r negative; mean over 3 ranks.
    assert table.dtype == np.float32 and table.shape == (8,)
    np.testing.assert_allclose(table[0b000], 111 / 3, rtol=1e-6)
    np.testing.assert_allclose(table[0b001], 109 / 3, rtol=1e-6)
    np.testing.assert_allclose(table[0b110], -109 / 3, rtol=1e-6)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_nonfinite_gradient_gives_nonfinite_sum_and_decode(kernels, bad: float):
    grad = _values(100, 3)
    grad[42] = bad
    acc = np.zeros(100, dtype=np.float32)
    packed = np.empty(13, dtype=np.uint8)
    abs_sum = kernels.encode(grad.numpy(), grad.numpy(), False, acc, True, packed)
    assert not np.isfinite(abs_sum)
    table = compiled.decode_table(np.array([np.float32(abs_sum / 100), 1.0], dtype=np.float32))
    bits = np.stack([packed, packed])
    out = np.empty(100, dtype=np.float32)
    kernels.decode_mean(bits, table, out, False, out)
    assert not np.isfinite(out).any()


# ------------------------------------------------------------------------ PowerSGD (low rank)


@pytest.mark.parametrize(("n", "m", "r"), [(1, 1, 1), (7, 13, 1), (64, 33, 4), (300, 257, 2)])
@pytest.mark.parametrize("has_error", [True, False])
def test_add_error_and_p_matches_torch(kernels, n: int, m: int, r: int, has_error: bool):
    g = torch.Generator().manual_seed(n * m + r)
    matrix, error = torch.randn(n, m, generator=g), torch.randn(n, m, generator=g)
    qt = torch.randn(r, m, generator=g)
    corrected = matrix + error if has_error else matrix.clone()
    p = torch.full((n, r), 9.0)
    got = matrix.clone()
    kernels.add_error_and_p(got.numpy(), error.numpy(), qt.numpy(), p.numpy(), has_error)
    np.testing.assert_array_equal(got.numpy(), corrected.numpy())  # same single rounding
    want = corrected.double() @ qt.double().T
    np.testing.assert_allclose(p.numpy(), want.numpy(), rtol=1e-5, atol=1e-5 * m**0.5)


@pytest.mark.parametrize(("n", "m", "r"), [(1, 1, 1), (7, 13, 1), (64, 33, 4), (300, 257, 2)])
@pytest.mark.parametrize("has_error", [True, False])
def test_decode_with_error_matches_torch(kernels, n: int, m: int, r: int, has_error: bool):
    g = torch.Generator().manual_seed(n + m * r)
    matrix = torch.randn(n, m, generator=g)
    p, qt = torch.randn(n, r, generator=g), torch.randn(r, m, generator=g)
    approx = (p.double() @ qt.double()).float()
    got, error = matrix.clone(), torch.full((n, m), 9.0)
    kernels.decode_with_error(got.numpy(), error.numpy(), p.numpy(), qt.numpy(), has_error)
    np.testing.assert_allclose(got.numpy(), approx.numpy(), rtol=1e-5, atol=1e-6)
    if has_error:
        # e = m_old - decoded, exactly (one rounding of the difference).
        np.testing.assert_array_equal(error.numpy(), (matrix - got).numpy())
    else:
        assert (error == 9.0).all()  # untouched


def test_low_rank_roundtrip_is_exact_on_a_rank_r_matrix(kernels):
    """M = A B (rank 2): with orthonormal P from M Q, M ~ P (P^T M) exactly."""
    g = torch.Generator().manual_seed(5)
    matrix = torch.randn(50, 2, generator=g) @ torch.randn(2, 40, generator=g)
    qt = torch.randn(2, 40, generator=g)
    p = torch.empty(50, 2)
    m = matrix.clone()
    kernels.add_error_and_p(m.numpy(), m.numpy(), qt.numpy(), p.numpy(), False)
    fast.orthogonalize_(p)
    qt_new = p.T @ m
    error = torch.empty(50, 40)
    kernels.decode_with_error(m.numpy(), error.numpy(), p.numpy(), qt_new.numpy(), True)
    torch.testing.assert_close(m, matrix, rtol=1e-4, atol=1e-4)
    assert float(error.abs().max()) < 1e-4
