"""Shared machinery of the comm-hook state objects: statistics, byte accounting, checkpoints.

Kept apart from :mod:`rllib_ext.distributed.comm_hooks` so that module holds only the hooks and
their hyper-parameters. Nothing here imports Ray.

Bytes "as on the wire" are the payload bytes one rank sends under the ring algorithms that gloo
uses for these collectives (and NCCL's ring for large messages): an all-reduce of ``B`` bytes
sends ``2 (W - 1) / W * B`` per rank (reduce-scatter plus all-gather), an all-gather of a ``B``
byte message sends ``(W - 1) * B`` per rank. TCP/IP framing is not included (the benchmark
compares these numbers with the interface's ``tx_bytes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from rllib_ext.ops import compression_compiled

__all__ = [
    "CODECS",
    "CommHookState",
    "check_codec",
    "compiled_codec",
    "allreduce_wire_bytes",
    "allgather_wire_bytes",
    "bucket_fingerprint",
    "merge_states",
    "gather_state",
]

logger = logging.getLogger(__name__)

# torch >= 2.13 names the single-tensor all-gather `all_gather_single`; older ones only have
# `all_gather_into_tensor` (deprecated from 2.13 on).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

STATE_FORMAT_VERSION = 1
# DDP rebuilds its buckets after the first backward pass (iteration 1), so a bucket layout seen
# at step >= 2 is final. Restored per-bucket tensors that matched no bucket by then are dropped.
_PENDING_MAX_AGE = 2


CODECS = ("auto", "numba", "torch")
"""Codec arithmetic of the 1-bit and PowerSGD hooks: ``auto`` = the fused numba kernels of
:mod:`rllib_ext.ops.compression_compiled` for CPU float32 buckets where numba works, torch ops
otherwise; ``torch`` = always torch ops; ``numba`` = like auto, but numba must load."""


def check_codec(codec: str) -> str:
    """Validates a ``codec`` option (see :data:`CODECS`); returns it."""
    if codec not in CODECS:
        raise ValueError(
            f"codec={codec!r} is not one of {CODECS}. Fix: use 'auto' (compiled kernels "
            "where they apply), 'torch' or 'numba'."
        )
    if codec == "numba" and compression_compiled.load() is None:
        raise ValueError(
            "codec='numba' but numba is not importable here (or failed to compile). "
            "Fix: pip install numba, or use codec='auto'."
        )
    return codec


def compiled_codec(codec: str, buffer: torch.Tensor) -> compression_compiled.CodecKernels | None:
    """The compiled kernels where they apply to ``buffer`` (CPU, float32, contiguous) and
    ``codec`` allows them; ``None`` means torch ops."""
    if codec == "torch":
        return None
    applies = (
        buffer.device.type == "cpu" and buffer.dtype == torch.float32 and buffer.is_contiguous()
    )
    return compression_compiled.load() if applies else None


def allreduce_wire_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of an ``nbytes`` buffer."""
    return 2 * (world_size - 1) * nbytes // world_size


def allgather_wire_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-gather of its ``nbytes`` message."""
    return (world_size - 1) * nbytes


def bucket_fingerprint(bucket: dist.GradBucket) -> tuple[int, ...]:
    """Element counts of the parameters in a bucket: identifies a bucket layout.

    Per-bucket memories (error-feedback residuals, PowerSGD factors) are only meaningful for the
    layout they were built on; DDP may rebuild buckets after iteration 1 and a new DDP instance
    (e.g. after restoring a checkpoint) starts from its initial layout again.
    """
    return tuple(int(p.numel()) for p in bucket.parameters())


def _current_rank_and_world(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    group = group if group is not None else dist.group.WORLD
    return dist.get_rank(group), dist.get_world_size(group)


def _to_plain(value: Any) -> Any:
    """Detached CPU copies of tensors inside nested dicts/lists (checkpoint-friendly)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _int_keys(mapping: Mapping[Any, Any]) -> dict[int, Any]:
    """Checkpoint formats may turn int dict keys into strings; turn them back."""
    return {int(k): v for k, v in mapping.items()}


