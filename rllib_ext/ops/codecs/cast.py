"""Cast codec: gradients travel as fp16 or bf16 (2 bytes per element instead of 4).

Used by the ``fp16``/``bf16`` hooks of :mod:`rllib_ext.distributed.cast`; reference beside it
in :mod:`rllib_ext.ops.codecs.cast_reference`. Torch ops only (a cast is one memory-bound pass
that torch already vectorizes). IEEE round-to-nearest-even; a value beyond the fp16 range
becomes ``inf``, never a clipped finite number, so a loss-scaled overflow stays visible to every
rank's ``GradScaler``.
"""

from __future__ import annotations

import torch

__all__ = ["bf16_bytes", "bf16_mean_of_bytes", "cast_compress", "round_to_bf16"]


def cast_compress(tensor: torch.Tensor, dtype: torch.dtype, *, divisor: int = 1) -> torch.Tensor:
    """Casts to ``dtype`` and then divides by ``divisor``, in a new tensor.

    The order (cast first, divide second) is the one of PyTorch's ``fp16_compress_hook``, so the
    result is bit-identical to it. It also matters for mixed precision: an fp32 value above
    65504 (the fp16 maximum; values from 65520 up round to ``inf``) turns into ``inf`` *before*
    the division, so a loss-scaled overflow reaches the wire as ``inf`` instead of being hidden
    by a division that would have brought it back into range.

    Args:
        tensor: any shape, floating dtype.
        dtype: the wire dtype, ``torch.float16`` or ``torch.bfloat16``.
        divisor: typically the world size, so that summing the results averages.

    Returns:
        Same shape as ``tensor``, dtype ``dtype``.
    """
    compressed = tensor.to(dtype)
    if compressed is tensor:
        compressed = compressed.clone()
    if divisor != 1:
        compressed.div_(divisor)
    return compressed


def round_to_bf16(tensor: torch.Tensor, *, divisor: int = 1) -> torch.Tensor:
    """Rounds to the nearest bfloat16 value (ties to even), then divides by ``divisor``.

    bf16 keeps fp32's 8 exponent bits, so nothing overflows: ``inf`` and NaN pass through. The
    ``fp32`` bf16 transport all-reduces this (bf16 numerics, fp32 bytes).

    Args:
        tensor: any shape, fp32 (or fp64/fp16).

    Returns:
        A new tensor, same shape and dtype as ``tensor``.
    """
    rounded = tensor.to(torch.bfloat16).to(tensor.dtype)
    if divisor != 1:
        rounded.div_(divisor)
    return rounded


def bf16_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bf16 bit patterns of ``tensor`` as bytes: ``[n]`` -> ``[2n]`` uint8 (little-endian).

    What the all-gather bf16 transport sends: every backend can gather uint8, and no arithmetic
    happens on the wire.
    """
    return tensor.reshape(-1).to(torch.bfloat16).view(torch.uint8)


def bf16_mean_of_bytes(gathered: torch.Tensor, world_size: int, *, out: torch.Tensor) -> None:
    """Mean over ranks of all-gathered :func:`bf16_bytes`, rounded to bf16, written to ``out``.

    Sums in fp32 in rank order (identical on every rank), then divides: no overflow, and the
    result has bf16 precision like a native bf16 all-reduce.

    Args:
        gathered: ``[world_size * 2n]`` uint8, rank ``r``'s bytes at ``[2nr, 2n(r+1))``.
        world_size: number of ranks.
        out: ``[n]`` destination (any float dtype).
    """
    rows = gathered.view(torch.bfloat16).view(world_size, out.numel())
    mean = out if out.dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32)
    mean.copy_(rows[0])
    for row in rows[1:]:
        mean.add_(row)
    mean.div_(world_size)
    out.copy_(mean.to(torch.bfloat16))
