"""The fused single-agent loop's policy step: one forward over all envs, then RLlib's actions.

What RLlib's default pipelines around the module do, directly and batched: the envs' last
observations ``[N, ...]`` as a tensor (``BatchIndividualItems`` + ``NumpyToTensor``: RLlib's own
``convert_to_torch_tensor``), the forward, then ``GetActions`` (sample, or the deterministic
action for ``explore=False``, and its log-probability; nothing where the module computed
``actions`` itself), ``TensorToNumpy`` (RLlib's ``convert_to_numpy``) and
``NormalizeAndClipActions`` (RLlib's ``unsquash_action`` / ``clip_action`` over the batch, else
the module's own ``actions_for_env``). Outputs are cast to float32 first (``amp_inference``).
The step's two connector passes are timed (two clock reads each) for RLlib's connector timers.
"""

from __future__ import annotations

from time import perf_counter
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
from rllib_ext.sampling_protocol import sample_phase

__all__ = ["ActionStep", "act"]


class ActionStep(NamedTuple):
    """The policy's step for ``N`` envs: ``actions`` (what episodes store, ``[N, ...]``),
    ``actions_for_env`` (unsquashed or clipped, what the env gets), ``extra`` (every other
    column RLlib's loop stores per step: the module's outputs and ``action_logp``, each
    ``[N, ...]`` or a nested dict of those) under the weights ``weights_seq_no``;
    ``to_module_s`` / ``to_env_s``: seconds spent on what RLlib's env-to-module and
    module-to-env pipelines do."""

    actions: np.ndarray
    actions_for_env: np.ndarray
    extra: dict[str, Any]
    weights_seq_no: int
    to_module_s: float
    to_env_s: float


def act(runner: Any, observations: np.ndarray, *, explore: bool, env_ts: int) -> ActionStep:
    """Actions for the envs' last ``observations`` (``[N, ...]``) from ``runner.module``, which
    the caller put in eval mode (as RLlib's public forwards do around each call).

    ``env_ts``: env steps already taken in this call (RLlib's exploration timestep estimate).
    """
    module = runner.module
    start = perf_counter()
    obs = torch.from_numpy(np.asarray(observations))
    if obs.is_floating_point() and obs.dtype != torch.float16:  # as NumpyToTensor converts
        obs = obs.float()
    batch = {Columns.OBS: obs}
    runners = runner.config.num_env_runners or 1
    t = (runner.num_env_steps_sampled_lifetime // runners + env_ts) * runners
    to_module_s = perf_counter() - start
    with runner.metrics.log_time(RLMODULE_INFERENCE_TIMER), sample_phase(runner, "inference"):
        out = private.module_forward_in_eval_mode(module, batch, explore=explore, t=t)
    # What RLlib's module-to-env pieces do (GetActions, TensorToNumpy, NormalizeAndClipActions):
    # a profiler counts it as "connectors".
    start = perf_counter()
    with sample_phase(runner, "connectors"):
        actions, for_env, extra = _actions(runner, module, out, explore=explore)
    return ActionStep(
        actions=actions,
        actions_for_env=for_env,
        extra=extra,
        weights_seq_no=private.weights_seq_no(runner),
        to_module_s=to_module_s,
        to_env_s=perf_counter() - start,
    )


def _actions(
    runner: Any, module: Any, out: Any, *, explore: bool
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``(actions, actions_for_env, extra)`` from the module's outputs ``out``: ``GetActions``,
    ``TensorToNumpy`` and ``NormalizeAndClipActions`` over the batch, outputs cast to float32
    first."""
    out = dict(to_float32(out))
    if Columns.ACTIONS not in out:  # GetActions: a module's own actions stand as they are
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
    own_for_env = extra.pop(Columns.ACTIONS_FOR_ENV, None)  # RLlib's loop never stores it
    return actions_np, _for_env(runner, actions_np, own_for_env), extra


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


def _for_env(runner: Any, actions: np.ndarray, own_for_env: Any) -> np.ndarray:
    """``NormalizeAndClipActions`` over the batch (elementwise, so equal to RLlib's per-env
    calls): unsquash with ``normalize_actions``, else clip with ``clip_actions``; RLlib's two
    functions return new arrays. Both leave a non-``Box`` space's actions as they are. The env
    never gets the array the episodes keep (RLlib hands it a deep copy). With neither flag the
    module's own ``actions_for_env`` (``own_for_env``), where it gave one, goes to the env."""
    config, space = runner.config, runner.env.single_action_space
    if not (config.normalize_actions or config.clip_actions) and own_for_env is not None:
        return np.asarray(own_for_env)
    for_env = actions
    if isinstance(space, gym.spaces.Box):
        if config.normalize_actions:
            for_env = np.asarray(unsquash_action(actions, space))
        elif config.clip_actions:
            for_env = np.asarray(clip_action(actions, space))
    return actions.copy() if for_env is actions else for_env
