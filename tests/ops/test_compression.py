"""rllib_ext.ops.compression against its loop/NumPy reference and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_ext.ops import compression as fast
from rllib_ext.ops import compression_reference as ref

SIZES = [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4097]


def _values(numel: int, seed: int, *, specials: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 3, max(numel, 1))[:numel]
    if specials and numel >= 6:
        x[:6] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38])
    return x


# ------------------------------------------------------------------------------------ casts


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("divisor", [1, 2, 3, 8])
def test_cast_fp16_matches_numpy(numel: int, divisor: int) -> None:
    x = _values(numel, numel + divisor, specials=True)
    got = fast.cast_compress(x, torch.float16, divisor=divisor)
    assert got.dtype == torch.float16 and got.shape == x.shape
    want = ref.cast_compress_reference(x.numpy(), "float16", divisor=divisor)
    np.testing.assert_array_equal(got.float().numpy(), want)


@pytest.mark.parametrize("numel", SIZES)
def test_bf16_rounding_matches_bit_reference(numel: int) -> None:
    x = _values(numel, 11 + numel, specials=True)
    got = fast.round_to_bf16(x)
    np.testing.assert_array_equal(got.numpy(), ref.round_to_bf16_reference(x.numpy()))
    cast = fast.cast_compress(x, torch.bfloat16, divisor=2).float().numpy()
    np.testing.assert_array_equal(
        cast, ref.cast_compress_reference(x.numpy(), "bfloat16", divisor=2)
    )


def test_fp16_overflow_becomes_inf_before_division() -> None:
    # 65504 is the fp16 maximum; IEEE rounding sends [65504, 65520) to 65504 and >= 65520 to
    # inf. A loss-scaled 1e5 must arrive as inf even though 1e5 / 2 would fit in fp16.
    x = torch.tensor([65504.0, 65519.0, 65520.0, 1e5, -1e5, float("nan"), float("inf")])
    got = fast.cast_compress(x, torch.float16, divisor=2)
    expected = [32752.0, 32752.0, float("inf"), float("inf"), -float("inf")]
    assert got[:5].float().tolist() == expected
    assert torch.isnan(got[5]) and torch.isposinf(got[6])


def test_cast_returns_new_tensor_even_for_same_dtype() -> None:
    x = torch.ones(4, dtype=torch.float16)
    out = fast.cast_compress(x, torch.float16, divisor=2)
    assert out.data_ptr() != x.data_ptr() and x.tolist() == [1.0] * 4


# ------------------------------------------------------------------------------------ 1-bit


@pytest.mark.parametrize("numel", SIZES)
def test_pack_unpack_match_reference(numel: int) -> None:
    x = _values(numel, numel, specials=True)
    packed = fast.pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.shape == ((numel + 7) // 8,)
    np.testing.assert_array_equal(packed.numpy(), ref.pack_signs_reference(x.numpy()))
    signs = fast.unpack_signs(packed, numel)
    np.testing.assert_array_equal(signs.numpy(), ref.unpack_signs_reference(packed.numpy(), numel))
    np.testing.assert_array_equal(signs.numpy(), np.where(np.signbit(x.numpy()), -1.0, 1.0))


def test_pack_hand_computed_and_dirty_workspace() -> None:
    # Element k -> bit k % 8 of byte k // 8; 1 = negative (sign bit set, -0.0 included).
    x = torch.tensor([-1.0, 2.0, -0.0, 0.0, 5.0, 6.0, 7.0, -8.0, -9.0, 1.0])
    workspace = torch.ones(64, dtype=torch.bool)  # garbage must not leak into padding bits
    packed = fast.pack_signs(x, workspace=workspace)
    assert packed.tolist() == [0b10000101, 0b00000001]
    assert fast.pack_signs(x[:3], workspace=workspace).tolist() == [0b101]


@pytest.mark.parametrize("numel", SIZES)
def test_scale_decode_residual(numel: int) -> None:
    x = _values(numel, 3 * numel + 1)
    packed, scale = fast.onebit_encode(x)
    np.testing.assert_allclose(scale.item(), ref.onebit_scale_reference(x.numpy()), rtol=1e-6)
    decoded = fast.onebit_decode(packed, scale, numel)
    want = ref.onebit_decode_reference(packed.numpy(), scale.item(), numel)
    np.testing.assert_array_equal(decoded.numpy(), want)
    residual = fast.onebit_residual_(x.clone(), scale)
    np.testing.assert_array_equal(residual.numpy(), (x - decoded).numpy())
    # The BLAS path (signs buffer) agrees, and its residual uses the signs it produced.
    signs = torch.full((numel + 3,), 9.0)
    packed_b, scale_b = fast.onebit_encode(x, signs=signs)
    assert torch.equal(packed_b, packed)
    np.testing.assert_allclose(scale_b.item(), scale.item(), rtol=1e-5)
    np.testing.assert_array_equal(signs[:numel].numpy(), fast.unpack_signs(packed, numel).numpy())
    residual_b = fast.onebit_residual_(x.clone(), scale_b, signs=signs)
    decoded_b = fast.onebit_decode(packed_b, scale_b, numel)
    np.testing.assert_array_equal(residual_b.numpy(), (x - decoded_b).numpy())


def test_scale_is_l2_optimal_for_the_signs() -> None:
    x = _values(1000, 5)
    packed, scale = fast.onebit_encode(x)
    signs = fast.unpack_signs(packed, 1000)
    errors = [float((x - s * signs).norm()) for s in (0.9 * scale, scale, 1.1 * scale)]
    assert errors[1] < errors[0] and errors[1] < errors[2]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("numel", [1, 8, 13, 1000])
def test_decode_mean_matches_reference(world_size: int, numel: int) -> None:
    messages = [fast.onebit_encode(_values(numel, 100 * r + numel)) for r in range(world_size)]
    payloads = torch.stack([fast.pack_onebit_payload(p, s) for p, s in messages])
    assert payloads.shape == (world_size, fast.onebit_payload_nbytes(numel))
    got = fast.onebit_decode_mean(payloads, numel)
    want = ref.onebit_decode_mean_reference([(p.numpy(), s.item()) for p, s in messages], numel)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-30)
    out = torch.full((numel,), 7.0)
    assert fast.onebit_decode_mean(payloads, numel, out=out) is out
    np.testing.assert_array_equal(out.numpy(), got.numpy())


def test_payload_roundtrip_and_size() -> None:
    packed, scale = fast.onebit_encode(_values(21, 0))
    payload = fast.pack_onebit_payload(packed, scale)
    assert payload.dtype == torch.uint8 and payload.numel() == 4 + 3 == fast.onebit_payload_nbytes(
        21
    )
    unpacked, unpacked_scale = fast.unpack_onebit_payload(payload)
    assert torch.equal(unpacked, packed) and unpacked_scale.item() == scale.item()


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_nonfinite_input_gives_nonfinite_scale_and_decode(bad: float) -> None:
    x = _values(50, 1)
    x[17] = bad
    packed, scale = fast.onebit_encode(x)
    assert not torch.isfinite(scale)
    other = fast.onebit_encode(_values(50, 2))
    payloads = torch.stack(
        [fast.pack_onebit_payload(*other), fast.pack_onebit_payload(packed, scale)]
    )
    assert not torch.isfinite(fast.onebit_decode_mean(payloads, 50)).any()


def test_empty_tensor_scale_is_zero() -> None:
    packed, scale = fast.onebit_encode(torch.empty(0))
    assert packed.numel() == 0 and scale.item() == 0.0


# --------------------------------------------------------------------------------- low rank


@pytest.mark.parametrize(
    "rows, cols, rank, rate",
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
    assert fast.should_compress_low_rank(
        rows, cols, rank, rate
    ) == ref.should_compress_low_rank_reference(rows, cols, rank, rate)


@pytest.mark.parametrize("shape", [(5, 1), (6, 3), (64, 4), (100, 8)])
def test_orthogonalize_matches_reference(shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(sum(shape))
    m = torch.randn(*shape, generator=g, dtype=torch.float64)
    got = fast.orthogonalize_(m.clone().unsqueeze(0)).squeeze(0)
    np.testing.assert_allclose(got.numpy(), ref.orthogonalize_reference(m.numpy()), atol=1e-10)
    np.testing.assert_allclose((got.T @ got).numpy(), np.eye(shape[1]), atol=1e-10)


def test_orthogonalize_zero_column_with_epsilon_stays_zero() -> None:
    m = torch.zeros(1, 8, 2)
    m[0, :, 0] = 1.0
    fast.orthogonalize_(m, epsilon=1e-8)
    assert torch.isfinite(m).all() and torch.equal(m[0, :, 1], torch.zeros(8))
    assert torch.isnan(fast.orthogonalize_(torch.zeros(1, 4, 1))).all()  # epsilon=0: NaN


@pytest.mark.parametrize("n, m, r", [(32, 24, 1), (64, 48, 4), (100, 7, 3)])
def test_low_rank_exact_on_rank_r_and_matches_reference(n: int, m: int, r: int) -> None:
    g = torch.Generator().manual_seed(n * m * r)
    matrix = torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(
        r, m, generator=g, dtype=torch.float64
    )
    q0 = torch.randn(m, r, generator=g, dtype=torch.float64)
    p, q = fast.low_rank_approximation(matrix, q0)
    assert p.shape == (n, r) and q.shape == (m, r)
    approx = fast.low_rank_decompress(p, q)
    assert float((approx - matrix).norm() / matrix.norm()) < 1e-10
    p_ref, q_ref = ref.low_rank_approximation_reference(matrix.numpy(), q0.numpy())
    np.testing.assert_allclose(p.numpy(), p_ref, atol=1e-8)
    np.testing.assert_allclose(q.numpy(), q_ref, atol=1e-8)


def test_low_rank_power_iterations_improve_full_rank_approximation() -> None:
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.float64))
    sigma = torch.tensor([10.0, 5.0] + [0.1] * 38, dtype=torch.float64)
    matrix = u[:, :40] @ torch.diag(sigma) @ v.T
    q0 = torch.randn(40, 2, generator=g, dtype=torch.float64)
    errors = []
    for iterations in (1, 3, 10):
        p, q = fast.low_rank_approximation(matrix, q0, num_iterations=iterations)
        errors.append(float((fast.low_rank_decompress(p, q) - matrix).norm()))
    best = float(sigma[2:].norm())  # Eckart-Young: the best rank-2 error
    assert errors[0] >= errors[1] >= errors[2] and errors[2] == pytest.approx(best, rel=1e-6)
    with pytest.raises(ValueError, match="num_iterations=0"):
        fast.low_rank_approximation(matrix, q0, num_iterations=0)


def test_batched_low_rank_shapes() -> None:
    matrices = torch.randn(3, 20, 10)
    q = torch.randn(3, 10, 2)
    p = fast.orthogonalize_(fast.low_rank_p(matrices, q))
    q = fast.low_rank_q(matrices, p)
    assert p.shape == (3, 20, 2) and q.shape == (3, 10, 2)
    assert fast.low_rank_decompress(p, q).shape == (3, 20, 10)
