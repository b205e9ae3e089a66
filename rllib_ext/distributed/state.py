"""The base of every comm-hook state: process group, statistics, checkpoint format, pickling.

Nothing here imports Ray. The per-codec states (:mod:`~rllib_ext.distributed.cast`,
:mod:`~.onebit`, :mod:`~.powersgd`) add their hyper-parameters and memory as ``__slots__``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from rllib_ext.distributed.stats import HookStats, Observer

__all__ = [
    "STATE_FORMAT_VERSION",
    "CommHookState",
    "Group",
    "PendingBuckets",
    "bucket_fingerprint",
    "gather_state",
    "int_keys",
    "merge_states",
]

logger = logging.getLogger(__name__)

Group = dist.ProcessGroup | None
"""A hook's process group; ``None`` = the default group, looked up at use time."""

STATE_FORMAT_VERSION = 1
# DDP rebuilds its buckets after the first backward pass (iteration 1), so a bucket layout seen
# at step >= 2 is final. Restored per-bucket tensors that matched no bucket by then are dropped.
_PENDING_MAX_AGE = 2


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


def int_keys(mapping: Mapping[Any, Any]) -> dict[int, Any]:
    """Checkpoint formats may turn int dict keys into strings; turn them back."""
    return {int(k): v for k, v in mapping.items()}


class CommHookState:
    """Base of every hook state: process group, statistics, checkpoint format.

    Subclasses add their hyper-parameters and internal state as ``__slots__`` and implement
    ``_shared_state``/``_rank_state``/``_load_shared``/``_load_rank``.

    Statistics: every hook call reports its bucket to :attr:`stats` (see
    :mod:`rllib_ext.distributed.stats`); :meth:`pop_stats` returns the sums since the last call,
    :meth:`add_observer` sees every bucket record.
    """

    hook_name: ClassVar[str] = ""

    __slots__ = (
        # Communication. None means the default (WORLD) group; dropped when pickled.
        "process_group",
        # Statistics since the last pop_stats(), and the observers (not pickled).
        "stats",
    )

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self.stats = HookStats()

    def group(self) -> dist.ProcessGroup:
        """The process group to communicate in (``process_group`` or the default group)."""
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if group is None:
            raise RuntimeError(
                "A comm hook ran without a process group. Fix: call "
                "torch.distributed.init_process_group() before the first backward pass."
            )
        return group

    def pop_stats(self) -> dict[str, float]:
        """See :meth:`HookStats.pop`: call once per learner update."""
        return self.stats.pop()

    def add_observer(self, observer: Observer) -> None:
        """Calls ``observer(record)`` with a :class:`~rllib_ext.distributed.stats.BucketRecord`
        for every bucket this hook exchanges from now on."""
        self.stats.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        self.stats.remove_observer(observer)

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
        per_rank = int_keys(state.get("per_rank", {}))
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
        """Everything except the process group (not serialisable); the stats drop their observers."""
        return {
            slot: getattr(self, slot)
            for slot in self._all_slots()
            if slot != "process_group" and hasattr(self, slot)
        }

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """The process group comes back as ``None``: the default group, looked up at use time.

        Set ``state.process_group`` afterwards if the hook ran on a sub-group.
        """
        self.process_group = None
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
            merged = {**state, "per_rank": dict(int_keys(state.get("per_rank", {})))}
            continue
        if state.get("hook") != merged["hook"] or state.get("world_size") != merged["world_size"]:
            raise ValueError(
                "Cannot merge comm-hook states of different hooks or world sizes: "
                f"{state.get('hook')!r}/{state.get('world_size')!r} vs "
                f"{merged['hook']!r}/{merged['world_size']!r}. Fix: merge states of one run."
            )
        merged["per_rank"].update(int_keys(state.get("per_rank", {})))
    if merged is None:
        raise ValueError("merge_states() needs at least one state.")
    return merged


def gather_state(state: CommHookState) -> dict[str, Any]:
    """Collective: every rank's :meth:`~CommHookState.get_state`, merged, on every rank.

    All ranks of the hook's process group must call it at the same point (e.g. at the end of
    the same learner update). It moves each rank's residuals (as large as the model) through
    ``all_gather_object``, so call it when saving, not every step.
    """
    group = state.group()
    mine = state.get_state()
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return merge_states(everyone)


class PendingBuckets:
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

    def scale(self, key: str, factor: float) -> None:
        """Multiplies the restored ``key`` tensors (error feedback) by ``factor``."""
        for entry in self.entries.values():
            if entry.get(key) is not None:
                entry[key] = entry[key] * factor

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
