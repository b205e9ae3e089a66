"""Pure gradient compressors: dtype casts, 1-bit sign compression, PowerSGD low-rank helpers.

These kernels do the arithmetic of the DDP communication hooks in
:mod:`rllib_ext.distributed.comm_hooks` and nothing else: no ``torch.distributed``, no state,
no Ray. Every function has a loop/NumPy twin in :mod:`rllib_ext.ops.compression_reference` and
the tests pit the two against each other.

Three families:

* **Casts** (:func:`cast_compress`, :func:`round_to_bf16`): fp32 -> fp16/bf16 with IEEE
  round-to-nearest-even. A value beyond the target range becomes ``inf``, never a clipped finite
  number, so a loss-scaled overflow stays visible to every rank's ``GradScaler``.
* **1-bit** (:func:`onebit_encode`, :func:`onebit_decode`, :func:`onebit_decode_mean`,
  :func:`pack_onebit_payload`): scaled sign compression (Seide et al. 2014, "1-bit SGD";
  Karimireddy et al. 2019, https://arxiv.org/abs/1901.09847 for error feedback). A vector ``x``
  of ``n`` elements is sent as ``ceil(n/8)`` bytes of packed signs plus one fp32 scale
  ``s = mean(|x|)``, and decoded as ``s * sign(x)``. ``mean(|x|)`` is the scale that minimises
  ``||x - s * sign(x)||_2`` for fixed signs.
* **Low rank** (:func:`orthogonalize_`, :func:`low_rank_p`, :func:`low_rank_q`,
  :func:`low_rank_decompress`, :func:`low_rank_approximation`): one step of subspace (power)
  iteration as in PowerSGD (Vogels et al. 2019, https://arxiv.org/abs/1905.13727): for a
  gradient matrix ``M [n, m]`` and ``Q [m, r]``: ``P = M Q``, orthonormalise ``P``,
  ``Q = M^T P``, ``M ~ P Q^T``. Exact when ``rank(M) <= r`` and ``Q`` is generic.

Sign convention: the packed bits *are* the IEEE sign bits: bit 1 = sign bit set = ``-1``
(``-0.0`` included), bit 0 = ``+1``. A NaN encodes its sign bit, which does not matter because a
NaN anywhere makes the scale NaN (see :func:`onebit_scale`). Bit ``i`` of byte ``j`` holds
element ``8 * j + i`` (little-endian bit order); padding bits of the last byte are 0.
"""

from __future__ import annotations

import torch

__all__ = [
    "cast_compress",
    "round_to_bf16",
    "pack_signs",
    "unpack_signs",
    "onebit_scale",
    "onebit_encode",
    "onebit_decode",
    "onebit_residual_",
    "onebit_decode_mean",
    "onebit_payload_nbytes",
    "pack_onebit_payload",
    "unpack_onebit_payload",
    "should_compress_low_rank",
    "orthogonalize_",
    "low_rank_p",
    "low_rank_q",
    "low_rank_decompress",
    "low_rank_approximation",
]

_SCALE_BYTES = 4  # one fp32 scale at the head of every 1-bit payload
_SPREAD_TO_TOP_BYTE = 0x0102040810204080  # sum_i 2^(56 - 7i), see pack_signs
_SIGN_TABLE_CACHE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


# --------------------------------------------------------------------------------------------
# Casts.
# --------------------------------------------------------------------------------------------


