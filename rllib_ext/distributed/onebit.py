"""1-bit hook: scaled signs plus one fp32 scale per bucket, exchanged by all-gather.

The math (encode with error feedback, decode of the mean) is :mod:`rllib_ext.ops.codecs.onebit`;
this module keeps the per-bucket memory and moves the bytes. No ``from __future__ import
annotations`` (DDP checks the hook annotations; see ``_hook``).
"""

from typing import Any

import torch
import torch.distributed as dist

from rllib_ext.distributed._hook import HookCall, averaging_allreduce
from rllib_ext.distributed.state import (
    CommHookState,
    Group,
    PendingBuckets,
    bucket_fingerprint,
)
from rllib_ext.ops.codecs import check_kernel, onebit, select_kernels
from rllib_ext.settings import CompressionSettings

__all__ = ["PRECONDITIONER_FLOOR", "OneBitState", "onebit_hook"]

PRECONDITIONER_FLOOR = 1e-4
"""Smallest preconditioner, relative to the bucket's mean RMS: a parameter that had (almost) no
gradient during warm-up would otherwise amplify its later gradients without bound."""


class OneBitState(CommHookState):
    """State of :func:`onebit_hook`: error-feedback residuals per bucket, warm-up moments.

    Args:
        settings: ``compression_error_feedback`` (keep, per bucket and rank, ``residual =
            gradient + old residual - what was sent``, Karimireddy et al. 2019; one fp32 copy of
            the gradients) and ``onebit_warmup_steps`` (plain averaging all-reduces first,
            recording each element's gradient RMS; then compress ``g / rms``; one more fp32
            copy of the gradients; 0 = plain scaled-sign compression).
        process_group: group to communicate in; ``None`` = default group.
        kernel: ``"auto"``, ``"numba"`` or ``"torch"``, see
            :func:`rllib_ext.ops.codecs.select_kernels` (numba for CPU float32 buckets and up
            to 8 ranks).
    """

    hook_name = "onebit"
    __slots__ = (
        # Hyper-parameters.
        "error_feedback",
        "warmup_steps",
        "kernel",
        # Shared state (identical on every rank): steps seen, and per bucket the sum and count
        # of squared averaged gradients during warm-up, then the frozen preconditioner.
        "step",
        "second_moments",
        "preconditioners",
        # Internal state, private to this rank: bucket index -> fp32 residual, bucket index ->
        # parameter-size fingerprint of the layout the residual belongs to, and restored
        # residuals waiting for their layout.
        "residuals",
        "fingerprints",
        "_pending",
        # Scratch (not saved): one fp32 buffer for the codec.
        "_scratch",
    )

    def __init__(
        self, settings: CompressionSettings, process_group: Group = None, *, kernel: str = "auto"
    ) -> None:
        super().__init__(process_group)
        self.error_feedback = settings.compression_error_feedback
        self.warmup_steps = settings.onebit_warmup_steps
        self.kernel = check_kernel(kernel)
        self.step = 0
        self.second_moments: dict[int, tuple[tuple[int, ...], torch.Tensor, int]] = {}
        self.preconditioners: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}
        self.residuals: dict[int, torch.Tensor] = {}
        self.fingerprints: dict[int, tuple[int, ...]] = {}
        self._pending = PendingBuckets()
        self._scratch: torch.Tensor | None = None

    def _hyper_parameters(self) -> tuple[str, ...]:
        return ("error_feedback", "warmup_steps", "kernel")

    def accumulate_moment(self, bucket: dist.GradBucket, averaged: torch.Tensor) -> None:
        """Adds a warm-up step's averaged gradient squared to the bucket's second moment."""
        fingerprint = bucket_fingerprint(bucket)
        entry = self.second_moments.get(bucket.index())
        if entry is None or entry[0] != fingerprint:
            entry = (fingerprint, torch.zeros_like(averaged, dtype=torch.float32), 0)
        _, total, count = entry
        total.addcmul_(averaged, averaged)
        self.second_moments[bucket.index()] = (fingerprint, total, count + 1)

    def plan(self, bucket: dist.GradBucket) -> tuple[bool, torch.Tensor | None]:
        """``(warm_up, preconditioner)`` for this call on ``bucket``.

        Decided per bucket when the hook is called (in the backward pass), from counts that the
        previous steps' callbacks completed before this backward began: callback order within
        a step cannot change it, and every rank decides the same (same layouts, same averaged
        gradients). A bucket whose layout changes (DDP's rebuild) warms up again.
        """
        index, fingerprint = bucket.index(), bucket_fingerprint(bucket)
        device = bucket.buffer().device
        entry = self.preconditioners.get(index)
        if entry is not None and entry[0] == fingerprint:
            return False, entry[1].to(device)
        if self.warmup_steps == 0:
            return False, None
        moment = self.second_moments.get(index)
        if moment is None or moment[0] != fingerprint or moment[2] < self.warmup_steps:
            return True, None
        # End of warm-up: preconditioner = RMS of the averaged gradients, floored so that a
        # parameter with (almost) no gradient during warm-up cannot get an unbounded gain.
        _, total, count = self.second_moments.pop(index)
        rms = total.div_(count).sqrt_()
        rms.clamp_(min=PRECONDITIONER_FLOOR * float(rms.mean()) + 1e-30)
        self.preconditioners[index] = (fingerprint, rms)
        return False, rms.to(device)

    def residual_for(self, bucket: dist.GradBucket) -> torch.Tensor | None:
        """The bucket's residual for its current layout (zeros if none); ``None`` without
        error feedback."""
        if not self.error_feedback:
            return None
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

    def scratch_for(self, buffer: torch.Tensor) -> torch.Tensor:
        """One fp32 buffer for all buckets: the codec uses it only inside the hook call."""
        if self._scratch is None or self._scratch.numel() < buffer.numel():
            self._scratch = torch.empty(buffer.numel(), dtype=torch.float32, device=buffer.device)
        return self._scratch

    def rescale_error_feedback(self, factor: float) -> None:
        for residual in self.residuals.values():
            residual.mul_(factor)
        self._pending.scale("residual", factor)

    # ----------------------------------------------------------------------------- checkpoints

    def _shared_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "second_moments": {
                i: {"fingerprint": list(f), "sum": t, "count": c}
                for i, (f, t, c) in self.second_moments.items()
            },
            "preconditioners": {
                i: {"fingerprint": list(f), "rms": t} for i, (f, t) in self.preconditioners.items()
            },
        }

    def _load_shared(self, shared: Any) -> None:
        self.step = int(shared.get("step", 0))
        self.second_moments = {
            int(i): (tuple(e["fingerprint"]), e["sum"].float(), int(e["count"]))
            for i, e in shared.get("second_moments", {}).items()
        }
        self.preconditioners = {
            int(i): (tuple(e["fingerprint"]), e["rms"].float())
            for i, e in shared.get("preconditioners", {}).items()
        }

    def _rank_state(self) -> dict[str, Any]:
        return {
            "buckets": {
                index: {"fingerprint": list(self.fingerprints[index]), "residual": residual}
                for index, residual in self.residuals.items()
            }
        }

    def _load_rank(self, rank_state: Any) -> None:
        self.residuals.clear()
        self.fingerprints.clear()
        buckets = (rank_state or {}).get("buckets", {})
        self._pending = PendingBuckets({int(k): dict(v) for k, v in buckets.items()})

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_scratch": None}  # scratch is rebuilt on demand


