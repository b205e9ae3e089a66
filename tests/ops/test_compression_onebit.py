"""rllib_ext.ops.codecs.onebit (what the 1-bit hook calls), numba and torch, against the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_ext.ops.codecs import check_kernel, onebit, select_kernels
from rllib_ext.ops.codecs import onebit_reference as ref

# Around the 4096-element block and the 8-element byte boundaries.
SIZES = [1, 7, 8, 9, 63, 4095, 4096, 4097, 10_001]
KERNELS = ["torch", "numba"]


def _values(numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 3, numel)
    if numel >= 4:
        x[:4] = torch.tensor([0.0, -0.0, 1e-40, -1e-40])  # signed zeros and denormals
    return x


def _kernels(kernel: str, *tensors: torch.Tensor):
    chosen = select_kernels(kernel, *tensors)
    assert (chosen is not None) == (kernel == "numba"), "numba is a dependency: it must load"
    return chosen


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("with_precond", [True, False])
def test_encode_matches_reference(kernel, numel, with_residual, with_precond) -> None:
    grad = _values(numel, numel)
    precond = torch.rand(numel, generator=torch.Generator().manual_seed(1)) + 0.1
    precond = precond if with_precond else None
    residual = _values(numel, numel + 1) * 0.01 if with_residual else None
    want_payload, want_residual = ref.encode_reference(
        grad.numpy(),
        None if residual is None else residual.numpy(),
        None if precond is None else precond.numpy(),
    )
    state = None if residual is None else residual.clone()
    payload = onebit.encode(
        grad.clone(),
        residual=state,
        precond=precond,
        kernels=_kernels(kernel, grad),
        scratch=torch.full((numel + 5,), 9.0),  # dirty scratch must not leak in
    )
    assert payload.dtype == torch.uint8 and payload.numel() == onebit.payload_nbytes(numel)
    np.testing.assert_array_equal(payload[4:].numpy(), want_payload[4:])  # the same signs
    got_scale = onebit.scales(payload.view(1, -1))[0]
    want_scale = want_payload[:4].view(np.float32)[0]
    np.testing.assert_allclose(got_scale, want_scale, rtol=1e-6)
    if residual is not None:
        # c - s sign(c): one rounding; the scales agree to 1e-6 (summation order), so do these.
        atol = 2e-6 * float(want_scale)
        np.testing.assert_allclose(state.numpy(), want_residual, rtol=0, atol=atol)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel", [1, 13, 4097, 10_001])
@pytest.mark.parametrize("with_precond", [True, False])
def test_decode_mean_matches_reference(kernel, world_size, numel, with_precond) -> None:
    payloads = torch.stack(
        [
            onebit.encode(
                _values(numel, 100 * r + numel), residual=None, precond=None, kernels=None
            )
            for r in range(world_size)
        ]
    )
    precond = torch.rand(numel) + 0.5 if with_precond else None
    out = torch.full((numel,), 7.0)
    onebit.decode_mean(payloads, precond=precond, out=out, kernels=_kernels(kernel, out))
    want = ref.decode_mean_reference(
        payloads.numpy(), numel, None if precond is None else precond.numpy()
    )
    # Float32 sums of +-scales cancel: the error is relative to the largest decoded value.
    atol = 1.5e-6 * float(np.abs(want).max())
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=atol)


@pytest.mark.parametrize("world_size", [1, 2])
def test_numba_and_torch_decode_bit_identical_for_two_ranks(world_size: int) -> None:
    # Same table arithmetic up to two ranks, so mixed kernels on two ranks cannot drift apart.
    payloads = torch.stack(
        [
            onebit.encode(_values(4097, r), residual=None, precond=None, kernels=None)
            for r in range(world_size)
        ]
    )
    outs = {}
    for kernel in KERNELS:
        outs[kernel] = torch.empty(4097)
        kernels = _kernels(kernel, outs[kernel])
        onebit.decode_mean(payloads, precond=None, out=outs[kernel], kernels=kernels)
    assert torch.equal(outs["torch"], outs["numba"])


def test_pack_hand_computed() -> None:
    # Element k -> bit k % 8 of byte k // 8; 1 = negative (sign bit set, -0.0 included).
    x = torch.tensor([-1.0, 2.0, -0.0, 0.0, 5.0, 6.0, 7.0, -8.0, -9.0, 1.0])
    assert onebit.pack_signs(x).tolist() == [0b10000101, 0b00000001]
    for kernel in KERNELS:
        payload = onebit.encode(x, residual=None, precond=None, kernels=_kernels(kernel, x))
        assert payload[4:].tolist() == [0b10000101, 0b00000001]
        assert onebit.scales(payload.view(1, -1)).item() == pytest.approx(3.9)  # mean |x|


def test_scale_is_l2_optimal_for_the_signs() -> None:
    x = _values(1000, 5)
    payload = onebit.encode(x, residual=None, precond=None, kernels=None)
    scale = float(onebit.scales(payload.view(1, -1))[0])
    signs = torch.where(torch.signbit(x), -1.0, 1.0)
    errors = [float((x - s * signs).norm()) for s in (0.9 * scale, scale, 1.1 * scale)]
    assert errors[1] < errors[0] and errors[1] < errors[2]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_nonfinite_gives_nonfinite_decode_and_a_fresh_residual(kernel, bad: float) -> None:
    x = _values(50, 1)
    x[17] = bad
    residual = torch.ones(50)
    kernels = _kernels(kernel, x)
    payload = onebit.encode(x, residual=residual, precond=None, kernels=kernels)
    assert not torch.isfinite(onebit.scales(payload.view(1, -1))).any()
    assert torch.equal(residual, torch.zeros(50))  # inf - inf would poison it forever
    other = onebit.encode(_values(50, 2), residual=None, precond=None, kernels=None)
    out = torch.empty(50)
    onebit.decode_mean(torch.stack([other, payload]), precond=None, out=out, kernels=kernels)
    assert not torch.isfinite(out).any()


@pytest.mark.parametrize("kernel", KERNELS)
def test_error_feedback_identity(kernel: str) -> None:
    # Decoded (one rank) + new residual = old residual + gradient: nothing is lost.
    grad, residual = _values(1001, 3), _values(1001, 4) * 0.1
    before = residual.clone()
    kernels = _kernels(kernel, grad)
    payload = onebit.encode(grad, residual=residual, precond=None, kernels=kernels)
    decoded = torch.empty(1001)
    onebit.decode_mean(payload.view(1, -1), precond=None, out=decoded, kernels=kernels)
    torch.testing.assert_close(decoded + residual, before + grad, rtol=1e-6, atol=1e-5)


def test_empty_bucket() -> None:
    payload = onebit.encode(torch.empty(0), residual=None, precond=None, kernels=None)
    assert payload.numel() == 4 and onebit.scales(payload.view(1, -1)).item() == 0.0


def test_selection_rule() -> None:
    fp32 = torch.zeros(8)
    assert select_kernels("torch", fp32) is None
    assert select_kernels("auto", fp32) is not None
    assert select_kernels("auto", fp32, applies=False) is None  # e.g. more than 8 ranks
    assert select_kernels("auto", torch.zeros(8, dtype=torch.float64)) is None
    assert select_kernels("numba", torch.zeros(4, 2).T) is None  # not contiguous
    assert check_kernel("numba") == "numba"
    with pytest.raises(ValueError, match=r"kernel='cuda'.*\('auto', 'numba', 'torch'\).*Fix"):
        check_kernel("cuda")