def cast_compress(tensor: torch.Tensor, dtype: torch.dtype, *, divisor: int = 1) -> torch.Tensor:
    """Casts to ``dtype`` and then divides by ``divisor``, in a new tensor.

    The order (cast first, divide second) is the one of PyTorch's ``fp16_compress_hook``, so the
    result is bit-identical to it. It also matters for mixed precision: an fp32 value above
    65504 (the fp16 maximum; values from 65520 up round to ``inf``) turns into ``inf`` *before*
    the division, so a loss-scaled overflow reaches the wire as ``inf`` instead of being hidden
    by a division that would have brought it back into range.

    Args:
        tensor: any shape, floating dtype.
        dtype: the wire dtype, e.g. ``torch.float16`` or ``torch.bfloat16``.
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


def round_to_bf16(tensor: torch.Tensor) -> torch.Tensor:
    """Rounds to the nearest bfloat16 value (ties to even), returned in ``tensor``'s dtype.

    bf16 keeps fp32's 8 exponent bits, so nothing overflows: ``inf`` and NaN pass through and
    finite fp32 values near ``3.4e38`` may round up to ``inf`` exactly as IEEE rounding says.

    Args:
        tensor: any shape, fp32 (or fp64/fp16).

    Returns:
        Same shape and dtype as ``tensor``.
    """
    return tensor.to(torch.bfloat16).to(tensor.dtype)


# --------------------------------------------------------------------------------------------
# 1-bit: packed sign bits plus one fp32 scale.
# --------------------------------------------------------------------------------------------


def _padded_to_bytes(numel: int) -> int:
    return (numel + 7) // 8 * 8


def pack_signs(tensor: torch.Tensor, *, workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Packs the IEEE sign bits of ``tensor`` eight per byte.

    Args:
        tensor: any shape, ``n`` elements; flattened in row-major order.
        workspace: optional bool scratch tensor with at least ``ceil(n / 8) * 8`` elements,
            reused between calls to avoid allocating (and page-faulting) ``n`` bytes each time.
            Its contents are overwritten.

    Returns:
        ``[ceil(n / 8)]`` uint8; bit ``i`` of byte ``j`` is the sign bit of element ``8j + i``
        (1 = negative); padding bits are 0.
    """
    flat = tensor.reshape(-1)
    numel = flat.numel()
    padded = _padded_to_bytes(numel)
    if workspace is None or workspace.numel() < padded or workspace.dtype != torch.bool:
        workspace = torch.empty(padded, dtype=torch.bool, device=flat.device)
    bits = workspace[:padded]
    torch.signbit(flat, out=bits[:numel])
    bits[numel:].zero_()
    # Eight 0/1 bytes read as one little-endian int64 word w = sum_i b_i 2^(8i). Multiplying by
    # K = sum_i 2^(56 - 7i) moves b_i to bit 56 + i; all partial products land on distinct bits
    # (8i - 7j = 8i' - 7j' has no other solution for i, j < 8), so there are no carries, and the
    # top byte is exactly b_0..b_7. int64 overflow wraps, which only drops bits above 63.
    words = bits.view(torch.int64)
    words.mul_(_SPREAD_TO_TOP_BYTE).bitwise_right_shift_(56).bitwise_and_(0xFF)
    return words.to(torch.uint8)


def _sign_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``[256, 8]`` table: entry ``(b, i)`` is -1 if bit ``i`` of byte ``b`` is set, else +1."""
    key = (device, dtype)
    table = _SIGN_TABLE_CACHE.get(key)
    if table is None:
        byte = torch.arange(256, device=device).unsqueeze(1)
        bits = (byte >> torch.arange(8, device=device)) & 1
        table = (1 - 2 * bits).to(dtype)
        _SIGN_TABLE_CACHE[key] = table
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


def unpack_signs(
    packed: torch.Tensor, numel: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`pack_signs`.

    Args:
        packed: ``[ceil(numel / 8)]`` uint8.
        numel: number of signs to return (the padding bits are dropped).
        dtype: output dtype.

    Returns:
        ``[numel]`` of ``+1`` (sign bit clear) / ``-1`` (sign bit set) in ``dtype``.
    """
    out = torch.empty(numel, dtype=dtype, device=packed.device)
    return _gather_rows(_sign_table(packed.device, dtype), packed.int(), numel, out)


def onebit_scale(tensor: torch.Tensor, *, signs: torch.Tensor | None = None) -> torch.Tensor:
    """The scale ``mean(|x|)`` as a 0-d fp32 tensor (0 for an empty tensor).

    Accumulated in fp32 whatever the input dtype. Non-finite in, non-finite out: one ``inf``
    makes the scale ``inf`` and one NaN makes it NaN, which is how a mixed-precision overflow
    survives 1-bit compression (the decoded vector is then non-finite on every rank).

    Args:
        tensor: any shape, floating dtype.
        signs: optional fp32 ``[n]`` buffer. If given, it is filled with ``copysign(1, x)``
            and the scale is computed as ``dot(x, signs) / n`` (one BLAS pass, faster than an
            L1 norm on CPU); the caller can reuse the signs for :func:`onebit_residual_`.
    """
    numel = tensor.numel()
    if numel == 0:
        return torch.zeros((), dtype=torch.float32, device=tensor.device)
    flat = tensor.reshape(-1)
    if signs is not None and flat.dtype == torch.float32:
        unit = torch.ones((), dtype=torch.float32, device=flat.device)
        torch.copysign(unit, flat, out=signs[:numel])
        return torch.dot(flat, signs[:numel]).div_(numel)
    return torch.linalg.vector_norm(flat, ord=1, dtype=torch.float32).div_(numel)