def onebit_hook(state: OneBitState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """1-bit (scaled sign) compression with per-rank error feedback, exchanged by all-gather.

    With ``warmup_steps > 0`` the first steps are plain averaging all-reduces that also record
    each gradient element's RMS; afterwards the hook compresses ``g / rms`` (frozen, identical
    on all ranks) and multiplies the decoded mean back by ``rms``: the 1-bit Adam recipe (Tang
    et al. 2021, https://arxiv.org/abs/2102.02888) moved into the hook. Without it every element
    arrives with the bucket's one magnitude, Adam's second moment tracks that instead of the
    element's own gradient scale, and small-gradient parameters learn slowly (benchmarks/
    README.md, "Gradient compression").

    Each rank sends ``ceil(n/8)`` bytes of sign bits plus one fp32 scale; every rank decodes
    the same gathered buffer in rank order, so all ranks hold bit-identical gradients. Signs
    cannot be summed by an all-reduce, hence the all-gather (bytes grow with ``W - 1``; fine for
    the few learners RLlib runs).
    """
    call = HookCall(state, bucket)
    if call.is_last:
        state.step += 1
    # Chosen from the first call on, warm-up included: numba compiles (or reads its cache) in
    # the first update, not in the middle of a run when warm-up ends.
    kernels = select_kernels(
        state.kernel, call.buffer, applies=call.world_size <= onebit.MAX_NUMBA_RANKS
    )
    warm_up, precond = state.plan(bucket)
    if warm_up:
        return averaging_allreduce(call, after=lambda: _warmup_moment(state, bucket, call.buffer))
    residual = state.residual_for(bucket)
    call.compiled = kernels is not None
    payload = onebit.encode(
        call.buffer,
        residual=residual,
        precond=precond,
        kernels=kernels,
        scratch=state.scratch_for(call.buffer),
    )
    gathered, work = call.all_gather(payload)

    def decode() -> bool:
        payloads = gathered.view(call.world_size, -1)
        onebit.decode_mean(payloads, precond=precond, out=call.buffer, kernels=kernels)
        if call.is_last:
            state._pending.end_step(state.hook_name)
        return not bool(torch.isfinite(onebit.scales(payloads)).all())

    return call.then(work, decode)


def _warmup_moment(state: OneBitState, bucket: dist.GradBucket, averaged: torch.Tensor) -> bool:
    """Warm-up: the squared averaged gradient joins the frozen preconditioner's moment
    (identical on every rank); returns whether the bucket is non-finite."""
    finite = bool(torch.isfinite(averaged).all())
    if finite:  # an AMP overflow step must not poison the preconditioner
        state.accumulate_moment(bucket, averaged.float())
    return not finite
