"""When the fused single-agent loop is exact: the one selection rule, :func:`why_not_fused`.

The loop does what RLlib's default connector pipelines do, directly, which is exact for: the
default env-to-module / module-to-env pipelines (plus pieces that declared themselves
fused-equivalent, :mod:`rllib_ext.sampling_protocol`), a vector env with gymnasium's next-step
autoreset, a stateless RLModule on the CPU that returns no actions of its own, a ``Box``
observation space, a ``Box`` or ``Discrete`` action space, no per-step episode callbacks, policy
(not random) actions and numpy'd episodes. Both sampling modes (time steps, episodes) are
covered. The checks every fused loop makes are in :mod:`.common`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from ray.rllib.core.columns import Columns

from rllib_ext import _rllib_private as private
from rllib_ext.fused_sampling.common import per_step_callback, pipeline_piece_names

__all__ = ["DEFAULT_ENV_TO_MODULE", "DEFAULT_MODULE_TO_ENV", "UNFUSED_OUTPUTS", "why_not_fused"]

DEFAULT_ENV_TO_MODULE = (
    "AddObservationsFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "AddStatesFromEpisodesToBatch",
    "BatchIndividualItems",
    "NumpyToTensor",
)
"""``SingleAgentEnvRunner``'s default env-to-module pieces, in order."""
DEFAULT_MODULE_TO_ENV = (
    "GetActions",
    "TensorToNumpy",
    "UnBatchToIndividualItems",
    "RemoveSingleTsTimeRankFromBatch",
    "NormalizeAndClipActions",
    "ListifyDataForVectorEnv",
)
"""``SingleAgentEnvRunner``'s default module-to-env pieces, in order."""
UNFUSED_OUTPUTS = frozenset({Columns.ACTIONS, Columns.ACTIONS_FOR_ENV, Columns.STATE_OUT})
"""Module outputs the fused loop leaves to RLlib's loop (found by the first forward of a call)."""


def why_not_fused(runner: Any, *, random_actions: bool) -> str | None:
    """Why the fused loop cannot reproduce ``SingleAgentEnvRunner._sample`` for this call of
    ``runner`` (a ``SingleAgentEnvRunner``); ``None``: it can."""
    config, module = runner.config, runner.module
    if random_actions:
        return "random actions"
    if module is None:
        return "no RLModule"
    if pipeline_piece_names(private.env_to_module(runner)) != DEFAULT_ENV_TO_MODULE:
        return "custom env-to-module connectors"
    if pipeline_piece_names(private.module_to_env(runner)) != DEFAULT_MODULE_TO_ENV:
        return "custom module-to-env connectors"
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
