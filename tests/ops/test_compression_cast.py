"""rllib_ext.ops.codecs.cast (what the fp16/bf16 hooks call) against its NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_ext.ops.codecs import cast
from rllib_ext.ops.codecs import cast_reference as ref

SIZES = [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4097]


def _values(numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 3, max(numel, 1))[:numel]
    if numel >= 6:
        x[:6] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38])
    return x


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("divisor", [1, 2, 3, 8])
def test_cast_fp16_matches_numpy(numel: int, divisor: int) -> None:
    x = _values(numel, numel + divisor)
    got = cast.cast_compress(x, torch.float16, divisor=divisor)
    assert got.dtype == torch.float16 and got.shape == x.shape
    want = ref.cast_compress_reference(x.numpy(), "float16", divisor=divisor)
    np.testing.assert_array_equal(got.float().numpy(), want)


@pytest.mark.parametrize("numel", SIZES)
def test_bf16_rounding_matches_bit_reference(numel: int) -> None:
    x = _values(numel, 11 + numel)
    np.testing.assert_array_equal(
        cast.round_to_bf16(x).numpy(), ref.round_to_bf16_reference(x.numpy())
    )
    # The fp32 transport: rounded, then divided in fp32 (the sum on the wire is rounded later).
    np.testing.assert_array_equal(
        cast.round_to_bf16(x, divisor=2).numpy(), ref.round_to_bf16_reference(x.numpy()) / 2
    )
    got = cast.cast_compress(x, torch.bfloat16, divisor=2).float().numpy()
    np.testing.assert_array_equal(
        got, ref.cast_compress_reference(x.numpy(), "bfloat16", divisor=2)
    )


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("numel", [1, 9, 1000])
def test_bf16_allgather_mean_matches_reference(world_size: int, numel: int) -> None:
    per_rank = [_values(numel, 100 * r + numel) for r in range(world_size)]
    gathered = torch.cat([cast.bf16_bytes(x) for x in per_rank])
    assert gathered.dtype == torch.uint8 and gathered.numel() == 2 * numel * world_size
    out = torch.full((numel,), 7.0)
    cast.bf16_mean_of_bytes(gathered, world_size, out=out)
    want = ref.bf16_mean_reference([x.numpy() for x in per_rank])
    np.testing.assert_array_equal(out.numpy(), want)
    half = torch.empty(numel, dtype=torch.float16)  # a non-fp32 bucket gets the same values
    cast.bf16_mean_of_bytes(gathered, world_size, out=half)
    with np.errstate(over="ignore"):  # 3e38 is inf in fp16 on both sides
        np.testing.assert_array_equal(half.numpy(), want.astype(np.float16))


def test_fp16_overflow_becomes_inf_before_division() -> None:
    # 65504 is the fp16 maximum; IEEE rounding sends [65504, 65520) to 65504 and >= 65520 to
    # inf. A loss-scaled 1e5 must arrive as inf even though 1e5 / 2 would fit in fp16.
    x = torch.tensor([65504.0, 65519.0, 65520.0, 1e5, -1e5, float("nan"), float("inf")])
    got = cast.cast_compress(x, torch.float16, divisor=2)
    expected = [32752.0, 32752.0, float("inf"), float("inf"), -float("inf")]
    assert got[:5].float().tolist() == expected
    assert torch.isnan(got[5]) and torch.isposinf(got[6])


def test_cast_returns_new_tensor_even_for_same_dtype() -> None:
    x = torch.ones(4, dtype=torch.float16)
    out = cast.cast_compress(x, torch.float16, divisor=2)
    assert out.data_ptr() != x.data_ptr() and x.tolist() == [1.0] * 4
