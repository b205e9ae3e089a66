"""What every comm hook shares: the preamble, the recorder and the averaging all-reduce.

A hook is ``hook(state, bucket) -> Future[Tensor]``: it opens a :class:`HookCall` (the
preamble: clock, group, world size, bucket), encodes with its codec from
:mod:`rllib_ext.ops.codecs`, launches collectives through the call (which counts the bytes),
and hands its decode step to :meth:`HookCall.then`, which times it and records one
:class:`~rllib_ext.distributed.stats.BucketRecord`.

No ``from __future__ import annotations`` in the hook modules: DDP's ``register_comm_hook``
compares a hook's annotations with the real ``dist.GradBucket`` / ``Future[Tensor]`` classes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rllib_ext.distributed.state import CommHookState
from rllib_ext.distributed.stats import BucketRecord, allgather_wire_bytes, allreduce_wire_bytes

__all__ = ["HookCall", "averaging_allreduce"]

# torch >= 2.13 names the single-tensor all-gather `all_gather_single`; older ones only have
# `all_gather_into_tensor` (deprecated from 2.13 on).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class HookCall:
    """One hook call on one bucket: the shared preamble and the statistics recorder."""

    __slots__ = (
        "state",
        "group",
        "world_size",
        "buffer",
        "index",
        "is_last",
        "start",
        "bytes_sent",
        "compiled",
    )

    def __init__(self, state: CommHookState, bucket: dist.GradBucket) -> None:
        self.start = time.perf_counter()
        self.state = state
        self.group = state.group()
        self.world_size = self.group.size()
        self.buffer = bucket.buffer()
        self.index = bucket.index()
        self.is_last = bucket.is_last()
        self.bytes_sent = 0  # summed by all_reduce / all_gather
        self.compiled = False  # the hook sets it when the numba kernels do its arithmetic

    def all_reduce(self, tensor: torch.Tensor) -> dist.Work:
        """Launches a sum all-reduce of ``tensor`` in place (async); counts its bytes."""
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += allreduce_wire_bytes(nbytes, self.world_size)
        work: dist.Work = dist.all_reduce(tensor, group=self.group, async_op=True)
        return work

    def all_gather(self, payload: torch.Tensor) -> tuple[torch.Tensor, dist.Work]:
        """Launches an all-gather of ``payload`` (async): ``[W * n]``, rank order; counts bytes."""
        gathered = payload.new_empty(self.world_size * payload.numel())
        nbytes = payload.numel() * payload.element_size()
        self.bytes_sent += allgather_wire_bytes(nbytes, self.world_size)
        work = _all_gather_single(gathered, payload, group=self.group, async_op=True)
        return gathered, work

    def then(
        self, work: dist.Work, decode: Callable[[], bool]
    ) -> torch.futures.Future[torch.Tensor]:
        """The hook's future: waits for ``work``, runs ``decode`` (returns whether the decoded
        bucket is non-finite), records the bucket, resolves to the bucket buffer."""
        encode_s = time.perf_counter() - self.start

        def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
            fut.wait()  # re-raises a failed collective
            decode_start = time.perf_counter()
            nonfinite = decode()
            end = time.perf_counter()
            self.state.stats.record(
                BucketRecord(
                    hook=self.state.hook_name,
                    bucket_index=self.index,
                    is_last=self.is_last,
                    bytes_uncompressed=allreduce_wire_bytes(
                        self.buffer.numel() * 4, self.world_size
                    ),
                    bytes_sent=self.bytes_sent,
                    start_s=self.start,
                    encode_s=encode_s,
                    comm_s=end - self.start,
                    decode_s=end - decode_start,
                    compiled=self.compiled,
                    nonfinite=nonfinite,
                )
            )
            return self.buffer

        return work.get_future().then(done)


def averaging_allreduce(
    call: HookCall, *, after: Callable[[], bool] | None = None
) -> torch.futures.Future[torch.Tensor]:
    """DDP's plain averaging all-reduce of the bucket (warm-up steps of PowerSGD and 1-bit).

    Args:
        call: the hook call.
        after: runs on the averaged bucket; returns whether it is non-finite.
    """
    # Divide first: the sum of W low-precision buckets cannot overflow then.
    call.buffer.div_(call.world_size)
    work = call.all_reduce(call.buffer)
    return call.then(work, after or (lambda: False))
