"""When the fused SMAX loop is exact: the one selection rule, :func:`why_not_fused`.

The loop does what RLlib's default connector pieces would do, directly, which is exact only for:
the default env-to-module / module-to-env pipelines (plus pieces that declared themselves
fused-equivalent, :mod:`rllib_ext.sampling_protocol`), one module for all agents, on the CPU,
returning only :data:`FUSED_MODULE_OUTPUTS` (others are found by the first forward of a call,
which then hands the call to RLlib's loop), no per-step episode callbacks, time-step sampling
counted in env steps, the default one-step ``episode_lookback_horizon`` and numpy'd episodes.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.core.columns import Columns

from rllib_ext import _rllib_private as private
from rllib_ext.fused_sampling.common import per_step_callback, pipeline_piece_names

__all__ = ["FUSED_MODULE_OUTPUTS", "why_not_fused"]

FUSED_MODULE_OUTPUTS = frozenset({Columns.ACTION_DIST_INPUTS, Columns.STATE_OUT})
"""What the fused loop turns into episode data (RLlib's loop keeps any other output too)."""

_DEFAULT_ENV_TO_MODULE = (
    "AddObservationsFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "AddStatesFromEpisodesToBatch",
    "AgentToModuleMapping",
    "BatchIndividualItems",
    "NumpyToTensor",
)
_DEFAULT_MODULE_TO_ENV = (
    "GetActions",
    "TensorToNumpy",
    "UnBatchToIndividualItems",
    "ModuleToAgentUnmapping",
    "RemoveSingleTsTimeRankFromBatch",
    "NormalizeAndClipActions",
    "ListifyDataForVectorEnv",
)


def why_not_fused(runner: Any, *, num_timesteps: int | None, random_actions: bool) -> str | None:
    """Why the fused loop cannot reproduce RLlib's loop for this call (``None``: it can)."""
    config = runner.config
    if num_timesteps is None:
        return "episode-count sampling"
    if random_actions:
        return "random actions"
    if config.count_steps_by != "env_steps":
        return "count_steps_by != 'env_steps'"
    if pipeline_piece_names(private.env_to_module(runner)) != _DEFAULT_ENV_TO_MODULE:
        return "custom env-to-module connectors"
    if pipeline_piece_names(private.module_to_env(runner)) != _DEFAULT_MODULE_TO_ENV:
        return "custom module-to-env connectors"
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
    return per_step_callback(runner)
