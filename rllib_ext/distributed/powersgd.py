"""PowerSGD hook (Vogels et al. 2019, https://arxiv.org/abs/1905.13727), layer-wise.

Same algorithm and hyper-parameters as PyTorch's ``powerSGD_hook`` (which the tests use as the
oracle): plain all-reduce for the first ``powersgd_start_iter`` steps, then every gradient
matrix ``M [n, m]`` of a bucket that passes the ``min_compression_rate`` test is replaced by
``P Q^T`` from one power iteration (math: :mod:`rllib_ext.ops.codecs.powersgd`); other tensors
(biases) are all-reduced uncompressed. Error feedback keeps ``corrected - decoded`` per bucket;
warm start reuses last step's ``Q``.

Why not call PyTorch's hook: its arithmetic is dominated by memory layout (``bmm(M^T, P)`` on
a transposed view, about 10x ``(P^T M)^T``; two fresh bucket-sized tensors per step for error
feedback; benchmarks/README.md, "Gradient compression"). And it launches its P
and Q all-reduces from inside future callbacks, i.e. from the backend's threads: on gloo, with
two or more buckets in flight, they start in a different order on different ranks and can block
every worker thread (a deadlock we hit). Here all collectives of a bucket are launched from the
hook call, in bucket order, identically on every rank; only the decode runs in a callback.

No ``from __future__ import annotations`` (DDP checks the hook annotations; see ``_hook``).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rllib_ext.distributed._hook import HookCall, averaging_allreduce
from rllib_ext.distributed.state import (
    CommHookState,
    PendingBuckets,
    bucket_fingerprint,
    int_keys,
)
from rllib_ext.ops.codecs import check_kernel, powersgd, select_kernels
from rllib_ext.settings import CompressionSettings

__all__ = ["PowerSGDHookState", "powersgd_hook"]


class PowerSGDHookState(CommHookState):
    """State of :func:`powersgd_hook`.

    Args:
        settings: ``powersgd_rank`` (rank ``r`` of the ``P [n, r]``, ``Q [m, r]`` factors of
            each ``[n, m]`` gradient matrix), ``powersgd_start_iter`` (plain all-reduce for
            that many backward passes first) and ``compression_error_feedback`` (add the
            previous step's compression error to the gradient; one fp32 copy of the gradients).
        process_group: group to communicate in; ``None`` = default group.
        min_compression_rate: a matrix is compressed only if ``(n + m) r * rate < n m``;
            others (biases, thin layers) are all-reduced uncompressed.
        warm_start: reuse last step's Q instead of a fresh random one (better approximation).
        orthogonalization_epsilon: added to column norms in Gram-Schmidt. PyTorch's default 0
            turns an exactly-zero gradient matrix (a layer that got no gradient) into NaN; 1e-8
            keeps it 0 and is far below fp32 resolution for ordinary gradients.
        random_seed: seed of the generator that draws Q, identical on all ranks (draws happen
            in the same order everywhere, so ranks stay in step).
        kernel: ``"auto"``, ``"numba"`` or ``"torch"``, see
            :func:`rllib_ext.ops.codecs.select_kernels` (numba for CPU float32 buckets).
    """

    hook_name = "powersgd"
    __slots__ = (
        # Hyper-parameters.
        "matrix_approximation_rank",
        "start_iter",
        "min_compression_rate",
        "error_feedback",
        "warm_start",
        "orthogonalization_epsilon",
        "random_seed",
        "kernel",
        # Internal state. Shared by all ranks: the step counter, the generator for Q, per bucket
        # the transposed Q factors (flat) and the layout fingerprint they belong to. Private to
        # this rank: per bucket the error-feedback memory. Restored memory not yet matched.
        "iteration",
        "rng",
        "qt_memory",
        "fingerprints",
        "error_memory",
        "_pending",
    )

    def __init__(
        self,
        settings: CompressionSettings,
        process_group: dist.ProcessGroup | None = None,
        *,
        min_compression_rate: float = 2.0,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 1e-8,
        random_seed: int = 0,
        kernel: str = "auto",
    ) -> None:
        if not min_compression_rate > 0 or not orthogonalization_epsilon >= 0:
            raise ValueError(
                f"min_compression_rate={min_compression_rate!r} must be > 0 and "
                f"orthogonalization_epsilon={orthogonalization_epsilon!r} >= 0. "
                "Fix: use the defaults (2.0 as PyTorch, 1e-8)."
            )
        super().__init__(process_group)
        self.matrix_approximation_rank = settings.powersgd_rank
        self.start_iter = settings.powersgd_start_iter
        self.error_feedback = settings.compression_error_feedback
        self.min_compression_rate = min_compression_rate
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.kernel = check_kernel(kernel)
        self.iteration = 0
        self.rng = np.random.RandomState(random_seed)
        self.qt_memory: dict[int, torch.Tensor] = {}
        self.fingerprints: dict[int, tuple[int, ...]] = {}
        self.error_memory: dict[int, torch.Tensor] = {}
        self._pending = PendingBuckets()

    def _hyper_parameters(self) -> tuple[str, ...]:
        return ("matrix_approximation_rank", "start_iter", "error_feedback", "warm_start")

    def _forget_bucket(self, index: int) -> None:
        self.qt_memory.pop(index, None)
        self.error_memory.pop(index, None)

    def _prepare_bucket(self, bucket: dist.GradBucket) -> None:
        """Drops memory built for another layout; installs restored memory that matches."""
        index = bucket.index()
        fingerprint = bucket_fingerprint(bucket)
        if self.fingerprints.get(index, fingerprint) != fingerprint:
            self._forget_bucket(index)
        restored = self._pending.take(index, fingerprint)
        if restored is not None:
            self._forget_bucket(index)
            device = bucket.buffer().device
            if restored.get("qt") is not None:
                self.qt_memory[index] = restored["qt"].to(device, torch.float32)
            if restored.get("error") is not None:
                self.error_memory[index] = restored["error"].to(device, bucket.buffer().dtype)
        self.fingerprints[index] = fingerprint

    def rescale_error_feedback(self, factor: float) -> None:
        for error in self.error_memory.values():
            error.mul_(factor)
        self._pending.scale("error", factor)

    # ----------------------------------------------------------------------------- checkpoints

    def _shared_state(self) -> dict[str, Any]:
        name, keys, position, has_gauss, cached_gaussian = self.rng.get_state()
        return {
            "iteration": self.iteration,
            "rng": {
                "name": name,
                "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "buckets": {
                index: {"fingerprint": list(fp), "qt": self.qt_memory.get(index)}
                for index, fp in self.fingerprints.items()
            },
        }

    def _rank_state(self) -> dict[str, Any]:
        return {"error": dict(self.error_memory)}

    def _load_shared(self, shared: Mapping[str, Any]) -> None:
        self.iteration = int(shared.get("iteration", 0))
        rng = shared.get("rng")
        if rng is not None:
            keys = np.asarray(rng["keys"], dtype=np.int64).astype(np.uint32)
            self.rng.set_state(
                (rng["name"], keys, rng["position"], rng["has_gauss"], rng["cached_gaussian"])
            )
        self.qt_memory.clear()
        self.error_memory.clear()
        self.fingerprints.clear()
        entries = {
            index: {"fingerprint": entry["fingerprint"], "qt": entry.get("qt")}
            for index, entry in int_keys(shared.get("buckets", {})).items()
        }
        self._pending = PendingBuckets(entries)

    def _load_rank(self, rank_state: Mapping[str, Any] | None) -> None:
        errors = int_keys((rank_state or {}).get("error", {}))
        for index, entry in self._pending.entries.items():
            entry["error"] = errors.get(index)


class _Layout:
    """A bucket split for PowerSGD: matrices (``[n, m]`` views) and their factor views."""

    __slots__ = ("matrices", "plain", "ranks")

    def __init__(self, state: PowerSGDHookState, bucket: dist.GradBucket) -> None:
        self.matrices: list[torch.Tensor] = []
        self.plain: list[torch.Tensor] = []
        for grad in bucket.gradients():
            matrix = grad.view(grad.shape[0], -1) if grad.dim() > 0 else grad.view(1, 1)
            rows, cols = matrix.shape
            rank = state.matrix_approximation_rank
            if powersgd.should_compress(rows, cols, rank, state.min_compression_rate):
                self.matrices.append(matrix)
            else:
                self.plain.append(grad)
        self.ranks = [
            min(m.shape[0], m.shape[1], state.matrix_approximation_rank) for m in self.matrices
        ]

    def views(self, flat: torch.Tensor, dim: int) -> list[torch.Tensor]:
        """``[n, r]`` (``dim=0``: P) or ``[r, m]`` (``dim=1``: Qt) views of a flat buffer."""
        views, offset = [], 0
        for matrix, rank in zip(self.matrices, self.ranks, strict=True):
            size = matrix.shape[dim] * rank
            view = flat[offset : offset + size]
            views.append(view.view(-1, rank) if dim == 0 else view.view(rank, -1))
            offset += size
        return views

    def numel(self, dim: int) -> int:
        return sum(m.shape[dim] * r for m, r in zip(self.matrices, self.ranks, strict=True))

    def in_buffer(self, buffer: torch.Tensor) -> bool:
        """Every tensor is a contiguous view of ``buffer`` (the numba path addresses the error
        memory by offset)."""
        storage = buffer.untyped_storage().data_ptr()
        return all(
            t.is_contiguous() and t.untyped_storage().data_ptr() == storage
            for t in (*self.matrices, *self.plain)
        )


def _same_place(memory: torch.Tensor, buffer: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """The view of ``memory`` (laid out like ``buffer``) at ``tensor``'s place in ``buffer``."""
    start = (tensor.data_ptr() - buffer.data_ptr()) // buffer.element_size()
    return memory[start : start + tensor.numel()].view(tensor.shape)


def powersgd_hook(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Layer-wise PowerSGD with error feedback and warm start; see the module docstring.

    Exact for gradient matrices of rank <= ``powersgd_rank`` once Q spans their row space
    (from the second compressed step on with warm start). Non-finite input (AMP overflow)
    decodes to non-finite output on every rank; the bucket's Q and error memory are then
    dropped, identically on all ranks since they see the same decoded values.
    """
    call = HookCall(state, bucket)
    buffer, index = call.buffer, call.index
    if call.is_last:
        state._pending.end_step(state.hook_name)
    if state.iteration < state.start_iter:
        state.iteration += int(call.is_last)
        # numba compiles (or reads its cache) in the first update, not when compression starts.
        select_kernels(state.kernel, buffer)
        return averaging_allreduce(call)
    state._prepare_bucket(bucket)
    state.iteration += int(call.is_last)
    layout = _Layout(state, bucket)
    kernels = select_kernels(state.kernel, buffer, applies=layout.in_buffer(buffer))
    call.compiled = kernels is not None
    error = state.error_memory.get(index) if state.error_feedback else None

    def error_at(tensor: torch.Tensor, memory: torch.Tensor | None) -> torch.Tensor | None:
        return None if memory is None else _same_place(memory, buffer, tensor)

    # Uncompressed tensors: error feedback, then one contiguous averaging all-reduce, first.
    for tensor in layout.plain:
        if error is not None:
            tensor.add_(_same_place(error, buffer, tensor))
    flat_plain = (
        torch.cat([t.reshape(-1) for t in layout.plain]).div_(call.world_size)
        if layout.plain
        else buffer.new_empty(0)
    )
    plain_work = call.all_reduce(flat_plain)

    # P = M Q for every matrix, all-reduced as one buffer. Summing P needs no division: the
    # orthonormalisation removes any scale.
    qt_flat = state.qt_memory.get(index)
    if not state.warm_start or qt_flat is None or qt_flat.numel() != layout.numel(1):
        qt_flat = buffer.new_empty(layout.numel(1), dtype=torch.float32)
        shapes = [(m.shape[0], m.shape[1]) for m in layout.matrices]
        powersgd.random_qts_(layout.views(qt_flat, 1), shapes, state.rng.randint(1_000_000_000))
    qts = layout.views(qt_flat, 1)
    p_flat = buffer.new_empty(layout.numel(0))
    ps = layout.views(p_flat, 0)
    for matrix, qt, p in zip(layout.matrices, qts, ps, strict=True):
        powersgd.orthogonalize_(qt.T, epsilon=state.orthogonalization_epsilon)
        powersgd.add_error_and_p(matrix, qt, p, error=error_at(matrix, error), kernels=kernels)
    call.all_reduce(p_flat).wait()

    # Q^T = P^T M after orthonormalising P, all-reduced (averaged in the decode).
    for matrix, qt, p in zip(layout.matrices, qts, ps, strict=True):
        powersgd.compute_qt(matrix, p, qt, epsilon=state.orthogonalization_epsilon)
    new_error = None
    if state.error_feedback:
        if index not in state.error_memory:
            state.error_memory[index] = torch.zeros_like(buffer)
        new_error = state.error_memory[index]
    q_work = call.all_reduce(qt_flat)

    def decode() -> bool:
        plain_work.wait()
        qt_flat.div_(call.world_size)
        offset = 0
        for tensor in layout.plain:
            averaged = flat_plain[offset : offset + tensor.numel()].view_as(tensor)
            if new_error is not None:
                # Error of an uncompressed tensor: corrected local minus the average (PyTorch's).
                torch.sub(tensor, averaged, out=error_at(tensor, new_error))
            tensor.copy_(averaged)
            offset += tensor.numel()
        for matrix, qt, p in zip(layout.matrices, qts, ps, strict=True):
            powersgd.decode_with_error(
                matrix, p, qt, error=error_at(matrix, new_error), kernels=kernels
            )
        # The decoded bucket is built from these all-reduced buffers only (identical on every
        # rank), and any inf/NaN in a rank's gradient reaches them. Summing them is far cheaper
        # than scanning the bucket with isfinite (a full pass over it); an fp32
        # overflow of the sum itself would only cause a harmless memory reset.
        checks = torch.stack([flat_plain.sum(), p_flat.sum(), qt_flat.sum()])
        nonfinite = not bool(torch.isfinite(checks).all())
        if nonfinite:
            # Same decoded values on every rank, so every rank forgets the same memory and the
            # next step draws the same fresh Q.
            state._forget_bucket(index)
        else:
            state.qt_memory[index] = qt_flat
        return nonfinite

    return call.then(q_work, decode)
