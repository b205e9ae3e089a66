"""The checks every fused loop's rule makes, whatever the env: RLlib's default connector
pipelines piece by piece, numpy'd episodes, a module on the CPU, no per-step episode callback.

Each loop's own rule (:func:`rllib_ext.fused_sampling.single_agent_rule`,
:func:`rllib_ext.envs.smac.sampling.smax_rule`) calls these in its own order and adds what only
it needs. Every check reads the runner only: no env reset, no RNG draw, no callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
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
from rllib_ext.sampling_protocol import fused_equivalent

__all__ = ["Piece", "UnfusedModuleOutputs", "connector_mismatch", "default_pipelines"]
__all__ += ["module_off_cpu", "per_step_callback", "pipeline_mismatch"]

PER_STEP_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step")

Piece = tuple[type, Callable[[], Any]]
"""An expected connector piece: its exact class and a factory for the piece as RLlib's config
builds it (its flags are what the piece in the pipeline must have)."""


class UnfusedModuleOutputs(Exception):
    """The module returned outputs the fused loop does not record (raised by a fused loop's
    forward; the rule's dry check finds them before a call starts)."""


def default_pipelines(
    config: Any, *, multi_agent: bool
) -> tuple[tuple[Piece, ...], tuple[Piece, ...]]:
    """RLlib's default env-to-module and module-to-env pieces, in order, as RLlib's config
    builds them for a ``SingleAgentEnvRunner`` or (``multi_agent``) a ``MultiAgentEnvRunner``."""
    mapping: tuple[Piece, ...] = (
        (
            AgentToModuleMapping,
            partial(AgentToModuleMapping, rl_module_specs={}, agent_to_module_mapping_fn=None),
        ),
    )
    to_module: tuple[Piece, ...] = (
        (AddObservationsFromEpisodesToBatch, AddObservationsFromEpisodesToBatch),
        (AddTimeDimToBatchAndZeroPad, AddTimeDimToBatchAndZeroPad),
        (AddStatesFromEpisodesToBatch, AddStatesFromEpisodesToBatch),
        *(mapping if multi_agent else ()),
        (BatchIndividualItems, partial(BatchIndividualItems, multi_agent=multi_agent)),
        (NumpyToTensor, NumpyToTensor),
    )
    normalize = partial(
        NormalizeAndClipActions,
        normalize_actions=config.normalize_actions,
        clip_actions=config.clip_actions,
    )
    unmapping: tuple[Piece, ...] = ((ModuleToAgentUnmapping, ModuleToAgentUnmapping),)
    to_env: tuple[Piece, ...] = (
        (GetActions, GetActions),
        (TensorToNumpy, TensorToNumpy),
        (UnBatchToIndividualItems, UnBatchToIndividualItems),
        *(unmapping if multi_agent else ()),
        (RemoveSingleTsTimeRankFromBatch, RemoveSingleTsTimeRankFromBatch),
        (NormalizeAndClipActions, normalize),
        (ListifyDataForVectorEnv, ListifyDataForVectorEnv),
    )
    return to_module, to_env


def _flags(piece: Any) -> dict[str, Any]:
    """A piece's flags: its attributes holding a bool, number or string (spaces, devices,
    functions and unset ``None`` values are no flags)."""
    return {k: v for k, v in vars(piece).items() if isinstance(v, (bool, int, float, str))}


def pipeline_mismatch(pipeline: Any, expected: Sequence[Piece]) -> str | None:
    """How ``pipeline``'s pieces differ from ``expected`` (``None``: they do not), pieces that
    declared :data:`~rllib_ext.sampling_protocol.FUSED_EQUIVALENT` on their own class left out.

    A piece matches by exact class (a subclass may do more) and by its flags, compared with
    those of the piece RLlib's config would build (e.g. ``NormalizeAndClipActions``'
    ``normalize_actions`` / ``clip_actions``)."""
    pieces = [p for p in getattr(pipeline, "connectors", ()) if not fused_equivalent(p)]
    names = tuple(type(p).__name__ for p in pieces)
    if len(pieces) != len(expected) or any(
        type(p) is not cls for p, (cls, _) in zip(pieces, expected, strict=True)
    ):
        return f"pieces {names}"
    for piece, (_, build) in zip(pieces, expected, strict=True):
        mine, default = _flags(piece), _flags(build())
        if mine != default:
            return f"{type(piece).__name__} with {mine} (RLlib's: {default})"
    return None


def connector_mismatch(runner: Any, *, multi_agent: bool) -> str | None:
    """Why ``runner``'s connectors or episodes differ from what the fused loops reproduce:
    RLlib's default pipelines (:func:`default_pipelines`, compared by :func:`pipeline_mismatch`)
    and numpy'd episodes (the loops build numpy'd chunks only); ``None``: they do not."""
    config = runner.config
    to_module, to_env = default_pipelines(config, multi_agent=multi_agent)
    mismatch = pipeline_mismatch(private.env_to_module(runner), to_module)
    if mismatch is not None:
        return f"custom env-to-module connectors: {mismatch}"
    mismatch = pipeline_mismatch(private.module_to_env(runner), to_env)
    if mismatch is not None:
        return f"custom module-to-env connectors: {mismatch}"
    if not config.episodes_to_numpy:
        return "episodes_to_numpy=False"
    return None


def module_off_cpu(rl_module: Any) -> str | None:
    """``"RLModule on <device>"`` where ``rl_module``'s first parameter is not on the CPU (the
    fused loops' inputs are CPU tensors); ``None`` for a CPU module or one without parameters."""
    parameters = getattr(rl_module, "parameters", None)
    param = next(iter(parameters()), None) if parameters is not None else None
    if param is not None and param.device.type != "cpu":
        return f"RLModule on {param.device}"
    return None


def per_step_callback(runner: Any) -> str | None:
    """The first per-step episode callback (object method or config function) the runner
    would call, as ``"callback Class.method"`` / ``"config callbacks_<name>"``; else ``None``."""
    for callback in private.runner_callbacks(runner):
        for name in PER_STEP_CALLBACKS:
            if getattr(type(callback), name) is not getattr(RLlibCallback, name):
                return f"callback {type(callback).__name__}.{name}"
    for name in PER_STEP_CALLBACKS:
        if getattr(runner.config, f"callbacks_{name}", None):
            return f"config callbacks_{name}"
    return None
