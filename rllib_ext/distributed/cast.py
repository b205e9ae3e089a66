"""fp16 and bf16 hooks: gradients travel as 2-byte floats (math in :mod:`rllib_ext.ops.codecs.cast`).

No ``from __future__ import annotations`` (DDP checks the hook annotations; see ``_hook``).
"""

from typing import Any

import torch
import torch.distributed as dist

from rllib_ext.distributed._hook import HookCall
from rllib_ext.distributed.state import CommHookState, Group
from rllib_ext.ops.codecs import cast
from rllib_ext.settings import CompressionSettings

__all__ = ["BF16_TRANSPORTS", "BF16State", "FP16State", "bf16_hook", "fp16_hook"]

BF16_TRANSPORTS = ("auto", "allreduce", "allgather", "fp32")
_GLOO_BF16_SUPPORT: dict[str, bool] = {}


def gloo_supports_bf16() -> bool:
    """Whether this torch's gloo can all-reduce bf16 (torch 2.13 can; older builds raise
    "Invalid scalar type", pytorch#111131). Probed once on a private 1-rank group."""
    if "gloo" not in _GLOO_BF16_SUPPORT:
        try:
            gloo: Any = dist.ProcessGroupGloo  # torch's stubs miss the defaults and allreduce
            probe_group = gloo(dist.HashStore(), 0, 1)
            probe_group.allreduce([torch.ones(2, dtype=torch.bfloat16)]).wait()
            _GLOO_BF16_SUPPORT["gloo"] = True
        except Exception:  # any failure means: do not rely on it
            _GLOO_BF16_SUPPORT["gloo"] = False
    return _GLOO_BF16_SUPPORT["gloo"]


class FP16State(CommHookState):
    """State of :func:`fp16_hook`: no hyper-parameters, only the group and statistics."""

    hook_name = "fp16"
    __slots__ = ()

    def __init__(self, settings: CompressionSettings, process_group: Group = None) -> None:
        super().__init__(process_group)


class BF16State(CommHookState):
    """State of :func:`bf16_hook`.

    Args:
        settings: the compression settings (nothing in them is bf16-specific).
        process_group: group to communicate in; ``None`` = default group.
        transport: how bf16 values travel.
            ``"allreduce"``: native bf16 all-reduce (NCCL >= 2.10; gloo only in torch builds
            that define bf16 for gloo, e.g. 2.13). Same numerics as PyTorch's
            ``bf16_compress_hook``.
            ``"allgather"``: every rank all-gathers its bf16 bit patterns as bytes (every
            backend supports uint8); each rank then sums the W values in fp32 in rank order,
            divides by W and rounds to bf16. Bytes ``(W-1) * 2n``: the same as an fp16
            all-reduce at W=2, equal to fp32 all-reduce at W=4, worse beyond.
            ``"fp32"``: all-reduce of bf16-rounded values in fp32; bf16 numerics, no byte saving.
            ``"auto"``: ``"allreduce"`` where the backend supports bf16, otherwise
            ``"allgather"`` for W <= 4 and ``"fp32"`` above.
    """

    hook_name = "bf16"
    __slots__ = (
        # Hyper-parameters.
        "transport",
        # Internal state: the transport "auto" resolved to (on first use).
        "_resolved_transport",
    )

    def __init__(
        self, settings: CompressionSettings, process_group: Group = None, *, transport: str = "auto"
    ) -> None:
        if transport not in BF16_TRANSPORTS:
            raise ValueError(
                f"bf16 transport={transport!r} is not supported; allowed: {BF16_TRANSPORTS}. "
                "Fix: use 'auto' unless you need a specific wire format."
            )
        super().__init__(process_group)
        self.transport = transport
        self._resolved_transport: str | None = None

    def _hyper_parameters(self) -> tuple[str, ...]:
        return ("transport",)

    def resolved_transport(self) -> str:
        """The transport actually used (``"auto"`` resolved against backend and world size)."""
        if self._resolved_transport is None:
            transport = self.transport
            if transport == "auto":
                group = self.group()
                if dist.get_backend(group) != "gloo" or gloo_supports_bf16():
                    transport = "allreduce"
                else:
                    transport = "allgather" if dist.get_world_size(group) <= 4 else "fp32"
            self._resolved_transport = transport
        return self._resolved_transport


def _cast_allreduce(
    call: HookCall, wire: torch.Tensor, precision: torch.dtype
) -> torch.futures.Future[torch.Tensor]:
    """Sum-all-reduces ``wire`` (already divided by W); the bucket gets the sum in ``precision``."""
    work = call.all_reduce(wire)

    def decode() -> bool:
        call.buffer.copy_(wire.to(precision))  # in place, to keep peak memory down
        return False

    return call.then(work, decode)


def fp16_hook(state: FP16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Casts the bucket to fp16, divides by the world size, all-reduces, casts back.

    Bit-identical to PyTorch's ``default_hooks.fp16_compress_hook``, plus statistics.
    """
    call = HookCall(state, bucket)
    wire = cast.cast_compress(call.buffer, torch.float16, divisor=call.world_size)
    return _cast_allreduce(call, wire, torch.float16)


def bf16_hook(state: BF16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """bf16 gradient exchange that also runs on gloo; see :class:`BF16State` for the transports.

    Not named ``bf16_compress_hook`` on purpose: DDP refuses a hook of that name unless CUDA and
    NCCL >= 2.10 are present, even on backends where bf16 works.
    """
    call = HookCall(state, bucket)
    transport = state.resolved_transport()
    if transport == "allreduce":
        wire = cast.cast_compress(call.buffer, torch.bfloat16, divisor=call.world_size)
        return _cast_allreduce(call, wire, torch.bfloat16)
    if transport == "fp32":
        wire = cast.round_to_bf16(call.buffer.float(), divisor=call.world_size)
        return _cast_allreduce(call, wire, torch.bfloat16)
    gathered, work = call.all_gather(cast.bf16_bytes(call.buffer))

    def decode() -> bool:
        cast.bf16_mean_of_bytes(gathered, call.world_size, out=call.buffer)
        return False

    return call.then(work, decode)
