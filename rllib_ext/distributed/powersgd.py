"""PowerSGD hook (Vogels et al. 2019, https://arxiv.org/abs/1905.13727), layer-wise.

Same algorithm and hyper-parameters as PyTorch's ``powerSGD_hook`` (which the tests use as the
oracle): plain all-reduce for the first ``start_iter`` steps, then every gradient matrix
``M [n, m]`` of a bucket that passes the ``min_compression_rate`` test is replaced by
``P Q^T`` from one power iteration (``P = M Q``, all-reduce, orthonormalise, ``Q = M^T P``,
all-reduce, average); other tensors (biases) are all-reduced uncompressed. Error feedback keeps
``corrected - decoded`` per bucket; warm start reuses last step's ``Q``.

Why not call PyTorch's hook: measured on a 25M-parameter MLP, one thread, it spends ~320 ms per
step in arithmetic, mostly memory layout (``bmm(M^T, P)`` on a transposed view: 134 ms vs 12 ms
for ``(P^T M)^T``; two fresh 100 MB tensors per step for error feedback). And it launches its P
and Q all-reduces from inside future callbacks, i.e. from the backend's threads: on gloo, with
two or more buckets in flight, they start in a different order on different ranks and can block
every worker thread (a deadlock we hit). Here all collectives of a bucket are launched from the
hook call, in bucket order, identically on every rank; only the final copy runs in a callback.

Layouts: ``Q`` is stored transposed (``Qt [r, m]``, contiguous), so ``P = M Qt^T``,
``Qt = P^T M`` and ``M = P Qt`` all read ``M`` row-major.

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` compares the hook's
annotations with the real ``dist.GradBucket`` / ``Future[Tensor]`` classes.
"""

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rllib_ext.distributed._base import (
    CommHookState,
    _int_keys,
    _PendingBuckets,
    allreduce_wire_bytes,
    bucket_fingerprint,
    check_codec,
    compiled_codec,
)
from rllib_ext.ops import compression

__all__ = ["PowerSGDHookState", "powersgd_hook"]


