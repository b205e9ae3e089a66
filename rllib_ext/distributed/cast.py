"""DDP communication hooks: fp16, bf16 (also on gloo), PowerSGD and 1-bit with error feedback.

Shaped like PyTorch's ``torch.distributed.algorithms.ddp_comm_hooks``: each hook is a free
function ``hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]`` over a
state object, registered with ``ddp_module.register_comm_hook(state, hook)``. The math lives in
:mod:`rllib_ext.ops.compression`; this module only moves bytes and keeps memory and statistics.

=========  ===========================================  ==========================================
hook       wire format (``n`` fp32 grads, ``W`` ranks)   bytes this rank sends (ring collectives)
=========  ===========================================  ==========================================
fp16       all-reduce fp16                              ``2 (W-1)/W * 2n`` (2x smaller than fp32)
bf16       all-reduce bf16 (NCCL; gloo if torch has it) ``2 (W-1)/W * 2n``
           or all-gather of bf16 bit patterns (uint8)   ``(W-1) * 2n`` (= fp16 at W=2)
           or all-reduce of bf16-rounded fp32           ``2 (W-1)/W * 4n`` (no saving)
powersgd   all-reduce P and Q (+ uncompressed tensors)  ``2 (W-1)/W * 4 (sum (rows+cols) r)``
onebit     all-gather packed signs + fp32 scale         ``(W-1) * (n/8 + 4)``
=========  ===========================================  ==========================================

Non-finite gradients (a loss-scaled fp16 overflow) are propagated, never clipped or
``nan_to_num``'d, so every rank's ``GradScaler`` sees the overflow and skips the same step:
fp16 casts before dividing (a value above the fp16 range becomes ``inf``); 1-bit's scale becomes
inf/NaN so the decoded bucket is non-finite on every rank; PowerSGD's P/Q turn NaN. The stateful
hooks then restart their error-feedback memory (and PowerSGD its Q) from zero for that bucket:
otherwise ``inf - inf`` would keep the memory NaN for the rest of training.

This module deliberately does not use ``from __future__ import annotations``: DDP's
``register_comm_hook`` compares the ``bucket`` and return annotations with the real classes, and
string annotations would be rejected.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rllib_ext.distributed._base import (
    CommHookState,
    all_gather_single,
    allgather_wire_bytes,
    allreduce_wire_bytes,
)
from rllib_ext.distributed._onebit import OneBitState, onebit_hook
from rllib_ext.distributed._powersgd import PowerSGDHookState, powersgd_hook
from rllib_ext.ops import compression

__all__ = [
    "FP16State",
    "BF16State",
    "OneBitState",
    "PowerSGDHookState",
    "fp16_hook",
    "bf16_hook",
    "onebit_hook",
    "powersgd_hook",
    "HOOKS",
    "STATE_CLASSES",
    "make_comm_hook",
]

logger = logging.getLogger(__name__)

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

BF16_TRANSPORTS = ("auto", "allreduce", "allgather", "fp32")
_GLOO_BF16_SUPPORT: bool | None = None


def _gloo_supports_bf16() -> bool:
    """Whether this torch's gloo can all-reduce bf16 (torch 2.13 can; older builds raise
    "Invalid scalar type", pytorch#111131). Probed once on a private 1-rank group."""
    global _GLOO_BF16_SUPPORT
    if _GLOO_BF16_SUPPORT is None:
        try:
            probe_group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
            probe_group.allreduce([torch.ones(2, dtype=torch.bfloat16)]).wait()
            _GLOO_BF16_SUPPORT = True
        except Exception:  # any failure means: do not rely on it
            _GLOO_BF16_SUPPORT = False
    return _GLOO_BF16_SUPPORT


# --------------------------------------------------------------------------------------------
# States.
# --------------------------------------------------------------------------------------------


class FP16State(CommHookState):
    """State of :func:`fp16_hook`: no hyper-parameters, only the group and statistics."""

    hook_name = "fp16"
    __slots__ = ()


class BF16State(CommHookState):
    """State of :func:`bf16_hook`.

    Args:
        process_group: group to communicate in; ``None`` = default group.
        transport: how bf16 values travel.
            ``"allreduce"``: native bf16 all-reduce (NCCL >= 2.10; gloo only in torch builds
            that define bf16 for gloo, e.g. 2.13). Same numerics as PyTorch's
            ``bf16_compress_hook``.
            ``"allgather"``: every rank rounds to bf16 and all-gathers the raw 2-byte patterns
            (as uint8, which every backend supports); each rank then sums the W values in fp32
            in rank order, divides by W and rounds to bf16. Bytes ``(W-1) * 2n``: the same as
            an fp16 all-reduce at W=2, equal to fp32 all-reduce at W=4, worse beyond.
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
        self, process_group: dist.ProcessGroup | None = None, *, transport: str = "auto"
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
                group = self._group()
                backend = dist.get_backend(group)
                native = backend != "gloo" or _gloo_supports_bf16()
                if native:
                    transport = "allreduce"
                else:
                    transport = "allgather" if dist.get_world_size(group) <= 4 else "fp32"
            self._resolved_transport = transport
        return self._resolved_transport


STATE_CLASSES: dict[str, type[CommHookState]] = {
    "fp16": FP16State,
    "bf16": BF16State,
    "powersgd": PowerSGDHookState,
    "onebit": OneBitState,
}


# --------------------------------------------------------------------------------------------
# Hooks.
# --------------------------------------------------------------------------------------------


def _cast_hook(
    dtype: torch.dtype, state: CommHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce in a narrower float dtype: ``PyTorch's _compress_hook`` plus statistics."""
    start = time.perf_counter()
    group = state._group()
    world_size = group.size()
    buffer = bucket.buffer()
    # Cast first, then divide (as PyTorch does): an fp32 value beyond the fp16 range turns into
    # inf here and stays inf through the sum, so loss-scaled overflow reaches every rank.
    compressed = compression.cast_compress(buffer, dtype, divisor=world_size)
    bytes_sent = allreduce_wire_bytes(compressed.numel() * compressed.element_size(), world_size)
    bytes_plain = allreduce_wire_bytes(buffer.numel() * 4, world_size)
    encode_s = time.perf_counter() - start
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        decode_start = time.perf_counter()
        buffer.copy_(fut.value()[0])  # in place, to keep peak memory down
        end = time.perf_counter()
        state._record(
            bytes_sent=bytes_sent,
            bytes_uncompressed=bytes_plain,
            comm_time_s=end - start,
            encode_time_s=encode_s,
            decode_time_s=end - decode_start,
            is_last=bucket.is_last(),
        )
        return buffer

    return future.then(decompress)


