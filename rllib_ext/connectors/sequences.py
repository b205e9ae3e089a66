"""Time-ranked train-batch columns for stateful modules, as RLlib's learner pieces build them.

For a stateful module RLlib's PPO learner pipeline runs two more pieces after the columns are
gathered per episode chunk:

* ``AddTimeDimToBatchAndZeroPad``: each chunk's rows (its ``L = len(chunk)`` steps, the
  artificial bootstrap step included) are split into ``ceil(L / T)`` sequences of
  ``T = model_config["max_seq_len"]`` rows, the last one right-padded with zeros of the
  column's dtype; a ``seq_lens`` column ``[B]`` (int64) holds each sequence's unpadded length;
* ``AddStatesFromEpisodesToBatch``: one ``state_in`` per sequence: for the chunk's first
  sequence, the module's initial state where the chunk starts its episode (``t_started == 0``),
  else the previous chunk's last ``state_out`` (the chunk's lookback); for sequence ``k > 0``,
  the ``state_out`` of the step before it (row ``k * T - 1`` of the chunk).

The functions here compute the same arrays from the flat columns of all chunks at once (one
scatter per column, one gather for the states), chunk after chunk in the flat columns' order, so
sequence ``b`` of the output is RLlib's sequence ``b``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tree
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.numpy import convert_to_numpy

__all__ = ["SequenceLayout", "sequence_state_in", "why_not_sequences"]


def _map(fn: Callable[..., np.ndarray], *values: Any) -> Any:
    """``fn`` over the leaves of ``values`` (same structure); plain dicts keep their key order
    as ``tree.map_structure`` keeps it."""
    if isinstance(values[0], np.ndarray):
        return fn(*values)
    if type(values[0]) is dict:
        return {key: _map(fn, *(v[key] for v in values)) for key in values[0]}
    return tree.map_structure(fn, *values)


class SequenceLayout:
    """Where each row of the flat columns goes in the time-ranked ``[B, T, ...]`` columns.

    ``lens``: the chunks' lengths ``[C]`` (int64, each >= 1), in the flat columns' order; their
    sum ``N`` is the flat columns' row count. ``B = sum(ceil(lens / T))``.
    """

    def __init__(self, lens: np.ndarray, max_seq_len: int) -> None:
        self.max_seq_len = t = int(max_seq_len)
        self.lens = lens
        self.num_sequences = -(-lens // t)  # [C] ceil(L / T)
        self.num_rows = int(lens.sum())
        self.first_sequence = np.cumsum(self.num_sequences) - self.num_sequences  # [C]
        self.first_row = np.cumsum(lens) - lens  # [C] in the flat columns
        # Flat row i of chunk c (at offset j) lands at padded row first_sequence[c] * T + j.
        self.destination = np.repeat(self.first_sequence * t - self.first_row, lens) + np.arange(
            self.num_rows
        )

    @property
    def batch_size(self) -> int:
        return int(self.num_sequences.sum())

    def seq_lens(self) -> np.ndarray:
        """``[B]`` int64: ``T`` for every sequence but each chunk's last, which holds the rest."""
        seq_lens = np.full(self.batch_size, self.max_seq_len, dtype=np.int64)
        last = self.first_sequence + self.num_sequences - 1
        seq_lens[last] = self.lens - (self.num_sequences - 1) * self.max_seq_len
        return seq_lens

    def zero_pad(self, column: Any) -> Any:
        """A flat column (``[N, ...]`` arrays, possibly nested) as ``[B, T, ...]``, zero-padded
        with the column's dtype."""

        def pad(flat: np.ndarray) -> np.ndarray:
            out = np.zeros((self.batch_size * self.max_seq_len, *flat.shape[1:]), flat.dtype)
            out[self.destination] = flat
            return out.reshape(self.batch_size, self.max_seq_len, *flat.shape[1:])

        return _map(pad, column)

    def memorized_map_structure(self, eps_ids: Sequence[str]) -> list[str]:
        """The single-agent ``memorized_map_structure`` RLlib's ``BatchIndividualItems`` records
        for time-ranked observations: each chunk's episode id once per sequence."""
        counts = self.num_sequences.tolist()
        return [eps_id for eps_id, n in zip(eps_ids, counts, strict=True) for _ in range(n)]


def why_not_sequences(chunks: Sequence[SingleAgentEpisode]) -> str | None:
    """Why :func:`sequence_state_in` cannot reproduce ``AddStatesFromEpisodesToBatch`` for the
    stateful module's ``chunks``, or ``None``."""
    for chunk in chunks:
        buffer = chunk.extra_model_outputs.get(Columns.STATE_OUT)
        if buffer is None:
            return "episode chunks of a stateful module carry no state_out"
        if chunk.t_started != 0 and buffer.lookback < 1:
            return "a continuing episode chunk has no state_out before its start"
    return None


def sequence_state_in(
    module: Any, chunks: Sequence[SingleAgentEpisode], state_out: Any, layout: SequenceLayout
) -> Any:
    """``state_in`` ``[B, ...]`` (the module's state structure) for the sequences of
    ``layout``. ``state_out``: the chunks' flat ``state_out`` column (``[N, ...]`` leaves, the
    chunks already extended by the bootstrap step); ``module``: the stateful module whose
    ``get_initial_state()`` starts each episode."""
    t = layout.max_seq_len
    initial = None
    firsts = []
    for chunk in chunks:
        if chunk.t_started == 0:
            if initial is None:
                initial = convert_to_numpy(module.get_initial_state())
            firsts.append(initial)
        else:
            buffer = chunk.extra_model_outputs[Columns.STATE_OUT]
            firsts.append(_map(lambda data, i=buffer.lookback - 1: data[i], buffer.data))
    later = np.ones(layout.batch_size, dtype=bool)
    later[layout.first_sequence] = False
    # Sequence k > 0 of chunk c starts from state_out row first_row[c] + k * T - 1.
    offsets = np.arange(layout.batch_size) - np.repeat(layout.first_sequence, layout.num_sequences)
    source = np.repeat(layout.first_row, layout.num_sequences) + offsets * t - 1

    def gather(*leaves: np.ndarray) -> np.ndarray:
        outs, first_leaves = leaves[1], (leaves[0], *leaves[2:])
        dtype = np.result_type(outs.dtype, *(np.asarray(f).dtype for f in first_leaves))
        out = np.empty((layout.batch_size, *outs.shape[1:]), dtype)
        out[later] = outs[source[later]]
        out[layout.first_sequence] = np.stack(first_leaves)
        return out

    # The first chunk's first state leads: RLlib's batch keeps its dict key order.
    return _map(gather, firsts[0], state_out, *firsts[1:])