class PowerSGDHookState(CommHookState):
    """State of :func:`powersgd_hook`.

    Args:
        process_group: group to communicate in; ``None`` = default group.
        matrix_approximation_rank: rank ``r`` of the ``P [n, r]``, ``Q [m, r]`` factors of each
            ``[n, m]`` gradient matrix. Start at 1 and double (1-4 is typical).
        start_iter: plain all-reduce for the first ``start_iter`` backward passes. About 10 %
            of all steps is PyTorch's advice; must be >= 2 with error feedback or warm start
            because DDP rebuilds its buckets after the first one.
        min_compression_rate: a matrix is compressed only if ``(n + m) r * rate < n m``;
            others (biases, thin layers) are all-reduced uncompressed.
        error_feedback: add the previous step's compression error to the gradient (one fp32
            copy of the gradients per rank).
        warm_start: reuse last step's Q instead of a fresh random one (better approximation).
        orthogonalization_epsilon: added to column norms in Gram-Schmidt. PyTorch's default 0
            turns an exactly-zero gradient matrix (a layer that got no gradient) into NaN; 1e-8
            keeps it 0 and is far below fp32 resolution for ordinary gradients.
        random_seed: seed of the generator that draws Q, identical on all ranks (draws happen
            in the same order everywhere, so ranks stay in step).
        codec: ``"auto"`` (default): for CPU float32 buckets, error feedback and ``P = M Q``
            run fused (one pass), and so do ``M = P Q^T`` and the new error (one pass), with
            the numba kernels of :mod:`rllib_ext.ops.compression_compiled`; torch ops
            otherwise. ``"torch"``: always torch ops; ``"numba"``: require the kernels.
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
        "codec",
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
        process_group: dist.ProcessGroup | None = None,
        *,
        matrix_approximation_rank: int = 1,
        start_iter: int = 1_000,
        min_compression_rate: float = 2.0,
        error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 1e-8,
        random_seed: int = 0,
        codec: str = "auto",
    ) -> None:
        rank = matrix_approximation_rank
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(
                f"powersgd_rank={rank!r} must be an int >= 1. "
                "Fix: pass an integer such as 1, 2 or 4."
            )
        if rank < 1:
            raise ValueError(
                f"powersgd_rank={rank} is invalid: the PowerSGD rank must be an integer >= 1 "
                "(typical values 1, 2, 4). Fix: set powersgd_rank=1 and double it while "
                "accuracy suffers."
            )
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(
                f"powersgd_start_iter={start_iter!r} is invalid: it must be an int >= 0. "
                "Fix: use about 10% of the total number of optimizer steps."
            )
        if (error_feedback or warm_start) and start_iter < 2:
            raise ValueError(
                f"powersgd_start_iter={start_iter} is invalid with error_feedback="
                f"{error_feedback} and warm_start={warm_start}: DDP rebuilds its gradient buckets "
                "after the first backward pass, which would invalidate the per-bucket memory, so "
                "PowerSGD may only start at iteration >= 2. Fix: set powersgd_start_iter >= 2, "
                "or turn off both error_feedback and warm_start."
            )
        if not min_compression_rate > 0:
            raise ValueError(
                f"min_compression_rate={min_compression_rate!r} is invalid: it must be > 0. "
                "Fix: use 2 (PyTorch's default) or 1 to compress every matrix that gets smaller."
            )
        if not orthogonalization_epsilon >= 0:
            raise ValueError(
                f"orthogonalization_epsilon={orthogonalization_epsilon!r} must be >= 0. "
                "Fix: use 1e-8 (default) or 0."
            )
        check_codec(codec)
        super().__init__(process_group)
        self.codec = codec
        self.matrix_approximation_rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.iteration = 0
        self.rng = np.random.RandomState(random_seed)
        self.qt_memory: dict[int, torch.Tensor] = {}
        self.fingerprints: dict[int, tuple[int, ...]] = {}
        self.error_memory: dict[int, torch.Tensor] = {}
        self._pending = _PendingBuckets()

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
        for entry in self._pending.entries.values():
            if entry.get("error") is not None:
                entry["error"] = entry["error"] * factor

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

    def _load_shared(self, shared: dict[str, Any]) -> None:
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
            for index, entry in _int_keys(shared.get("buckets", {})).items()
        }
        self._pending = _PendingBuckets(entries)

    def _load_rank(self, rank_state: dict[str, Any] | None) -> None:
        errors = _int_keys((rank_state or {}).get("error", {}))
        for index, entry in self._pending.entries.items():
            entry["error"] = errors.get(index)


def _split_bucket(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(matrices to compress as ``[n, m]`` views, tensors to all-reduce as they are)."""
    to_compress, uncompressed = [], []
    for grad in bucket.gradients():
        matrix = grad.view(grad.shape[0], -1) if grad.dim() > 0 else grad.view(1, 1)
        rows, cols = matrix.shape
        rate = state.min_compression_rate
        if compression.should_compress_low_rank(rows, cols, state.matrix_approximation_rank, rate):
            to_compress.append(matrix)
        else:
            uncompressed.append(grad)
    return to_compress, uncompressed


def _random_qts(state: PowerSGDHookState, matrices: list[torch.Tensor], qt_flat: torch.Tensor):
    """Fills ``qt_flat`` with fresh random Q^T factors, the same on every rank.

    Draws like PyTorch's hook (one seed from the shared generator, then ``randn(m, r)`` per
    matrix, same-shaped matrices grouped in first-appearance order), so both hooks start from
    the same Q.
    """
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, matrix in enumerate(matrices):
        by_shape.setdefault(tuple(matrix.shape), []).append(i)
    views = _qt_views(state, matrices, qt_flat)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(state.rng.randint(1_000_000_000))
        for indices in by_shape.values():
            for i in indices:
                rows, cols = views[i].shape
                views[i].copy_(torch.randn(cols, rows, dtype=qt_flat.dtype).T)