def onebit_encode(
    tensor: torch.Tensor,
    *,
    workspace: torch.Tensor | None = None,
    signs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled-sign compression of ``tensor``.

    Args:
        tensor: any shape, ``n`` elements, floating dtype.
        workspace: optional bool scratch, see :func:`pack_signs`.
        signs: optional fp32 ``[>= n]`` scratch, see :func:`onebit_scale`.

    Returns:
        ``(packed, scale)``: ``packed`` is ``[ceil(n / 8)]`` uint8 (see :func:`pack_signs`),
        ``scale`` a 0-d fp32 tensor (see :func:`onebit_scale`).
    """
    return pack_signs(tensor, workspace=workspace), onebit_scale(tensor, signs=signs)


def onebit_decode(
    packed: torch.Tensor,
    scale: torch.Tensor,
    numel: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scale * sign``: the vector a receiver reconstructs from one rank's message.

    Args:
        packed: ``[ceil(numel / 8)]`` uint8.
        scale: 0-d floating tensor.
        numel: number of elements.
        out: optional ``[numel]`` fp32 destination.

    Returns:
        ``[numel]`` fp32.
    """
    if out is None:
        out = torch.empty(numel, dtype=torch.float32, device=packed.device)
    table = _sign_table(packed.device, torch.float32) * scale.to(torch.float32)
    return _gather_rows(table, packed.int(), numel, out)


def onebit_residual_(
    tensor: torch.Tensor,
    scale: torch.Tensor,
    *,
    signs: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """In place: ``tensor -= scale * sign(tensor)``, the part that 1-bit compression lost.

    Equal to ``tensor - onebit_decode(*onebit_encode(tensor), n)`` (same sign-bit convention:
    ``copysign`` reads the same IEEE sign bit as :func:`pack_signs`), without unpacking.

    Args:
        tensor: ``[n]`` fp32, modified in place.
        scale: 0-d fp32, the scale that was sent.
        signs: the ``copysign(1, tensor)`` buffer :func:`onebit_scale` filled, if any.
        workspace: optional ``[>= n]`` fp32 scratch when ``signs`` is not given.

    Returns:
        ``tensor``.
    """
    numel = tensor.numel()
    scale = scale.to(tensor.dtype)
    if signs is not None:
        # tensor + (-s) * (+-1): the product is exact, so this equals tensor - s * sign.
        return tensor.addcmul_(signs[:numel].view_as(tensor), -scale)
    if workspace is None or workspace.numel() < numel or workspace.dtype != tensor.dtype:
        workspace = torch.empty_like(tensor)
    sent = torch.copysign(scale, tensor, out=workspace[:numel].view_as(tensor))
    return tensor.sub_(sent)


def onebit_payload_nbytes(numel: int) -> int:
    """Bytes of one rank's 1-bit message for ``numel`` elements: 4 (fp32 scale) + ceil(n/8)."""
    return _SCALE_BYTES + (numel + 7) // 8


def pack_onebit_payload(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """One uint8 message: the fp32 scale's 4 bytes followed by the packed signs.

    Returns:
        ``[4 + len(packed)]`` uint8, the unit exchanged by all-gather.
    """
    scale_bytes = scale.reshape(1).to(torch.float32).view(torch.uint8)
    return torch.cat([scale_bytes, packed])


def unpack_onebit_payload(payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_onebit_payload`: ``[4 + m]`` uint8 -> (``[m]`` uint8, 0-d fp32)."""
    # clone(): a row of a gathered [W, 4 + m] buffer need not be 4-byte aligned for view().
    scale = payload[:_SCALE_BYTES].clone().view(torch.float32).reshape(())
    return payload[_SCALE_BYTES:], scale


def onebit_decode_mean(
    payloads: torch.Tensor, numel: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over ranks of ``scale_r * sign_r``: the 1-bit replacement of an averaging all-reduce.

    Ranks are decoded two at a time through a 65536-row table of ``(s_a sign_a + s_b sign_b) /
    W`` (one gather pass per pair instead of one unpack-multiply-add per rank), and pairs are
    added in rank order, so every rank that decodes the same gathered buffer gets a
    bit-identical result.

    Args:
        payloads: ``[world_size, 4 + ceil(numel / 8)]`` uint8, row ``r`` from rank ``r``.
        numel: elements per message.
        out: optional ``[numel]`` fp32 destination (e.g. the DDP bucket buffer).

    Returns:
        ``[numel]`` fp32. Non-finite wherever any rank's scale is non-finite.
    """
    world_size = payloads.shape[0]
    device = payloads.device
    if out is None:
        out = torch.empty(numel, dtype=torch.float32, device=device)
    signs = _sign_table(device, torch.float32)
    messages = [unpack_onebit_payload(row) for row in payloads]
    scratch = None
    for first in range(0, world_size, 2):
        packed_a, scale_a = messages[first]
        if first + 1 < world_size:
            packed_b, scale_b = messages[first + 1]
            table = signs.unsqueeze(1) * scale_a + signs.unsqueeze(0) * scale_b
            table = table.div_(world_size).view(256 * 256, 8)
            index = packed_a.int().mul_(256).add_(packed_b)
        else:
            table = (signs * scale_a).div_(world_size)
            index = packed_a.int()
        if first == 0:
            _gather_rows(table, index, numel, out)
        else:
            if scratch is None:
                scratch = torch.empty(numel, dtype=torch.float32, device=device)
            out.add_(_gather_rows(table, index, numel, scratch))
    return out


# --------------------------------------------------------------------------------------------
# Low rank (PowerSGD).
# --------------------------------------------------------------------------------------------


def should_compress_low_rank(
    num_rows: int, num_cols: int, rank: int, min_compression_rate: float
) -> bool:
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
        # buckets is therefore not recommended (see the hook's docstring).
        col /= torch.linalg.vector_norm(col, dim=-2, keepdim=True) + epsilon
        if i + 1 < num_cols:
            rest = matrices[..., i + 1 :]
            rest -= (col * rest).sum(dim=-2, keepdim=True) * col
    return matrices


def low_rank_p(matrix: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``P = M Q``: ``[..., n, m] x [..., m, r] -> [..., n, r]``."""
    return matrix @ q


def low_rank_q(matrix: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``Q = M^T P``: ``[..., n, m]^T x [..., n, r] -> [..., m, r]``."""
    return matrix.transpose(-2, -1) @ p


def low_rank_decompress(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``M ~ P Q^T``: ``[..., n, r] x [..., m, r]^T -> [..., n, m]``."""
    return p @ q.transpose(-2, -1)


def low_rank_approximation(
    matrix: torch.Tensor,
    q: torch.Tensor,
    *,
    num_iterations: int = 1,
    epsilon: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-process PowerSGD: ``num_iterations`` subspace iterations from ``q``.

    In a distributed run the hook all-reduces ``P`` between :func:`low_rank_p` and
    :func:`orthogonalize_`, and ``Q`` after :func:`low_rank_q`; all three steps are linear in
    ``M``, so the result equals this function applied to the mean gradient.

    Args:
        matrix: ``[..., n, m]``.
        q: ``[..., m, r]`` initial right factor (random normal on the first step; the previous
            step's ``Q`` under warm start). Not modified.
        num_iterations: power iterations (PowerSGD uses 1 per optimiser step).
        epsilon: see :func:`orthogonalize_`.

    Returns:
        ``(p, q)`` with ``p`` ``[..., n, r]`` orthonormal columns and ``q`` ``[..., m, r]``;
        ``p @ q^T`` approximates ``matrix``, exactly if ``rank(matrix) <= r``.
    """
    if num_iterations < 1:
        raise ValueError(
            f"num_iterations={num_iterations} is invalid: need at least one power iteration. "
            "Fix: pass num_iterations >= 1."
        )
    for _ in range(num_iterations):
        p = orthogonalize_(low_rank_p(matrix, q), epsilon=epsilon)
        q = low_rank_q(matrix, p)
    return p, q