class CommHookState:
    """Base of every hook state: process group, per-update statistics, checkpoint format.

    Subclasses add their hyper-parameters and internal state as ``__slots__`` and implement
    ``_shared_state``/``_rank_state``/``_load_shared``/``_load_rank``.

    Statistics (reset by :meth:`pop_stats`):

    * ``bytes_sent``: bytes this rank sent, as on the wire (see the module docstring);
    * ``bytes_uncompressed``: what a plain all-reduce of the same buckets would have sent;
    * ``comm_time_s``: wall time from hook start to the completion of its future, summed over
      buckets (buckets can overlap each other and the backward pass, so this can exceed the
      wall time of a step);
    * ``encode_time_s`` / ``decode_time_s``: the synchronous compression part of the hook and
      the decompression callback (host time; on CUDA, kernel launch time);
    * ``num_buckets``, ``num_steps`` (steps = calls on the last bucket of a backward pass) and
      ``num_nonfinite_buckets`` (decoded bucket had inf/NaN; counted by the hooks that must reset
      memory then: ``onebit`` and ``powersgd``), ``num_compiled_buckets`` (compressed with the
      fused numba kernels of :mod:`rllib_ext.ops.compression_compiled`).
    """

    hook_name: ClassVar[str] = ""

    __slots__ = (
        # Communication. None means the default (WORLD) group; dropped when pickled.
        "process_group",
        # Statistics since the last pop_stats(). Future callbacks run on the backend's threads,
        # hence the lock.
        "bytes_sent",
        "bytes_uncompressed",
        "comm_time_s",
        "encode_time_s",
        "decode_time_s",
        "num_buckets",
        "num_steps",
        "num_nonfinite_buckets",
        "num_compiled_buckets",
        "_stats_lock",
    )

    _STAT_SLOTS: ClassVar[tuple[str, ...]] = (
        "bytes_sent",
        "bytes_uncompressed",
        "comm_time_s",
        "encode_time_s",
        "decode_time_s",
        "num_buckets",
        "num_steps",
        "num_nonfinite_buckets",
        "num_compiled_buckets",
    )

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self._stats_lock = threading.Lock()
        self.reset_stats()

    # ---------------------------------------------------------------- communication helpers

    def _group(self) -> dist.ProcessGroup:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    # ---------------------------------------------------------------------------- statistics

    def _record(
        self,
        *,
        bytes_sent: int,
        bytes_uncompressed: int,
        comm_time_s: float,
        encode_time_s: float = 0.0,
        decode_time_s: float = 0.0,
        is_last: bool,
        nonfinite: bool = False,
        compiled: bool = False,
    ) -> None:
        with self._stats_lock:
            self.bytes_sent += bytes_sent
            self.bytes_uncompressed += bytes_uncompressed
            self.comm_time_s += comm_time_s
            self.encode_time_s += encode_time_s
            self.decode_time_s += decode_time_s
            self.num_buckets += 1
            self.num_steps += int(is_last)
            self.num_nonfinite_buckets += int(nonfinite)
            self.num_compiled_buckets += int(compiled)

    def reset_stats(self) -> None:
        """Zeroes the statistics."""
        for slot in self._STAT_SLOTS:
            setattr(self, slot, 0.0 if slot.endswith("_s") else 0)

    def pop_stats(self) -> dict[str, float]:
        """The statistics since the last call, plus ``compression_ratio``; then resets them.

        ``compression_ratio = bytes_uncompressed / bytes_sent`` (1.0 when nothing was sent,
        e.g. with a single rank). Call once per learner update and log each key under
        ``learners/<module_id>/comm/<key>``.
        """
        with self._stats_lock:
            stats: dict[str, float] = {slot: getattr(self, slot) for slot in self._STAT_SLOTS}
            self.reset_stats()
        sent = stats["bytes_sent"]
        stats["compression_ratio"] = stats["bytes_uncompressed"] / sent if sent else 1.0
        return stats

    # --------------------------------------------------------------------------- checkpoints

    def _shared_state(self) -> dict[str, Any]:
        """State identical on every rank (e.g. PowerSGD's iteration and Q factors)."""
        return {}

    def _rank_state(self) -> dict[str, Any]:
        """State private to this rank (e.g. error-feedback residuals)."""
        return {}

    def _load_shared(self, shared: Mapping[str, Any]) -> None:
        pass

    def _load_rank(self, rank_state: Mapping[str, Any] | None) -> None:
        """``None``: nothing saved for this rank; start from empty memory."""

    def rescale_error_feedback(self, factor: float) -> None:
        """Multiplies stored error-feedback memory by ``factor``.

        Residuals are kept in the units of the gradients the hook saw. With AMP loss scaling those
        are scaled gradients: after ``GradScaler.update()`` changes the scale from ``old`` to
        ``new``, call this with ``new / old`` to keep them consistent. No-op for stateless hooks.
        """

    def get_state(self) -> dict[str, Any]:
        """This rank's hook state as plain Python containers and CPU tensors.

        Format::

            {"hook": str, "format_version": 1, "world_size": int,
             "shared": {...},                 # identical on every rank
             "per_rank": {rank: {...}}}       # this rank only; merge_states() unions them

        RLlib's ``LearnerGroup.get_state()`` asks learner 0 only, so a plain checkpoint holds
        rank 0's ``per_rank`` entry; use :func:`gather_state` (a collective) to collect all.
        """
        rank, world_size = _current_rank_and_world(self.process_group)
        return {
            "hook": self.hook_name,
            "format_version": STATE_FORMAT_VERSION,
            "world_size": world_size,
            "shared": _to_plain(self._shared_state()),
            "per_rank": {rank: _to_plain(self._rank_state())},
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output (or a :func:`merge_states` of several ranks').

        The shared part is always restored. The per-rank part is restored only if the state has
        an entry for this rank and was saved with the same world size; otherwise this rank starts
        with empty error-feedback memory, which is safe: error feedback only re-injects past
        compression error, and dropping it loses at most that bounded residual once (the same as
        one step without error feedback), whereas another rank's residual would inject a
        gradient this rank never computed.
        """
        if state.get("hook") != self.hook_name:
            raise ValueError(
                f"Cannot restore comm-hook state saved by hook {state.get('hook')!r} into a "
                f"{self.hook_name!r} hook state. Fix: restore with the same grad compression "
                "setting it was saved with, or drop the comm-hook entry from the checkpoint."
            )
        version = state.get("format_version")
        if version != STATE_FORMAT_VERSION:
            raise ValueError(
                f"Comm-hook state format_version={version!r} is not supported (this version "
                f"reads {STATE_FORMAT_VERSION}). Fix: drop the comm-hook entry from the checkpoint; "
                "the hook then starts from empty memory."
            )
        self._load_shared(state.get("shared", {}))
        rank, world_size = _current_rank_and_world(self.process_group)
        per_rank = _int_keys(state.get("per_rank", {}))
        entry = per_rank.get(rank) if state.get("world_size") == world_size else None
        if entry is None and per_rank:
            logger.info(
                "Comm hook %r: no saved state for rank %d of %d (saved ranks %s, world size %s); "
                "this rank starts with empty error-feedback memory.",
                self.hook_name,
                rank,
                world_size,
                sorted(per_rank),
                state.get("world_size"),
            )
        self._load_rank(entry)

    # ------------------------------------------------------------------------------ pickling

    @classmethod
    def _all_slots(cls) -> list[str]:
        slots: list[str] = []
        for klass in reversed(cls.__mro__):
            slots.extend(getattr(klass, "__slots__", ()))
        return slots

    def __getstate__(self) -> dict[str, Any]:
        """Everything except the process group (not serialisable) and the lock."""
        return {
            slot: getattr(self, slot)
            for slot in self._all_slots()
            if slot not in ("process_group", "_stats_lock") and hasattr(self, slot)
        }

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """The process group comes back as ``None``: the default group, looked up at use time.

        Set ``state.process_group`` afterwards if the hook ran on a sub-group.
        """
        self.process_group = None
        self._stats_lock = threading.Lock()
        for slot, value in state.items():
            setattr(self, slot, value)

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._hyper_parameters())
        return f"{type(self).__name__}({hyper})"

    def _hyper_parameters(self) -> tuple[str, ...]:
        return ()


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Unions the ``per_rank`` entries of several ranks' :meth:`CommHookState.get_state`.

    The ``shared`` part of the first state is kept (it is identical on every rank).
    """
    merged: dict[str, Any] | None = None
    for state in states:
        if merged is None:
            merged = {**state, "per_rank": dict(_int_keys(state.get("per_rank", {})))}
            continue
        if state.get("hook") != merged["hook"] or state.get("world_size") != merged["world_size"]:
            raise ValueError(
                "Cannot merge comm-hook states of different hooks or world sizes: "
                f"{state.get('hook')!r}/{state.get('world_size')!r} vs "
                f"{merged['hook']!r}/{merged['world_size']!r}. Fix: merge states of one run."
            )
        merged["per_rank"].update(_int_keys(state.get("per_rank", {})))
    if merged is None:
        raise ValueError("merge_states() needs at least one state.")
    return merged


def gather_state(state: CommHookState) -> dict[str, Any]:
    """Collective: every rank's :meth:`~CommHookState.get_state`, merged, on every rank.

    All ranks of the hook's process group must call it at the same point (e.g. at the end of
    the same learner update). It moves each rank's residuals (as large as the model) through
    ``all_gather_object``, so call it when saving, not every step.
    """
    group = state._group()
    mine = state.get_state()
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return merge_states(everyone)


class _PendingBuckets:
    """Restored per-bucket tensors waiting for a bucket with the layout they were saved for."""

    __slots__ = ("entries", "age")

    def __init__(self, entries: dict[int, dict[str, Any]] | None = None) -> None:
        self.entries: dict[int, dict[str, Any]] = entries or {}
        self.age = 0

    def take(self, index: int, fingerprint: tuple[int, ...]) -> dict[str, Any] | None:
        entry = self.entries.get(index)
        if entry is not None and tuple(entry["fingerprint"]) == fingerprint:
            return self.entries.pop(index)
        return None

    def end_step(self, hook_name: str) -> None:
        """Called once per backward pass; forgets entries that never matched."""
        if not self.entries:
            return
        self.age += 1
        if self.age > _PENDING_MAX_AGE:
            logger.info(
                "Comm hook %r: restored memory for buckets %s matched no bucket layout after "
                "%d steps (DDP bucket layout changed); continuing from empty memory there.",
                hook_name,
                sorted(self.entries),
                _PENDING_MAX_AGE,
            )
            self.entries.clear()