def _same_place(memory: torch.Tensor, buffer: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """The view of ``memory`` (laid out like ``buffer``) at ``tensor``'s place in ``buffer``."""
    start = (tensor.data_ptr() - buffer.data_ptr()) // buffer.element_size()
    return memory[start : start + tensor.numel()].view(tensor.shape)


def _rank_of(state: PowerSGDHookState, matrix: torch.Tensor) -> int:
    return min(matrix.shape[0], matrix.shape[1], state.matrix_approximation_rank)


def _qt_views(state: PowerSGDHookState, matrices: list[torch.Tensor], flat: torch.Tensor):
    views, offset = [], 0
    for matrix in matrices:
        rank, cols = _rank_of(state, matrix), matrix.shape[1]
        views.append(flat[offset : offset + rank * cols].view(rank, cols))
        offset += rank * cols
    return views


def powersgd_hook(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Layer-wise PowerSGD with error feedback and warm start; see the module docstring.

    Exact for gradient matrices of rank <= ``matrix_approximation_rank`` once Q spans their row
    space (from the second compressed step on with warm start). Non-finite input (AMP overflow)
    decodes to non-finite output on every rank; the bucket's Q and error memory are then
    dropped, identically on all ranks since they see the same decoded values.
    """
    start = time.perf_counter()
    group = state._group()
    world_size = group.size()
    buffer = bucket.buffer()
    index, is_last = bucket.index(), bucket.is_last()
    bytes_plain = allreduce_wire_bytes(buffer.numel() * 4, world_size)
    if is_last:
        state._pending.end_step(state.hook_name)

    if state.iteration < state.start_iter:
        if is_last:
            state.iteration += 1
        buffer.div_(world_size)  # divide first: no overflow of the sum in low precision
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        bytes_sent = allreduce_wire_bytes(buffer.numel() * buffer.element_size(), world_size)

        def finish_plain(fut: torch.futures.Future[Any]) -> torch.Tensor:
            fut.wait()
            state._record(
                bytes_sent=bytes_sent,
                bytes_uncompressed=bytes_plain,
                comm_time_s=time.perf_counter() - start,
                is_last=is_last,
            )
            return buffer

        return future.then(finish_plain)

    state._prepare_bucket(bucket)
    if is_last:
        state.iteration += 1
    error = state.error_memory.get(index) if state.error_feedback else None
    matrices, uncompressed = _split_bucket(state, bucket)
    kernels = compiled_codec(state.codec, buffer)
    storage = buffer.untyped_storage().data_ptr()
    if kernels is not None and not all(
        t.is_contiguous() and t.untyped_storage().data_ptr() == storage
        for t in (*matrices, *uncompressed)
    ):
        kernels = None  # the fused path addresses the error memory by offset in the buffer
    # The buffer becomes the corrected gradient M (+ error). With the compiled codec the
    # matrices get their error inside add_error_and_p below; the rest here.
    if error is not None:
        if kernels is None:
            buffer.add_(error)
        else:
            for tensor in uncompressed:
                tensor.add_(_same_place(error, buffer, tensor))

    # Uncompressed tensors: one contiguous averaging all-reduce, launched first.
    flat_plain = (
        torch.cat([t.reshape(-1) for t in uncompressed]).div_(world_size)
        if uncompressed
        else buffer.new_empty(0)
    )
    plain_work = dist.all_reduce(flat_plain, group=group, async_op=True)

    # P = M Q for every matrix, all-reduced as one buffer. Summing P needs no division: the
    # orthonormalisation below removes any scale.
    qt_flat = state.qt_memory.get(index)
    total_qt = sum(_rank_of(state, m) * m.shape[1] for m in matrices)
    if not state.warm_start or qt_flat is None or qt_flat.numel() != total_qt:
        qt_flat = buffer.new_empty(total_qt, dtype=torch.float32)
        _random_qts(state, matrices, qt_flat)
    qts = _qt_views(state, matrices, qt_flat)
    for qt in qts:
        compression.orthogonalize_(qt.T, epsilon=state.orthogonalization_epsilon)
    p_flat = buffer.new_empty(sum(_rank_of(state, m) * m.shape[0] for m in matrices))
    ps, offset = [], 0
    for matrix, qt in zip(matrices, qts, strict=True):
        p = p_flat[offset : offset + matrix.shape[0] * qt.shape[0]].view(matrix.shape[0], -1)
        if kernels is None:
            torch.mm(matrix, qt.T, out=p)
        else:
            err = matrix if error is None else _same_place(error, buffer, matrix)
            kernels.add_error_and_p(
                matrix.numpy(), err.numpy(), qt.numpy(), p.numpy(), error is not None
            )
        ps.append(p)
        offset += p.numel()
    dist.all_reduce(p_flat, group=group, async_op=True).wait()

    # Q^T = P^T M after orthonormalising P, all-reduced and averaged.
    for p, matrix, qt in zip(ps, matrices, qts, strict=True):
        compression.orthogonalize_(p, epsilon=state.orthogonalization_epsilon)
        torch.mm(p.T, matrix, out=qt)
    if error is None and state.error_feedback:
        error = state.error_memory[index] = torch.empty_like(buffer)
    if error is not None:
        # The corrected local gradient; the decoded one is subtracted below (for the
        # matrices, the compiled decode writes the difference directly).
        if kernels is None:
            error.copy_(buffer)
        else:
            for tensor in uncompressed:
                _same_place(error, buffer, tensor).copy_(tensor)
    q_future = dist.all_reduce(qt_flat, group=group, async_op=True).get_future()
    numel_sent = flat_plain.numel() + p_flat.numel() + qt_flat.numel()
    bytes_sent = allreduce_wire_bytes(numel_sent * 4, world_size)
    encode_s = time.perf_counter() - start

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()
        decode_start = time.perf_counter()
        plain_work.wait()
        qt_flat.div_(world_size)
        offset = 0
        for tensor in uncompressed:
            tensor.copy_(flat_plain[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        for p, qt, matrix in zip(ps, qts, matrices, strict=True):
            if kernels is None:
                torch.mm(p, qt, out=matrix)
            else:
                err = matrix if error is None else _same_place(error, buffer, matrix)
                kernels.decode_with_error(
                    matrix.numpy(), err.numpy(), p.numpy(), qt.numpy(), error is not None
                )
        # The decoded bucket is built from these all-reduced buffers only (identical on every
        # rank), and any inf/NaN in a rank's gradient reaches them. Summing them is far cheaper
        # than scanning the bucket (isfinite over 25M floats: ~170 ms on one core); an fp32
        # overflow of the sum itself would only cause a harmless memory reset.
        checks = torch.stack([flat_plain.sum(), p_flat.sum(), qt_flat.sum()])
        nonfinite = not bool(torch.isfinite(checks).all())
        if nonfinite:
            # Same decoded values on every rank, so every rank forgets the same memory and the
            # next step draws the same fresh Q.
            state._forget_bucket(index)
        else:
            state.qt_memory[index] = qt_flat
            if error is not None:
                if kernels is None:
                    error.sub_(buffer)
                else:
                    for tensor in uncompressed:
                        _same_place(error, buffer, tensor).sub_(tensor)
        end = time.perf_counter()
        state._record(
            bytes_sent=bytes_sent,
            bytes_uncompressed=bytes_plain,
            comm_time_s=end - start,
            encode_time_s=encode_s,
            decode_time_s=end - decode_start,
            is_last=is_last,
            nonfinite=nonfinite,
            compiled=kernels is not None,
        )
        return buffer

    return q_future.then(decompress)