def fp16_hook(state: FP16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Casts the bucket to fp16, divides by the world size, all-reduces, casts back.

    Bit-identical to PyTorch's ``default_hooks.fp16_compress_hook``, plus statistics.
    """
    return _cast_hook(torch.float16, state, bucket)


def bf16_hook(state: BF16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """bf16 gradient exchange that also runs on gloo; see :class:`BF16State` for the transports.

    Not named ``bf16_compress_hook`` on purpose: DDP refuses a hook of that name unless CUDA and
    NCCL >= 2.10 are present, even on backends where bf16 works.
    """
    transport = state.resolved_transport()
    if transport == "allreduce":
        return _cast_hook(torch.bfloat16, state, bucket)
    start = time.perf_counter()
    group = state._group()
    world_size = group.size()
    buffer = bucket.buffer()
    numel = buffer.numel()
    bytes_plain = allreduce_wire_bytes(numel * 4, world_size)
    rounded = buffer.to(torch.bfloat16)
    if transport == "fp32":
        wire = rounded.to(torch.float32).div_(world_size)
        bytes_sent = allreduce_wire_bytes(numel * 4, world_size)
        future = dist.all_reduce(wire, group=group, async_op=True).get_future()
    else:  # "allgather": bf16 bit patterns as bytes; no arithmetic happens on the wire
        payload = rounded.view(torch.uint8)
        wire = payload.new_empty(world_size * payload.numel())
        bytes_sent = allgather_wire_bytes(payload.numel(), world_size)
        future = all_gather_single(wire, payload, group=group, async_op=True).get_future()
    encode_s = time.perf_counter() - start

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()  # re-raises a failed collective
        decode_start = time.perf_counter()
        if transport == "fp32":
            mean = wire
        else:
            # Sum in fp32 in rank order (identical on every rank), then divide: no overflow.
            rows = wire.view(torch.bfloat16).view(world_size, numel)
            mean = buffer if buffer.dtype == torch.float32 else buffer.float()
            mean.copy_(rows[0])
            for row in rows[1:]:
                mean.add_(row)
            mean.div_(world_size)
        buffer.copy_(mean.to(torch.bfloat16))  # the result has bf16 precision, like NCCL's
        end = time.perf_counter()
        state._record(
            bytes_sent=bytes_sent,
            bytes_uncompressed=bytes_plain,
            comm_time_s=end - start,
            encode_time_s=encode_s,
            decode_time_s=end - decode_start,
            is_last=bucket.is_last(),
        )
        return buffer

    return future.then(decompress)


HOOKS: dict[str, CommHook] = {
    "fp16": fp16_hook,
    "bf16": bf16_hook,
    "powersgd": powersgd_hook,
    "onebit": onebit_hook,
}


def make_comm_hook(
    name: str,
    *,
    process_group: dist.ProcessGroup | None = None,
    powersgd_rank: int = 1,
    powersgd_start_iter: int = 1_000,
    error_feedback: bool = True,
    bf16_transport: str = "auto",
    onebit_warmup_steps: int = 0,
) -> tuple[CommHook, CommHookState]:
    """Builds ``(hook, state)`` for ``ddp_module.register_comm_hook(state, hook)``.

    One state per DDP module: states hold per-bucket memory keyed by bucket index.

    Args:
        name: one of :data:`HOOKS` (``"fp16"``, ``"bf16"``, ``"powersgd"``, ``"onebit"``).
        process_group: group to communicate in; ``None`` = default group.
        powersgd_rank: PowerSGD matrix approximation rank (start at 1, double while accuracy
            suffers; typically 1-4). Ignored by other hooks.
        powersgd_start_iter: plain all-reduce for the first ``powersgd_start_iter`` steps.
            Ignored by other hooks.
        error_feedback: error feedback for ``powersgd`` and ``onebit``. Ignored by others.
        bf16_transport: see :class:`BF16State`. Ignored by other hooks.
        onebit_warmup_steps: see :class:`OneBitState` (``warmup_steps``). Ignored by others.

    Raises:
        ValueError: unknown ``name`` or invalid hyper-parameters.
    """
    if name not in HOOKS:
        raise ValueError(
            f"Unknown gradient compression {name!r}; allowed: {sorted(HOOKS)}. Fix: pick one of "
            "these, or do not register a comm hook at all to keep DDP's plain fp32 all-reduce."
        )
    state: CommHookState
    if name == "fp16":
        state = FP16State(process_group)
    elif name == "bf16":
        state = BF16State(process_group, transport=bf16_transport)
    elif name == "onebit":
        state = OneBitState(
            process_group, error_feedback=error_feedback, warmup_steps=onebit_warmup_steps
        )
    else:
        state = PowerSGDHookState(
            process_group,
            matrix_approximation_rank=powersgd_rank,
            start_iter=powersgd_start_iter,
            error_feedback=error_feedback,
        )
    return HOOKS[name], state
