"""``VectorizedEpisodesToBatch``: RLlib's default PPO learner pieces fused into one pass.

RLlib's PPO learner pipeline (``PPOLearner.build`` + ``AlgorithmConfig.build_learner_connector``)
starts with seven pieces that together turn episodes into a train batch:

    AddOneTsToEpisodesAndTruncate -> AddObservationsFromEpisodesToBatch
    -> AddColumnsFromEpisodesToTrainBatch -> AddTimeDimToBatchAndZeroPad
    -> AddStatesFromEpisodesToBatch -> [AgentToModuleMapping] -> BatchIndividualItems

Each walks every episode in Python and the first three build per-time-step Python lists (one
``bool`` per step for the loss mask and both flags), which ``BatchIndividualItems`` then turns
back into arrays: at 32k CartPole steps these pieces cost several times the GAE computation.

This piece produces the same batch and leaves the episodes in the same state:

* each episode gets the same artificial bootstrap step, ids, and truncation flag as
  ``AddOneTsToEpisodesAndTruncate`` (one array append per buffer);
* columns are sliced once per episode from the episode buffers and concatenated once per
  column; the loss mask and the two flags are built from episode lengths with array indexing;
* the rows, their order, dtypes, nested observation structures and ``shared_data`` entries are
  RLlib's.

It only takes this path where it is exact: an empty incoming batch, numpy-finalized episode
chunks of at least one step, the same ``extra_model_outputs`` keys in every chunk; for a
stateful module, ``max_seq_len`` in its ``model_config`` and a ``state_out`` in every chunk
(a continuing chunk's in its lookback too), where this piece also does what RLlib's
``AddTimeDimToBatchAndZeroPad`` and ``AddStatesFromEpisodesToBatch`` do
(``rllib_ext.connectors.sequences``: ``[B, T, ...]`` columns, ``seq_lens``, ``state_in``).
Otherwise it runs the original RLlib pieces, which it keeps, and reports
``<module>/batching/vectorized = 0``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tree
from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
)
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner import (
    AddColumnsFromEpisodesToTrainBatch,
    AddOneTsToEpisodesAndTruncate,
)
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.typing import EpisodeType, ModuleID

from rllib_ext import _rllib_private as private
from rllib_ext.connectors.sequences import SequenceLayout, sequence_state_in, why_not_sequences

__all__ = ["FUSED_PIECES", "VectorizedEpisodesToBatch", "install_vectorized_batching"]

logger = logging.getLogger(__name__)

BATCHING_IMPL_KEY = "rllib_ext/batching/vectorized"

# The default pieces this replaces, in pipeline order (AgentToModuleMapping: multi-agent only).
FUSED_PIECES: tuple[type, ...] = (
    AddOneTsToEpisodesAndTruncate,
    AddObservationsFromEpisodesToBatch,
    AddColumnsFromEpisodesToTrainBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    AgentToModuleMapping,
    BatchIndividualItems,
)
_FIXED_COLUMNS = (
    Columns.LOSS_MASK,
    Columns.TERMINATEDS,
    Columns.TRUNCATEDS,
    Columns.OBS,
    Columns.ACTIONS,
    Columns.REWARDS,
)


def _slice(data: Any, start: int, stop: int) -> Any:
    if isinstance(data, np.ndarray):
        return data[start:stop]
    if type(data) is dict:
        # What tree.map_structure returns for a dict (its keys in their order), without its
        # flatten/unflatten per call (one call per episode chunk and column).
        return {key: _slice(value, start, stop) for key, value in data.items()}
    return tree.map_structure(lambda d: d[start:stop], data)


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=0)
    if type(parts[0]) is dict:
        return {key: _concat([part[key] for part in parts]) for key in parts[0]}
    # Other nests (tuples, dict subclasses): the structure RLlib's ``batch`` utility returns.
    return tree.map_structure(lambda *leaves: np.concatenate(leaves, axis=0), *parts)


def _append_last(buffer: InfiniteLookbackBuffer) -> None:
    """``buffer.append(buffer[-1])`` (what RLlib does) for a finalized buffer."""
    if isinstance(buffer.data, np.ndarray):
        # == np.concatenate([data, np.asarray(data[-1])[np.newaxis]]): same dtype and values.
        buffer.data = np.concatenate([buffer.data, buffer.data[-1:]], axis=0)
    else:
        buffer.append(buffer[-1])


def _add_one_ts(episode: SingleAgentEpisode) -> None:
    """Exactly ``ray.rllib.utils.postprocessing.episodes.add_one_ts_to_episodes_and_truncate``
    for one finalized episode (minus its ``validate()`` assertions)."""
    episode.t += 1
    _append_last(episode.observations)
    episode.infos.append(episode.infos[-1])
    _append_last(episode.actions)
    # RLlib appends a Python 0.0: float64, which also promotes float32 rewards, as RLlib does.
    episode.rewards.append(0.0)
    for buffer in episode.extra_model_outputs.values():
        _append_last(buffer)
    if not episode.is_done:
        episode.is_truncated = True


def _buffer_rows(buffer: InfiniteLookbackBuffer, n: int) -> Any:
    """``buffer.get(slice(0, n))`` for a finalized buffer: rows after the lookback."""
    return _slice(buffer.data, buffer.lookback, buffer.lookback + n)


class VectorizedEpisodesToBatch(ConnectorV2):
    """Builds the PPO train batch from episodes in one vectorized pass.

    Output, per module id ``mid`` (``DEFAULT_MODULE_ID`` for single-agent): numpy columns of
    ``N = sum(len(chunk) + 1)`` rows, ``loss_mask``/``terminateds``/``truncateds`` ``[N]``
    bool, ``obs`` ``[N, *obs_shape]`` (or its nested structure), ``actions``, ``rewards``
    ``[N]``, and every ``extra_model_outputs`` column but the recurrent state, in RLlib's row
    order. For a stateful module every column is ``[B, T, ...]`` instead (each chunk's rows split
    into ``T = max_seq_len`` sequences, zero-padded), plus ``seq_lens`` ``[B]`` and ``state_in``
    ``[B, ...]``. Logs ``<mid>/batching/vectorized`` (1.0 fused, 0.0 fell back to RLlib's
    pieces).
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        pieces: Sequence[ConnectorV2],
        multi_agent: bool,
    ) -> None:
        self.pieces = list(pieces)
        self.multi_agent = multi_agent
        self._warned: set[str] = set()
        super().__init__(input_observation_space, input_action_space)

    def _spaces_through_pieces(self, obs_space: Any, act_space: Any) -> tuple[Any, Any]:
        for piece in self.pieces:
            piece.input_observation_space = obs_space
            piece.input_action_space = act_space
            obs_space, act_space = piece.observation_space, piece.action_space
        return obs_space, act_space

    @override(ConnectorV2)
    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        return self._spaces_through_pieces(input_observation_space, input_action_space)[0]

    @override(ConnectorV2)
    def recompute_output_action_space(self, input_observation_space, input_action_space):
        return self._spaces_through_pieces(input_observation_space, input_action_space)[1]

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: dict[str, Any],
        episodes: list[EpisodeType],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        shared_data = shared_data if shared_data is not None else {}
        chunks = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
        reason = self._why_not_fused(rl_module, batch, episodes, chunks)
        if reason is not None:
            if reason not in self._warned:
                self._warned.add(reason)
                logger.info("rllib_ext batching: RLlib's own pieces used (%s).", reason)
            kwargs.pop("data", None)  # ConnectorPipelineV2 passes the current batch as `data`
            for piece in self.pieces:
                batch = piece(
                    rl_module=rl_module,
                    batch=batch,
                    episodes=episodes,
                    explore=explore,
                    shared_data=shared_data,
                    metrics=metrics,
                    data=batch,
                    **kwargs,
                )
            self._log(metrics, batch, rl_module, 0.0)
            return batch

        self._extend_episodes(episodes, chunks)
        private.mark_loss_mask_added(shared_data)
        if self.multi_agent:
            groups: dict[ModuleID, list[SingleAgentEpisode]] = {}
            for chunk in chunks:
                groups.setdefault(chunk.module_id, []).append(chunk)
            batch = {
                mid: _module_columns(rl_module[mid], group, mid, shared_data)[0]
                for mid, group in groups.items()
            }
            shared_data["memorized_map_structure"] = {
                mid: [(c.multi_agent_episode_id, c.agent_id) for c in group]
                for mid, group in groups.items()
            }
        else:
            is_multi_rl_module = isinstance(rl_module, MultiRLModule)
            module = rl_module[DEFAULT_MODULE_ID] if is_multi_rl_module else rl_module
            columns, layout = _module_columns(module, chunks, DEFAULT_MODULE_ID, shared_data)
            shared_data["memorized_map_structure"] = (
                [eps_id for c in chunks for eps_id in [c.id_] * len(c)]
                if layout is None
                else layout.memorized_map_structure([c.id_ for c in chunks])
            )
            batch = {DEFAULT_MODULE_ID: columns} if is_multi_rl_module else columns
        self._log(metrics, batch, rl_module, 1.0)
        return batch

    def _why_not_fused(
        self,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[EpisodeType],
        chunks: list[SingleAgentEpisode],
    ) -> str | None:
        if batch:
            return "the incoming batch already holds columns"
        if not chunks:
            return "no episodes"
        is_ma = isinstance(episodes[0], MultiAgentEpisode)
        if is_ma != self.multi_agent:
            return "episode type does not match the pipeline"
        keys = tuple(chunks[0].extra_model_outputs)
        module_ids: set[Any] = set()
        for chunk in chunks:
            if not chunk.is_numpy or not chunk.observations.finalized or len(chunk) < 1:
                return "an episode chunk is empty or not numpy-finalized"
            if tuple(chunk.extra_model_outputs) != keys:
                return "episode chunks carry different extra_model_outputs"
            module_ids.add(chunk.module_id if is_ma else DEFAULT_MODULE_ID)
        carries_state = Columns.STATE_IN in keys or Columns.STATE_OUT in keys
        if isinstance(rl_module, MultiRLModule):
            modules = {mid: rl_module[mid] if mid in rl_module else None for mid in module_ids}
            if None in modules.values():
                return "a module of the episodes is not in the MultiRLModule"
        else:
            modules = {DEFAULT_MODULE_ID: rl_module}
        for mid, module in modules.items():
            if module is None or not module.unwrapped().is_stateful():
                if carries_state:
                    return "episodes carry recurrent state for a module that is not stateful"
                continue
            if "max_seq_len" not in module.model_config:
                return f"stateful module {mid!r} has no max_seq_len"  # RLlib's pieces raise
            reason = why_not_sequences([c for c in chunks if not is_ma or c.module_id == mid])
            if reason is not None:
                return reason
        return None

    @staticmethod
    def _extend_episodes(episodes: list[EpisodeType], chunks: list[SingleAgentEpisode]) -> None:
        # Ids exactly as AddOneTsToEpisodesAndTruncate (they key RLlib's batch structures).
        if isinstance(episodes[0], MultiAgentEpisode):
            for i, ma_episode in enumerate(episodes):
                ma_episode.id_ += "_" + str(i)
                for sa_episode in ma_episode.agent_episodes.values():
                    sa_episode.multi_agent_episode_id = ma_episode.id_
        for i, chunk in enumerate(chunks):
            chunk.id_ += "_" + str(i)
            _add_one_ts(chunk)

    @staticmethod
    def _log(
        metrics: MetricsLogger | None, batch: dict[str, Any], rl_module: Any, value: float
    ) -> None:
        if metrics is None:
            return
        mids = [m for m in batch if rl_module is not None and m in rl_module] or [DEFAULT_MODULE_ID]
        for mid in mids:
            metrics.log_value((mid, BATCHING_IMPL_KEY), value, window=1)


