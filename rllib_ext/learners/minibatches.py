"""Minibatches as index gathers over the train batch, in exactly RLlib's order.

:class:`IndexedMinibatches` yields what RLlib's ``MiniBatchCyclicIterator`` yields for the same
train batch and settings, without slicing and concatenating ``SampleBatch``es:

* per module, the same rows in the same order: RLlib's cycling over the end of the batch (a
  minibatch that reaches the end takes the rest and continues from the start; reaching the end
  counts an epoch) and its per-epoch ``SampleBatch.shuffle``, which draws
  ``np.random.permutation(count)`` from NumPy's global generator at the same moments (after each
  pass over a module's batch, modules in the batch's order), so the generator ends in the same
  state too;
* each minibatch a ``MultiAgentBatch`` of ``SampleBatch``es with ``concat_samples``' flags
  (``num_grad_updates`` 0.0 where the batch has none) and the train batch's ``env_steps``;
* each column gathered with one index per minibatch (``torch.index_select`` along the rows, an
  index tensor on the column's device; NumPy columns with a NumPy index). ``index_select`` gives
  what ``tensor[index]`` gives, bit for bit; on a CPU it copies whole rows where advanced
  indexing computes an offset per element;
* at the end, each module batch left permuted as RLlib's in-place shuffles leave it, where
  anyone can see it (``leave_final_order``): a train batch that ``Learner.update`` built from
  episodes in the same call is dropped when the update returns, so the learner skips that
  permutation there (one gather of the whole batch).

Scope (:func:`why_not_indexed`): modules without a time rank (no ``seq_lens`` column, module not
stateful) whose columns are torch tensors or NumPy arrays, possibly nested in dicts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.core import ALL_MODULES
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from rllib_ext import _rllib_private as private

__all__ = [
    "INDEXED_MINIBATCHES_KEY",
    "IndexedMinibatches",
    "RLlibMinibatches",
    "indexed_or_rllib",
    "why_not_indexed",
    "with_num_minibatches",
]

INDEXED_MINIBATCHES_KEY = "rllib_ext/indexed_minibatches"
"""``learners/__all_modules__/rllib_ext/indexed_minibatches``: 1.0 where the last update's
minibatches were :class:`IndexedMinibatches`, 0.0 where RLlib's iterator ran instead."""


class RLlibMinibatches(UserWarning):
    """RLlib's minibatch iterator runs instead of :class:`IndexedMinibatches` (the message says
    why); warned once per learner and reason, and ``INDEXED_MINIBATCHES_KEY`` is 0.0."""


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


def why_not_indexed(module: Any, batch: MultiAgentBatch) -> str | None:
    """Why :class:`IndexedMinibatches` cannot reproduce RLlib's iterator for ``batch``, or
    ``None`` where it can. ``module`` is the learner's ``MultiRLModule``."""
    for mid, module_batch in batch.policy_batches.items():
        if module_batch.get(SampleBatch.SEQ_LENS) is not None or module[mid].is_stateful():
            return f"module {mid!r} trains on sequences (a stateful module or seq_lens)"
        for key, value in module_batch.items():
            for leaf in _leaves(value):
                if not isinstance(leaf, (torch.Tensor, np.ndarray)):
                    return f"column {key!r} of module {mid!r} holds {type(leaf).__name__} values"
    return None


class _Cursor:
    """One module's position: where the next minibatch starts in the current row order."""

    def __init__(self, batch: SampleBatch) -> None:
        self.batch = batch
        self.count = len(batch)
        self.order: np.ndarray | None = None  # rows of `batch` in current order; None: 0..count
        self.start = 0
        self.epochs = 0
        self._index_cache: dict[torch.device, torch.Tensor] = {}

    def rows(self, begin: int, end: int) -> np.ndarray:
        if self.order is None:
            return np.arange(begin, end)
        return self.order[begin:end]

    def shuffle(self) -> None:
        # SampleBatch.shuffle: new[i] = old[permutation[i]].
        permutation = np.random.permutation(self.count)
        self.order = permutation if self.order is None else self.order[permutation]

    def gather(self, rows: np.ndarray) -> SampleBatch:
        data = self._columns(rows)
        updates = self.batch.num_grad_updates
        return SampleBatch(
            data,
            seq_lens=[],
            _time_major=self.batch.time_major,
            _zero_padded=self.batch.zero_padded,
            _max_seq_len=self.batch.max_seq_len,
            _num_grad_updates=0.0 if updates is None else float(updates),
        )

    def _columns(self, rows: np.ndarray) -> dict[str, Any]:
        """Every column of the batch at ``rows`` (one index tensor per device)."""
        self._index_cache.clear()
        return {key: self._take(value, rows) for key, value in self.batch.items()}

    def _take(self, value: Any, rows: np.ndarray) -> Any:
        if isinstance(value, Mapping):
            return {key: self._take(item, rows) for key, item in value.items()}
        if isinstance(value, torch.Tensor):
            index = self._index_cache.get(value.device)
            if index is None:
                index = torch.from_numpy(rows).to(value.device)
                self._index_cache[value.device] = index
            return torch.index_select(value, 0, index)
        return value[rows]

    def leave_in_final_order(self) -> None:
        """Permutes the batch in place as RLlib's shuffles would have left it."""
        if self.order is not None:
            self.batch.update(self._columns(self.order))
            self.batch.intercepted_values = {}
            self.order = None


