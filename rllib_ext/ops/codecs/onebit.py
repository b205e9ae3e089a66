"""1-bit codec: scaled signs, 8 per byte, plus one fp32 scale, with error feedback.

Used by the ``onebit`` hook of :mod:`rllib_ext.distributed.onebit`, which calls :func:`encode`
before its all-gather and :func:`decode_mean` after it; reference beside it in
:mod:`rllib_ext.ops.codecs.onebit_reference`. Behind both functions: torch ops, or the fused
numba kernels of :mod:`rllib_ext.ops.codecs._numba` (``kernels``, chosen by
:func:`rllib_ext.ops.codecs._select.select_kernels`). Same signs, residuals and decoded values
either way; only the float32 scale ``mean(|c|)`` is summed in another order.

Math (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, https://arxiv.org/abs/1901.09847
for error feedback): a vector ``c`` of ``n`` elements is sent as ``ceil(n/8)`` bytes of packed
signs plus one fp32 scale ``s = mean(|c|)`` (the scale that minimises ``||c - s sign(c)||_2`` for
fixed signs) and decoded as ``s * sign(c)``. With error feedback ``c = g / precond + residual``
and the new residual is ``c - s sign(c)``.

Sign convention: the packed bits *are* the IEEE sign bits: bit 1 = sign bit set = ``-1``
(``-0.0`` included), bit 0 = ``+1``. Bit ``i`` of byte ``j`` holds element ``8j + i``; padding
bits are 0. Non-finite in, non-finite out: one inf/NaN in ``c`` makes the scale non-finite, so
the decoded mean is non-finite on every rank (a loss-scaled overflow survives compression); the
residual then restarts from zero, since ``inf - inf`` would keep it NaN forever.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch

__all__ = ["MAX_NUMBA_RANKS", "decode_mean", "encode", "pack_signs", "payload_nbytes", "scales"]

MAX_NUMBA_RANKS = 8
"""The numba decode table has ``2^W`` entries; larger groups use the torch decode."""

SCALE_BYTES = 4  # one fp32 scale at the head of every payload
_SPREAD_TO_TOP_BYTE = 0x0102040810204080  # sum_i 2^(56 - 7i), see pack_signs
_SIGN_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def payload_nbytes(numel: int) -> int:
    """Bytes of one rank's message for ``numel`` elements: 4 (fp32 scale) + ceil(n/8)."""
    return SCALE_BYTES + (numel + 7) // 8


def scales(payloads: torch.Tensor) -> torch.Tensor:
    """The fp32 scales at the head of gathered payloads: ``[W, 4 + m]`` uint8 -> ``[W]``."""
    # clone(): a row of the gathered buffer need not be 4-byte aligned for view().
    return payloads[:, :SCALE_BYTES].flatten().clone().view(torch.float32)


