"""When the fused single-agent loop is exact: the one selection rule, :func:`why_not_fused`.

The loop does what RLlib's default connector pipelines do, directly, which is exact for: the
default env-to-module / module-to-env pipelines, piece by piece of RLlib's own classes with the
flags RLlib's config gives them (plus pieces whose own class declared itself fused-equivalent,
:mod:`rllib_ext.sampling_protocol`), a vector env with gymnasium's next-step autoreset, a
stateless RLModule on the CPU, a ``Box`` observation space, a ``Box`` or ``Discrete`` action
space, no per-step episode callbacks, policy (not random) actions and numpy'd episodes. Any
dict of module outputs is handled as RLlib's pieces handle it (module-computed ``actions``,
nested extra outputs), and any ``episode_lookback_horizon``. Both sampling modes (time steps,
episodes) are covered. The rule reads the runner only: no reset, no RNG draw, no callback. The
checks every fused loop makes are in :mod:`.common`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    BatchIndividualItems,
    NumpyToTensor,
    TensorToNumpy,
)
from ray.rllib.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)

from rllib_ext import _rllib_private as private
from rllib_ext.fused_sampling.common import Piece, per_step_callback, pipeline_mismatch

__all__ = ["default_env_to_module", "default_module_to_env", "why_not_fused"]


def default_env_to_module() -> tuple[Piece, ...]:
    """``SingleAgentEnvRunner``'s default env-to-module pieces, in order, as RLlib's config
    builds them."""
    return (
        (AddObservationsFromEpisodesToBatch, AddObservationsFromEpisodesToBatch),
        (AddTimeDimToBatchAndZeroPad, AddTimeDimToBatchAndZeroPad),
        (AddStatesFromEpisodesToBatch, AddStatesFromEpisodesToBatch),
        (BatchIndividualItems, partial(BatchIndividualItems, multi_agent=False)),
        (NumpyToTensor, NumpyToTensor),
    )


def default_module_to_env(config: Any) -> tuple[Piece, ...]:
    """``SingleAgentEnvRunner``'s default module-to-env pieces for ``config``, in order."""
    normalize = partial(
        NormalizeAndClipActions,
        normalize_actions=config.normalize_actions,
        clip_actions=config.clip_actions,
    )
    return (
        (GetActions, GetActions),
        (TensorToNumpy, TensorToNumpy),
        (UnBatchToIndividualItems, UnBatchToIndividualItems),
        (RemoveSingleTsTimeRankFromBatch, RemoveSingleTsTimeRankFromBatch),
        (NormalizeAndClipActions, normalize),
        (ListifyDataForVectorEnv, ListifyDataForVectorEnv),
    )


def why_not_fused(runner: Any, *, random_actions: bool) -> str | None:
    """Why the fused loop cannot reproduce ``SingleAgentEnvRunner._sample`` for this call of
    ``runner`` (a ``SingleAgentEnvRunner``); ``None``: it can."""
    config, module = runner.config, runner.module
    if random_actions:
        return "random actions"
    if module is None:
        return "no RLModule"
    mismatch = pipeline_mismatch(private.env_to_module(runner), default_env_to_module())
    if mismatch is not None:
        return f"custom env-to-module connectors: {mismatch}"
    mismatch = pipeline_mismatch(private.module_to_env(runner), default_module_to_env(config))
    if mismatch is not None:
        return f"custom module-to-env connectors: {mismatch}"
    if not config.episodes_to_numpy:
        return "episodes_to_numpy=False"
    if module.is_stateful():
        return "a stateful (recurrent) RLModule"
    param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    if param is not None and param.device.type != "cpu":
        return f"RLModule on {param.device}"
    env = runner.env
    autoreset = env.metadata.get("autoreset_mode")
    if autoreset is not None and autoreset != gym.vector.AutoresetMode.NEXT_STEP:
        return f"vector env autoreset mode {autoreset} (fused and RLlib's loop: next-step)"
    if not isinstance(env.single_observation_space, gym.spaces.Box):
        return f"observation space {type(env.single_observation_space).__name__} (fused: Box)"
    if not isinstance(env.single_action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        return f"action space {type(env.single_action_space).__name__} (fused: Box, Discrete)"
    return per_step_callback(runner)
