"""When the fused SMAX loop is exact: the one selection rule, :func:`why_not_fused`.

The loop does what RLlib's default connector pieces would do, directly, which is exact only for:
the default env-to-module / module-to-env pipelines (plus pieces that declared themselves
fused-equivalent, :mod:`rllib_ext.sampling_protocol`), one module for all agents, on the CPU,
returning only :data:`FUSED_MODULE_OUTPUTS` (found by a dry forward before the call:
:func:`~.policy.probe_outputs`), no per-step episode callbacks, time-step sampling counted in
env steps, the default one-step ``episode_lookback_horizon`` and numpy'd episodes. Pieces are
compared by exact class and flags (:func:`~rllib_ext.fused_sampling.common.pipeline_mismatch`).
The rule runs before any side effect: no reset, no RNG draw (the dry forward restores them),
no callback.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
    TensorToNumpy,
)
from ray.rllib.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    ModuleToAgentUnmapping,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)

from rllib_ext import _rllib_private as private
from rllib_ext.envs.smac.sampling.policy import FUSED_MODULE_OUTPUTS, probe_outputs
from rllib_ext.fused_sampling.common import Piece, per_step_callback, pipeline_mismatch

__all__ = ["FUSED_MODULE_OUTPUTS", "why_not_fused"]


def _default_pieces(config: Any) -> tuple[tuple[Piece, ...], tuple[Piece, ...]]:
    """``MultiAgentEnvRunner``'s default env-to-module and module-to-env pieces, in order, as
    RLlib's config builds them."""
    to_module: tuple[Piece, ...] = (
        (AddObservationsFromEpisodesToBatch, AddObservationsFromEpisodesToBatch),
        (AddTimeDimToBatchAndZeroPad, AddTimeDimToBatchAndZeroPad),
        (AddStatesFromEpisodesToBatch, AddStatesFromEpisodesToBatch),
        (
            AgentToModuleMapping,
            partial(AgentToModuleMapping, rl_module_specs={}, agent_to_module_mapping_fn=None),
        ),
        (BatchIndividualItems, partial(BatchIndividualItems, multi_agent=True)),
        (NumpyToTensor, NumpyToTensor),
    )
    normalize = partial(
        NormalizeAndClipActions,
        normalize_actions=config.normalize_actions,
        clip_actions=config.clip_actions,
    )
    to_env: tuple[Piece, ...] = (
        (GetActions, GetActions),
        (TensorToNumpy, TensorToNumpy),
        (UnBatchToIndividualItems, UnBatchToIndividualItems),
        (ModuleToAgentUnmapping, ModuleToAgentUnmapping),
        (RemoveSingleTsTimeRankFromBatch, RemoveSingleTsTimeRankFromBatch),
        (NormalizeAndClipActions, normalize),
        (ListifyDataForVectorEnv, ListifyDataForVectorEnv),
    )
    return to_module, to_env


def why_not_fused(
    runner: Any, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
) -> str | None:
    """Why the fused loop cannot reproduce RLlib's loop for this call (``None``: it can);
    ``explore`` (``None``: the config's) picks the forward the dry check runs."""

    config = runner.config
    if num_timesteps is None:
        return "episode-count sampling"
    if random_actions:
        return "random actions"
    if config.count_steps_by != "env_steps":
        return "count_steps_by != 'env_steps'"
    to_module, to_env = _default_pieces(config)
    mismatch = pipeline_mismatch(private.env_to_module(runner), to_module)
    if mismatch is not None:
        return f"custom env-to-module connectors: {mismatch}"
    mismatch = pipeline_mismatch(private.module_to_env(runner), to_env)
    if mismatch is not None:
        return f"custom module-to-env connectors: {mismatch}"
    if not config.episodes_to_numpy:  # the fused loop builds numpy'd chunks only
        return "episodes_to_numpy=False"
    if config.episode_lookback_horizon != 1:
        # EnvTrack.continuation keeps one step of lookback, as RLlib's default cut does.
        return f"episode_lookback_horizon={config.episode_lookback_horizon} (fused: 1)"
    if len(runner.module) != 1:
        return "more than one RLModule"
    for rl_module in runner.module.values():
        param = next(rl_module.parameters(), None)
        if param is not None and param.device.type != "cpu":  # fused inputs are CPU tensors
            return f"RLModule on {param.device}"
    callback = per_step_callback(runner)
    if callback is not None:
        return callback
    module_id = next(iter(runner.module.keys()))
    explore = config.explore if explore is None else explore
    extra = probe_outputs(runner, module_id, explore=explore) - FUSED_MODULE_OUTPUTS
    if extra:  # RLlib would keep them in the episodes; this loop has no place for them
        return f"the RLModule also outputs {sorted(extra)}"
    return None
