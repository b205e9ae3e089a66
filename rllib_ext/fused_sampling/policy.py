"""The fused single-agent loop's policy step: one forward over all envs, then RLlib's actions.

What RLlib's default pipelines around the module do, directly and batched: the envs' last
observations ``[N, ...]`` as a tensor (``BatchIndividualItems`` + ``NumpyToTensor``: RLlib's own
``convert_to_torch_tensor``), the forward, then ``GetActions`` (sample, or the deterministic
action for ``explore=False``, and its log-probability), ``TensorToNumpy`` (RLlib's
``convert_to_numpy``) and ``NormalizeAndClipActions`` (RLlib's ``unsquash_action`` /
``clip_action`` over the batch). Outputs are cast to float32 first (``amp_inference``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.utils.metrics import RLMODULE_INFERENCE_TIMER
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

from rllib_ext import _rllib_private as private
from rllib_ext.env_runners import to_float32
from rllib_ext.fused_sampling.common import UnfusedModuleOutputs
from rllib_ext.fused_sampling.rules import UNFUSED_OUTPUTS
from rllib_ext.sampling_protocol import sample_phase

__all__ = ["ActionStep", "act"]


class ActionStep(NamedTuple):
    """The policy's step for ``N`` envs: ``actions`` (what episodes store, ``[N, ...]``),
    ``actions_for_env`` (unsquashed or clipped, what the env gets), ``extra`` (every other
    column RLlib's loop stores per step: the module's outputs and ``action_logp``, each
    ``[N, ...]``) under the weights ``weights_seq_no``."""

    actions: np.ndarray
    actions_for_env: np.ndarray
    extra: dict[str, Any]
    weights_seq_no: int


def act(runner: Any, observations: np.ndarray, *, explore: bool, env_ts: int) -> ActionStep:
    """Actions for the envs' last ``observations`` (``[N, ...]``) from ``runner.module``, which
    the caller put in eval mode (as RLlib's public forwards do around each call).

    ``env_ts``: env steps already taken in this call (RLlib's exploration timestep estimate).

    Raises:
        UnfusedModuleOutputs: the module returned one of
            :data:`~rllib_ext.fused_sampling.rules.UNFUSED_OUTPUTS`.
    """
    module = runner.module
    obs = torch.from_numpy(np.asarray(observations))
    if obs.is_floating_point() and obs.dtype != torch.float16:  # as NumpyToTensor converts
        obs = obs.float()
    batch = {Columns.OBS: obs}
    runners = runner.config.num_env_runners or 1
    t = (runner.num_env_steps_sampled_lifetime // runners + env_ts) * runners
    with runner.metrics.log_time(RLMODULE_INFERENCE_TIMER), sample_phase(runner, "inference"):
        out = private.module_forward_in_eval_mode(module, batch, explore=explore, t=t)
    # What RLlib's module-to-env pieces do (GetActions, TensorToNumpy, NormalizeAndClipActions):
    # a profiler counts it as "connectors".
    with sample_phase(runner, "connectors"):
        return _actions(runner, module, out, explore=explore)


def _actions(runner: Any, module: Any, out: Any, *, explore: bool) -> ActionStep:
    """The step's actions from the module's outputs ``out``: ``GetActions``, ``TensorToNumpy``
    and ``NormalizeAndClipActions`` over the batch, outputs cast to float32 first."""
    out = dict(to_float32(out))
    unfused = sorted(UNFUSED_OUTPUTS & out.keys())
    if unfused:
        raise UnfusedModuleOutputs(f"the RLModule outputs {unfused}")
    dist_cls = (
        module.get_exploration_action_dist_cls()
        if explore
        else module.get_inference_action_dist_cls()
    )
    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    if not explore:
        dist = dist.to_deterministic()
    actions = dist.sample()
    out[Columns.ACTIONS] = actions
    if Columns.ACTION_LOGP not in out:
        out[Columns.ACTION_LOGP] = dist.logp(actions)
    extra = _to_numpy(out)
    actions_np = extra.pop(Columns.ACTIONS)
    return ActionStep(
        actions=actions_np,
        actions_for_env=_for_env(runner, actions_np),
        extra=extra,
        weights_seq_no=private.weights_seq_no(runner),
    )


def _to_numpy(out: dict[str, Any]) -> dict[str, Any]:
    """RLlib's ``convert_to_numpy`` (``TensorToNumpy``: float -> float32, int -> int32) over a
    flat dict of CPU tensors without its per-leaf tree walk; nested values go through it."""
    result: dict[str, Any] = {}
    for key, value in out.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            result[key] = convert_to_numpy(value)
            continue
        array = value.detach().numpy()
        if np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32)
        elif np.issubdtype(array.dtype, int):
            array = array.astype(np.int32)
        result[key] = array
    return result


def _for_env(runner: Any, actions: np.ndarray) -> np.ndarray:
    """``NormalizeAndClipActions`` over the batch (elementwise, so equal to RLlib's per-env
    calls): unsquash with ``normalize_actions``, else clip with ``clip_actions``; RLlib's two
    functions return new arrays. Both leave a non-``Box`` space's actions as they are. The env
    never gets the array the episodes keep (RLlib hands it a deep copy)."""
    config, space = runner.config, runner.env.single_action_space
    for_env = actions
    if isinstance(space, gym.spaces.Box):
        if config.normalize_actions:
            for_env = np.asarray(unsquash_action(actions, space))
        elif config.clip_actions:
            for_env = np.asarray(clip_action(actions, space))
    return actions.copy() if for_env is actions else for_env
