"""The comm hooks' statistics: one record per bucket, summed per update, with public observers.

Every hook reports each bucket once, when its future completes, as a :class:`BucketRecord`;
:class:`HookStats` sums them for the learner metrics (``rllib_ext/comm/bytes_sent`` ...) and passes each
record to the observers registered with :meth:`HookStats.add_observer` (profiling reads the
``start_s``/``comm_s`` interval there). Observers run on the backend's callback thread: keep
them short and thread-safe.

Bytes "as on the wire" are the payload bytes one rank sends under the ring algorithms that gloo
uses for these collectives (and NCCL's ring for large messages): an all-reduce of ``B`` bytes
sends ``2 (W - 1) / W * B`` per rank (reduce-scatter plus all-gather), an all-gather of a ``B``
byte message sends ``(W - 1) * B`` per rank. TCP/IP framing is not included.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BucketRecord",
    "HookStats",
    "Observer",
    "allgather_wire_bytes",
    "allreduce_wire_bytes",
]


def allreduce_wire_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of an ``nbytes`` buffer."""
    return 2 * (world_size - 1) * nbytes // world_size


def allgather_wire_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-gather of its ``nbytes`` message."""
    return (world_size - 1) * nbytes


@dataclass(frozen=True)
class BucketRecord:
    """What one hook call did with one gradient bucket."""

    hook: str
    """``"fp16"``, ``"bf16"``, ``"powersgd"`` or ``"onebit"``."""
    bucket_index: int
    is_last: bool
    """Last bucket of a backward pass (counts as one step)."""
    bytes_uncompressed: int
    """What DDP's plain fp32 all-reduce of this bucket would have sent."""
    bytes_sent: int
    """What this rank sent, as on the wire."""
    start_s: float
    """``time.perf_counter()`` when the hook was called."""
    encode_s: float
    """Synchronous part of the hook (compression; on CUDA, kernel launch time)."""
    comm_s: float
    """Hook call to completion of its future (collectives in flight included)."""
    decode_s: float
    """The completion callback (decompression)."""
    compiled: bool
    """The fused numba kernels did the codec arithmetic."""
    nonfinite: bool
    """The decoded bucket is inf/NaN (a loss-scaled overflow); memory was reset."""


Observer = Callable[[BucketRecord], None]

_SUMS = {
    "bytes_sent": "bytes_sent",
    "bytes_uncompressed": "bytes_uncompressed",
    "comm_time_s": "comm_s",
    "encode_time_s": "encode_s",
    "decode_time_s": "decode_s",
    "num_steps": "is_last",
    "num_nonfinite_buckets": "nonfinite",
    "num_compiled_buckets": "compiled",
}


class HookStats:
    """Sums of :class:`BucketRecord` since the last :meth:`pop`, and the observers.

    Thread-safe: future callbacks run on the backend's threads. Pickled without observers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observers: list[Observer] = []
        self._totals: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self._totals = {key: 0 for key in (*_SUMS, "num_buckets")}
        for key in ("comm_time_s", "encode_time_s", "decode_time_s"):
            self._totals[key] = 0.0

    def add_observer(self, observer: Observer) -> None:
        """Calls ``observer(record)`` for every bucket from now on."""
        with self._lock:
            self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with self._lock:
            self._observers.remove(observer)

    def record(self, record: BucketRecord) -> None:
        with self._lock:
            for key, field_name in _SUMS.items():
                self._totals[key] += getattr(record, field_name)
            self._totals["num_buckets"] += 1
            observers = list(self._observers)
        for observer in observers:
            observer(record)

    def pop(self) -> dict[str, float]:
        """The sums since the last call, plus ``compression_ratio``; then resets them.

        Keys: ``bytes_sent``, ``bytes_uncompressed``, ``comm_time_s``, ``encode_time_s``,
        ``decode_time_s``, ``num_buckets``, ``num_steps``, ``num_nonfinite_buckets``,
        ``num_compiled_buckets``, and ``compression_ratio = bytes_uncompressed / bytes_sent``
        (1.0 when nothing was sent, e.g. with a single rank).
        """
        with self._lock:
            stats = dict(self._totals)
            self._reset()
        sent = stats["bytes_sent"]
        stats["compression_ratio"] = stats["bytes_uncompressed"] / sent if sent else 1.0
        return stats

    def __getstate__(self) -> dict[str, Any]:
        return {"totals": dict(self._totals)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._observers = []
        self._totals = dict(state["totals"])
