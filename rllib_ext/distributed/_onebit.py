"""1-bit hook: scaled signs, 8 per byte, plus one fp32 scale per bucket, exchanged by all-gather.

Part of :mod:`rllib_ext.distributed.comm_hooks` (kept in its own module for size). The math is
in :mod:`rllib_ext.ops.compression`.

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` compares the hook's
annotations with the real ``dist.GradBucket`` / ``Future[Tensor]`` classes.
"""

import time
from typing import Any

import torch
import torch.distributed as dist

from rllib_ext.distributed._base import (
    CommHookState,
    _PendingBuckets,
    all_gather_single,
    allgather_wire_bytes,
    allreduce_wire_bytes,
    bucket_fingerprint,
)
from rllib_ext.ops import compression

__all__ = ["OneBitState", "onebit_hook"]


class OneBitState(CommHookState):
    """State of :func:`onebit_hook`: error-feedback residuals per bucket, scratch buffers.

    Args:
        process_group: group to communicate in; ``None`` = default group.
        error_feedback: keep, per bucket and per rank, ``residual = gradient + old residual -
            what was sent`` and add it to the next gradient (Karimireddy et al. 2019). Without
            it sign compression is biased and the error of the summed updates grows linearly.
            Costs one fp32 copy of the gradients (plus one scratch copy of the largest bucket).
    """

    hook_name = "onebit"
    __slots__ = (
        # Hyper-parameters.
        "error_feedback",
        # Internal state, private to this rank: bucket index -> fp32 residual, bucket index ->
        # parameter-size fingerprint of the layout the residual belongs to, and restored
        # residuals waiting for their layout.
        "residuals",
        "fingerprints",
        "_pending",
        # Scratch (not saved): per-bucket bool sign workspace, one fp32 buffer of +-1 signs.
        "_sign_workspaces",
        "_scratch",
    )

    def __init__(
        self, process_group: dist.ProcessGroup | None = None, *, error_feedback: bool = True
    ) -> None:
        if not isinstance(error_feedback, bool):
            raise TypeError(
                f"error_feedback={error_feedback!r} must be a bool (True or False). "
                "Fix: pass error_feedback=True (recommended) or False."
            )
        super().__init__(process_group)
        self.error_feedback = error_feedback
        self.residuals: dict[int, torch.Tensor] = {}
        self.fingerprints: dict[int, tuple[int, ...]] = {}
        self._pending = _PendingBuckets()
        self._sign_workspaces: dict[int, torch.Tensor] = {}
        self._scratch: torch.Tensor | None = None

    def _hyper_parameters(self) -> tuple[str, ...]:
        return ("error_feedback",)

    def _residual_for(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The residual of this bucket, matching its current layout (zeros if none)."""
        index, buffer = bucket.index(), bucket.buffer()
        fingerprint = bucket_fingerprint(bucket)
        residual = self.residuals.get(index)
        if residual is not None and self.fingerprints.get(index) != fingerprint:
            residual = None  # DDP rebuilt its buckets: the old residual belongs to other params
        restored = self._pending.take(index, fingerprint)
        if restored is not None:
            residual = restored["residual"].to(buffer.device, torch.float32)
        if residual is None:
            residual = torch.zeros(buffer.numel(), dtype=torch.float32, device=buffer.device)
        self.residuals[index] = residual
        self.fingerprints[index] = fingerprint
        return residual

    def _sign_workspace(self, index: int, numel: int, device: torch.device) -> torch.Tensor:
        workspace = self._sign_workspaces.get(index)
        if workspace is None or workspace.numel() < (numel + 7) // 8 * 8:
            workspace = torch.empty((numel + 7) // 8 * 8, dtype=torch.bool, device=device)
            self._sign_workspaces[index] = workspace
        return workspace

    def _scratch_for(self, numel: int, device: torch.device) -> torch.Tensor:
        # One buffer for all buckets: it is only used inside the synchronous part of the hook.
        if self._scratch is None or self._scratch.numel() < numel:
            self._scratch = torch.empty(numel, dtype=torch.float32, device=device)
        return self._scratch

    def rescale_error_feedback(self, factor: float) -> None:
        for residual in self.residuals.values():
            residual.mul_(factor)
        for entry in self._pending.entries.values():
            entry["residual"] = entry["residual"] * factor

    def _rank_state(self) -> dict[str, Any]:
        return {
            "buckets": {
                index: {"fingerprint": list(self.fingerprints[index]), "residual": residual}
                for index, residual in self.residuals.items()
            }
        }

    def _load_rank(self, rank_state: dict[str, Any] | None) -> None:
        self.residuals.clear()
        self.fingerprints.clear()
        buckets = (rank_state or {}).get("buckets", {})
        self._pending = _PendingBuckets({int(k): dict(v) for k, v in buckets.items()})

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_sign_workspaces"] = {}  # scratch, rebuilt on demand
        state["_scratch"] = None
        return state


def onebit_hook(state: OneBitState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """1-bit (scaled sign) compression with per-rank error feedback, exchanged by all-gather.

    Each rank sends ``ceil(n/8)`` bytes of sign bits plus one fp32 scale ``mean(|c|)`` of
    ``c = gradient + residual``; every rank decodes ``mean_r scale_r * sign_r`` in rank order,
    so all ranks hold bit-identical gradients. Signs cannot be summed by an all-reduce, hence
    the all-gather (bytes grow with ``W - 1``; fine for the few learners RLlib runs).
    """
    start = time.perf_counter()
    group = state._group()
    world_size = group.size()
    buffer = bucket.buffer()
    numel, index = buffer.numel(), bucket.index()
    if state.error_feedback:
        corrected = state._residual_for(bucket).add_(buffer)
    else:
        corrected = buffer if buffer.dtype == torch.float32 else buffer.float()
    workspace = state._sign_workspace(index, numel, buffer.device)
    signs = state._scratch_for(numel, buffer.device) if corrected.dtype == torch.float32 else None
    packed, scale = compression.onebit_encode(corrected, workspace=workspace, signs=signs)
    if state.error_feedback:
        if bool(torch.isfinite(scale)):
            compression.onebit_residual_(corrected, scale, signs=signs)
        else:
            # Overflow step (the GradScaler skips it): inf - inf would make the residual NaN
            # forever, so restart this bucket's error feedback from zero.
            corrected.zero_()
    payload = compression.pack_onebit_payload(packed, scale)
    gathered = payload.new_empty(world_size * payload.numel())
    bytes_sent = allgather_wire_bytes(payload.numel(), world_size)
    bytes_plain = allreduce_wire_bytes(numel * 4, world_size)
    encode_s = time.perf_counter() - start
    future = all_gather_single(gathered, payload, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()  # re-raises a failed collective
        decode_start = time.perf_counter()
        payloads = gathered.view(world_size, -1)
        if buffer.dtype == torch.float32:
            compression.onebit_decode_mean(payloads, numel, out=buffer)
        else:
            buffer.copy_(compression.onebit_decode_mean(payloads, numel))
        scales = payloads[:, :4].clone().view(torch.float32)
        end = time.perf_counter()
        state._record(
            bytes_sent=bytes_sent,
            bytes_uncompressed=bytes_plain,
            comm_time_s=end - start,
            encode_time_s=encode_s,
            decode_time_s=end - decode_start,
            is_last=bucket.is_last(),
            nonfinite=not bool(torch.isfinite(scales).all()),
        )
        if bucket.is_last():
            state._pending.end_step(state.hook_name)
        return buffer

    return future.then(decompress)