def encode(
    grad: torch.Tensor,
    *,
    residual: torch.Tensor | None,
    precond: torch.Tensor | None,
    kernels: ModuleType | None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """One rank's message for ``c = grad / precond (+ residual)``; updates ``residual``.

    Args:
        grad: ``[n]`` gradient bucket, floating dtype (fp32 for the numba kernels).
        residual: ``[n]`` fp32 error-feedback memory, updated in place to ``c - s sign(c)``
            (zeros when ``s`` is not finite); ``None``: no error feedback.
        precond: ``[n]`` fp32 per-element divisor, or ``None``.
        kernels: the numba kernels, or ``None`` for torch ops.
        scratch: optional fp32 ``[>= n]`` buffer reused between calls (avoids allocating).

    Returns:
        ``[4 + ceil(n/8)]`` uint8: the fp32 scale's bytes, then the packed sign bits.
    """
    numel = grad.numel()
    if scratch is None or scratch.numel() < numel:
        scratch = torch.empty(numel, dtype=torch.float32, device=grad.device)
    payload = torch.empty(payload_nbytes(numel), dtype=torch.uint8, device=grad.device)
    if kernels is not None:
        corrected = residual if residual is not None else scratch[:numel]
        has_precond = precond is not None
        values = grad.numpy()
        abs_sum = kernels.encode(
            values,
            precond.numpy() if precond is not None else values,
            has_precond,
            corrected.numpy(),
            residual is not None,
            payload[SCALE_BYTES:].numpy(),
        )
        scale = torch.tensor(abs_sum / numel if numel else 0.0, dtype=torch.float32)
    else:
        corrected = _corrected(grad, residual, precond)
        signs = scratch if corrected.dtype == torch.float32 else None
        payload[SCALE_BYTES:] = pack_signs(corrected)
        scale = _scale(corrected, signs=signs)
    payload[:SCALE_BYTES] = scale.reshape(1).to(torch.float32).view(torch.uint8)
    if residual is not None:
        if not bool(torch.isfinite(scale)):
            residual.zero_()
        elif kernels is not None:
            kernels.residual(residual.numpy(), np.float32(scale.item()))
        else:
            # c + (-s) * (+-1): the product is exact, so this equals c - s * sign(c).
            residual.addcmul_(signs[:numel], -scale.to(residual.device))  # type: ignore[index]
    return payload


def _corrected(
    grad: torch.Tensor, residual: torch.Tensor | None, precond: torch.Tensor | None
) -> torch.Tensor:
    """``c = grad / precond + residual``, in ``residual`` where there is one."""
    if residual is not None:
        return residual.add_(grad) if precond is None else residual.addcdiv_(grad, precond)
    if precond is None:
        return grad if grad.dtype == torch.float32 else grad.float()
    return grad.float().div_(precond)


def pack_signs(tensor: torch.Tensor) -> torch.Tensor:
    """Packs the IEEE sign bits of ``tensor`` eight per byte (torch ops).

    Args:
        tensor: ``[n]``.

    Returns:
        ``[ceil(n / 8)]`` uint8; bit ``i`` of byte ``j`` is the sign bit of element ``8j + i``.
    """
    flat = tensor.reshape(-1)
    numel = flat.numel()
    bits = torch.zeros((numel + 7) // 8 * 8, dtype=torch.bool, device=flat.device)
    torch.signbit(flat, out=bits[:numel])
    # Eight 0/1 bytes read as one little-endian int64 word w = sum_i b_i 2^(8i). Multiplying by
    # K = sum_i 2^(56 - 7i) moves b_i to bit 56 + i; all partial products land on distinct bits
    # (8i - 7j = 8i' - 7j' has no other solution for i, j < 8), so there are no carries, and the
    # top byte is exactly b_0..b_7. int64 overflow wraps, which only drops bits above 63.
    words = bits.view(torch.int64)
    words.mul_(_SPREAD_TO_TOP_BYTE).bitwise_right_shift_(56).bitwise_and_(0xFF)
    return words.to(torch.uint8)


def _scale(corrected: torch.Tensor, *, signs: torch.Tensor | None) -> torch.Tensor:
    """``mean(|c|)``, 0-d fp32 (0 when empty); fills ``signs`` with ``copysign(1, c)`` if given
    (then one BLAS dot, faster than an L1 norm on CPU, and the signs serve the residual)."""
    numel = corrected.numel()
    if numel == 0:
        return torch.zeros((), dtype=torch.float32, device=corrected.device)
    if signs is not None:
        unit = torch.ones((), dtype=torch.float32, device=corrected.device)
        torch.copysign(unit, corrected, out=signs[:numel])
        total = torch.dot(corrected, signs[:numel])
    else:
        total = torch.linalg.vector_norm(corrected, ord=1, dtype=torch.float32)
    return total.div_(numel)


def decode_mean(
    payloads: torch.Tensor,
    *,
    precond: torch.Tensor | None,
    out: torch.Tensor,
    kernels: ModuleType | None,
) -> torch.Tensor:
    """``precond * mean_r(scale_r * sign_r)``: the 1-bit replacement of an averaging all-reduce.

    Ranks are summed in rank order from lookup tables, so every rank that decodes the same
    gathered buffer gets a bit-identical result (torch: pairs of ranks through a 65536-row
    table; numba: all ranks through one ``2^W`` table, ``W <= MAX_NUMBA_RANKS``).

    Args:
        payloads: ``[W, 4 + ceil(n / 8)]`` uint8, row ``r`` from rank ``r``.
        precond: ``[n]`` fp32 multiplier, or ``None``.
        out: ``[n]`` destination (the bucket; fp32 for the numba kernels).
        kernels: the numba kernels, or ``None`` for torch ops.

    Returns:
        ``out``. Non-finite wherever any rank's scale is non-finite.
    """
    if kernels is not None:
        table = kernels.decode_table(scales(payloads).numpy())
        values = out.numpy()
        has_precond = precond is not None
        factor = precond.numpy() if precond is not None else values
        kernels.decode_mean(payloads.numpy()[:, SCALE_BYTES:], table, factor, has_precond, values)
        return out
    mean = out if out.dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32)
    _decode_mean_torch(payloads, mean)
    if precond is not None:
        mean.mul_(precond)
    if mean is not out:
        out.copy_(mean)
    return out


def _decode_mean_torch(payloads: torch.Tensor, out: torch.Tensor) -> None:
    world_size, numel = payloads.shape[0], out.numel()
    signs = _sign_table(payloads.device)
    rank_scales = scales(payloads)
    bits = payloads[:, SCALE_BYTES:]
    scratch = None
    for first in range(0, world_size, 2):
        if first + 1 < world_size:
            table = (
                signs.unsqueeze(1) * rank_scales[first]
                + signs.unsqueeze(0) * rank_scales[first + 1]
            )
            table = table.div_(world_size).view(256 * 256, 8)
            index = bits[first].int().mul_(256).add_(bits[first + 1])
        else:
            table = (signs * rank_scales[first]).div_(world_size)
            index = bits[first].int()
        if first == 0:
            _gather_rows(table, index, numel, out)
        else:
            if scratch is None:
                scratch = torch.empty(numel, dtype=torch.float32, device=out.device)
            out.add_(_gather_rows(table, index, numel, scratch))


def _sign_table(device: torch.device) -> torch.Tensor:
    """``[256, 8]`` fp32: entry ``(b, i)`` is -1 if bit ``i`` of byte ``b`` is set, else +1."""
    key = (device, torch.float32)
    table = _SIGN_TABLES.get(key)
    if table is None:
        byte = torch.arange(256, device=device).unsqueeze(1)
        bits = (byte >> torch.arange(8, device=device)) & 1
        table = _SIGN_TABLES[key] = (1 - 2 * bits).to(torch.float32)
    return table


def _gather_rows(
    table: torch.Tensor, index: torch.Tensor, numel: int, out: torch.Tensor
) -> torch.Tensor:
    """``out[:numel] = table[index].reshape(-1)[:numel]`` without an ``[8 * len(index)]`` temp."""
    full = numel // 8
    if full:
        torch.index_select(table, 0, index[:full], out=out[: full * 8].view(full, 8))
    tail = numel - full * 8
    if tail:
        out[full * 8 :] = table[index[full]][:tail]
    return out