class IndexedMinibatches:
    """RLlib's ``MiniBatchCyclicIterator(batch, num_epochs=..., minibatch_size=...,
    shuffle_batch_per_epoch=..., num_total_minibatches=...)`` by index gathers (see the module
    docstring); iterate it once. ``leave_final_order=False``: ``batch`` is not permuted in place
    at the end (for a batch no caller holds; the minibatches and NumPy's generator are the same)."""

    def __init__(
        self,
        batch: MultiAgentBatch,
        *,
        num_epochs: int,
        minibatch_size: int,
        shuffle_batch_per_epoch: bool,
        num_total_minibatches: int = 0,
        leave_final_order: bool = True,
    ) -> None:
        self.env_steps = len(batch)
        self.leave_final_order = leave_final_order
        self.num_epochs = num_epochs
        self.minibatch_size = minibatch_size
        self.shuffle = shuffle_batch_per_epoch
        self.num_total_minibatches = num_total_minibatches
        self.cursors = {mid: _Cursor(b) for mid, b in batch.policy_batches.items()}

    def _more(self, yielded: int) -> bool:
        if self.num_total_minibatches > 0:
            return yielded < self.num_total_minibatches
        return min(c.epochs for c in self.cursors.values()) < self.num_epochs

    def _next_rows(self, mid: Any, cursor: _Cursor) -> np.ndarray:
        if cursor.count == 0:
            raise ValueError(
                f"The batch for module_id {mid} is empty! This will create an infinite loop "
                "because we need to cover the same number of samples for each module_id."
            )
        start, needed, pieces = cursor.start, self.minibatch_size, []
        # RLlib's loop: `>=`, so a minibatch ending exactly at the batch end counts the epoch.
        while start + needed >= cursor.count:
            pieces.append(cursor.rows(start, cursor.count))
            needed -= cursor.count - start
            start = 0
            cursor.epochs += 1
            if self.shuffle:
                cursor.shuffle()
        end = start + needed
        if end > start:
            pieces.append(cursor.rows(start, end))
        cursor.start = end
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        yielded = 0
        try:
            while self._more(yielded):
                minibatch = {
                    mid: cursor.gather(self._next_rows(mid, cursor))
                    for mid, cursor in self.cursors.items()
                }
                yield MultiAgentBatch(minibatch, self.env_steps)
                yielded += 1
        finally:
            if self.leave_final_order:
                for cursor in self.cursors.values():
                    cursor.leave_in_final_order()


def indexed_or_rllib(
    learner: Any, batch_iter: Iterable, warned: set[str], *, leave_final_order: bool = True
) -> Iterable:
    """:class:`IndexedMinibatches` in place of ``batch_iter`` where that is RLlib's
    ``MiniBatchCyclicIterator`` and :func:`why_not_indexed` finds nothing; else ``batch_iter``
    (RLlib's dummy iterator, a data iterator, nothing to update). Logs
    :data:`INDEXED_MINIBATCHES_KEY`; a :class:`RLlibMinibatches` warning once per reason in
    ``warned`` (the learner's set). ``leave_final_order``: as :class:`IndexedMinibatches`'
    (``False`` where the update built the train batch from episodes)."""
    if type(batch_iter) is not MiniBatchCyclicIterator:
        return batch_iter
    settings = private.cyclic_iterator_settings(batch_iter)
    why_not = why_not_indexed(learner.module, settings["batch"])
    learner.metrics.log_value((ALL_MODULES, INDEXED_MINIBATCHES_KEY), float(not why_not), window=1)
    if why_not:
        if why_not not in warned:
            warned.add(why_not)
            warnings.warn(
                f"rllib_ext: RLlib's minibatch iterator runs for this update: {why_not}.",
                RLlibMinibatches,
                stacklevel=2,
            )
        return batch_iter
    return IndexedMinibatches(**settings, leave_final_order=leave_final_order)


def _minibatch_size(module_batch: SampleBatch, num_minibatches: int) -> int:
    """Rows per minibatch for ``num_minibatches`` over ``module_batch``: ``ceil(rows / N)``; for a
    batch RLlib slices by sequence (``seq_lens``), the size whose RLlib count
    ``int(sequences * size / rows)`` is ``ceil(sequences / N)``."""
    rows = len(module_batch)
    seq_lens = module_batch.get(SampleBatch.SEQ_LENS)
    if seq_lens is None or not private.slices_by_sequence(module_batch):
        return max(1, math.ceil(rows / num_minibatches))
    sequences = len(seq_lens)
    return max(1, math.ceil(math.ceil(sequences / num_minibatches) * rows / sequences))


def with_num_minibatches(batch_iter: Iterable, num_minibatches: int) -> Iterable:
    """``batch_iter`` (RLlib's ``MiniBatchCyclicIterator``, not started) rebuilt so that an
    epoch over the largest module batch has ``num_minibatches`` minibatches where its rows (or,
    sliced by sequence, its sequences) divide by ``N``; otherwise the size rounds up and RLlib's
    iterator carries the remainder into the next epoch, as for any ``minibatch_size``. Smaller
    modules' batches cycle more often, RLlib's rule. ``num_minibatches=0`` or another iterator
    (one epoch without ``minibatch_size``, a data iterator): unchanged."""
    if not num_minibatches or type(batch_iter) is not MiniBatchCyclicIterator:
        return batch_iter
    settings = private.cyclic_iterator_settings(batch_iter)
    largest = max(settings["batch"].policy_batches.values(), key=len)
    settings["minibatch_size"] = _minibatch_size(largest, num_minibatches)
    return MiniBatchCyclicIterator(**settings)