def _module_columns(
    module: Any, chunks: list[SingleAgentEpisode], mid: ModuleID, shared_data: dict
) -> tuple[dict[str, Any], SequenceLayout | None]:
    """One module's train-batch columns of ``chunks`` (already extended by one step each) and,
    for a stateful module, the layout of its sequences (else ``None``): its columns then
    ``[B, T, ...]`` plus ``seq_lens`` and ``state_in``, as RLlib's ``AddTimeDimToBatchAndZeroPad``
    and ``AddStatesFromEpisodesToBatch`` leave them (``rllib_ext.connectors.sequences``)."""
    columns = _columns(chunks)
    if module is None or not module.unwrapped().is_stateful():
        return columns, None
    lens = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    layout = SequenceLayout(lens, module.model_config["max_seq_len"])
    columns = {key: layout.zero_pad(value) for key, value in columns.items()}
    columns[Columns.SEQ_LENS] = layout.seq_lens()
    state_out = _concat(
        [_buffer_rows(c.extra_model_outputs[Columns.STATE_OUT], len(c)) for c in chunks]
    )
    columns[Columns.STATE_IN] = sequence_state_in(module, chunks, state_out, layout)
    private.mark_zero_padded(shared_data, mid)
    return columns, layout


def _columns(chunks: list[SingleAgentEpisode]) -> dict[str, Any]:
    """The train-batch columns of ``chunks`` (already extended by one step each), in order."""
    lens = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    n_rows = int(lens.sum())
    bootstrap_rows = np.cumsum(lens) - 1
    loss_mask = np.ones(n_rows, dtype=bool)
    loss_mask[bootstrap_rows] = False
    terminateds = np.zeros(n_rows, dtype=bool)
    terminateds[bootstrap_rows - 1] = [bool(c.is_terminated) for c in chunks]
    truncateds = np.zeros(n_rows, dtype=bool)
    truncateds[bootstrap_rows - 1] = [bool(c.is_truncated) for c in chunks]

    # RLlib's AddColumnsFromEpisodesToTrainBatch leaves the recurrent state to
    # AddStatesFromEpisodesToBatch.
    skip = {*_FIXED_COLUMNS, Columns.STATE_IN, Columns.STATE_OUT}
    extra_keys = [k for k in chunks[0].extra_model_outputs if k not in skip]
    obs, actions, rewards = [], [], []
    extras: dict[str, list[Any]] = {k: [] for k in extra_keys}
    for chunk, n in zip(chunks, lens.tolist(), strict=True):
        obs.append(_buffer_rows(chunk.observations, n))
        actions.append(_buffer_rows(chunk.actions, n))
        rewards.append(_buffer_rows(chunk.rewards, n))
        outputs = chunk.extra_model_outputs
        for key, parts in extras.items():
            parts.append(_buffer_rows(outputs[key], n))
    return {
        Columns.LOSS_MASK: loss_mask,
        Columns.TERMINATEDS: terminateds,
        Columns.TRUNCATEDS: truncateds,
        Columns.OBS: _concat(obs),
        Columns.ACTIONS: _concat(actions),
        Columns.REWARDS: _concat(rewards),
        **{key: _concat(parts) for key, parts in extras.items()},
    }


def _matches(pieces: Iterable[ConnectorV2], *, multi_agent: bool) -> bool:
    expected = [p for p in FUSED_PIECES if multi_agent or p is not AgentToModuleMapping]
    return [type(p) for p in pieces] == expected


def install_vectorized_batching(pipeline: ConnectorPipelineV2, *, multi_agent: bool) -> bool:
    """Replaces RLlib's default PPO batching pieces in ``pipeline`` by one fused piece.

    Only where the pipeline holds them in RLlib's default order with nothing in between
    (custom ``learner_connector`` pieces sit between ``AddOneTsToEpisodesAndTruncate`` and the
    rest, and then the pipeline is left alone). Returns whether it replaced them.
    """
    connectors = pipeline.connectors
    n = len(FUSED_PIECES) - (0 if multi_agent else 1)
    for start in range(len(connectors) - n + 1):
        run = connectors[start : start + n]
        if _matches(run, multi_agent=multi_agent):
            fused = VectorizedEpisodesToBatch(
                run[0].input_observation_space,
                run[0].input_action_space,
                pieces=run,
                multi_agent=multi_agent,
            )
            pipeline.connectors = [*connectors[:start], fused, *connectors[start + n :]]
            private.fix_spaces(pipeline)
            return True
    return False
