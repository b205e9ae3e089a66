"""The fused SMAX loop's policy step: one forward over all agents of a group of battles.

What RLlib's default pipelines around the module do, directly: ``[E * N]`` rows of
observations / masks / states as CPU tensors (``AddObservationsFromEpisodesToBatch`` ...
``NumpyToTensor``), a ``T=1`` axis and ``STATE_IN`` for recurrent modules
(``AddTimeDimToBatchAndZeroPad`` / ``AddStatesFromEpisodesToBatch``), then ``GetActions`` /
``TensorToNumpy`` / ``RemoveSingleTsTimeRankFromBatch`` on the outputs, cast to float32 first
(``amp_inference``'s ``CastToFloat32``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import tree
from ray.rllib.core.columns import Columns
from ray.rllib.utils.metrics import RLMODULE_INFERENCE_TIMER
from ray.rllib.utils.numpy import convert_to_numpy

from rllib_ext import _rllib_private as private
from rllib_ext.env_runners import to_float32
from rllib_ext.envs.smac.battles import SMAXBatch
from rllib_ext.envs.smac.sampling.tracks import ActionRecord
from rllib_ext.fused.rules import UnfusedModuleOutputs
from rllib_ext.sampling_protocol import sample_phase

__all__ = ["FUSED_MODULE_OUTPUTS", "initial_state_rows", "policy_step", "probe_outputs"]

FUSED_MODULE_OUTPUTS = frozenset({Columns.ACTION_DIST_INPUTS, Columns.STATE_OUT})
"""What the fused loop turns into episode data (RLlib's loop keeps any other output too)."""


def policy_step(
    runner: Any,
    module_id: str,
    batch: SMAXBatch,
    states: np.ndarray | None,
    recurrent_state: Any,
    *,
    explore: bool,
    env_ts: int,
) -> ActionRecord:
    """Actions for ``batch`` (``E`` battles, ``N`` agents) from ``runner.module[module_id]``.

    ``states``: the agents' ``"state"`` entries ``[E, N, D]`` or ``None``; ``recurrent_state``:
    the ``STATE_IN`` rows ``[E * N, ...]`` of a stateful module (else ``None``); ``env_ts``: env
    steps already taken in this call (RLlib's exploration timestep estimate).

    Raises:
        UnfusedModuleOutputs: the module returns more than :data:`FUSED_MODULE_OUTPUTS`.
    """
    rl_module = runner.module[module_id]
    n_envs, n_agents = batch.obs.shape[:2]
    rows = n_envs * n_agents
    obs = {
        "observations": torch.from_numpy(batch.obs.reshape(rows, -1)),
        "action_mask": torch.from_numpy(batch.avail.reshape(rows, -1)),
    }
    if states is not None:
        obs["state"] = torch.from_numpy(states.reshape(rows, -1))
    module_inputs: dict[str, Any] = {Columns.OBS: obs}
    stateful = rl_module.is_stateful()
    if stateful:
        module_inputs[Columns.OBS] = {k: v.unsqueeze(1) for k, v in obs.items()}
        module_inputs[Columns.STATE_IN] = tree.map_structure(torch.from_numpy, recurrent_state)
    module_batch = {module_id: module_inputs}
    dist_cls = (
        rl_module.get_exploration_action_dist_cls()
        if explore
        else rl_module.get_inference_action_dist_cls()
    )
    with runner.metrics.log_time(RLMODULE_INFERENCE_TIMER), sample_phase(runner, "inference"):
        if explore:
            # RLlib's global step estimate (for exploration schedules).
            runners = runner.config.num_env_runners or 1
            t = (runner.num_env_steps_sampled_lifetime // runners + env_ts) * runners
            out = runner.module.forward_exploration(module_batch, t=t)
        else:
            out = runner.module.forward_inference(module_batch)
        module_out = to_float32(out[module_id])
        extra = module_out.keys() - FUSED_MODULE_OUTPUTS
        if extra:  # RLlib would keep them in the episodes; this loop has no place for them
            raise UnfusedModuleOutputs(
                f"the RLModule also outputs {sorted(extra)} (the fused SMAX loop records "
                f"{sorted(FUSED_MODULE_OUTPUTS)} only). Fix: fused_sampling=False."
            )
        logits = module_out[Columns.ACTION_DIST_INPUTS]
        if stateful:
            logits = logits[:, 0]
        dist = dist_cls.from_logits(logits)
        if not explore:
            dist = dist.to_deterministic()
        actions = dist.sample()
        logp = dist.logp(actions)
    # RLlib's TensorToNumpy piece: the same conversion (int64 -> int32, float -> float32).
    actions_np, logp_np, logits_np = convert_to_numpy((actions, logp, logits))
    return ActionRecord(
        actions=actions_np.reshape(n_envs, n_agents),
        logp=logp_np.reshape(n_envs, n_agents),
        logits=logits_np.reshape(n_envs, n_agents, -1),
        state_out=convert_to_numpy(module_out[Columns.STATE_OUT]) if stateful else None,
        weights_seq_no=private.weights_seq_no(runner),
    )


def probe_outputs(runner: Any, module_id: str, *, explore: bool) -> set[str]:
    """The output columns of ``runner.module[module_id]`` for one battle's agents, from a dry
    forward on a placeholder batch (zero observations and states, every action available), so
    the rule decides before any side effect: torch's, numpy's and Python's global RNG states
    are restored afterwards, no metric is logged and the envs are not touched."""
    rl_module = runner.module[module_id]
    vector = runner.vector_env
    agents = vector.possible_agents
    space = vector.single_observation_spaces[agents[0]]
    obs = {
        key: torch.from_numpy(
            (np.ones if key == "action_mask" else np.zeros)(
                (len(agents), *box.shape), dtype=box.dtype
            )
        )
        for key, box in space.spaces.items()
    }
    inputs: dict[str, Any] = {Columns.OBS: obs}
    if rl_module.is_stateful():
        inputs[Columns.OBS] = {k: v.unsqueeze(1) for k, v in obs.items()}
        state = initial_state_rows(rl_module, np.ones(len(agents), dtype=bool), None)
        inputs[Columns.STATE_IN] = tree.map_structure(torch.from_numpy, state)
    np_state, py_state = np.random.get_state(), random.getstate()
    was_training = rl_module.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            rl_module.eval()
            if explore:
                out = runner.module.forward_exploration({module_id: inputs}, t=0)
            else:
                out = runner.module.forward_inference({module_id: inputs})
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
        rl_module.train(was_training)
    return set(out[module_id].keys())


def initial_state_rows(rl_module: Any, reset_rows: np.ndarray, state: Any) -> Any:
    """``state`` (a (nested) dict of ``[R, ...]`` arrays, or ``None``) with the rows in
    ``reset_rows`` (``bool [R]``) set to the module's initial state (all rows when ``None``)."""
    if state is not None and not reset_rows.any():
        return state
    initial = convert_to_numpy(rl_module.get_initial_state())
    if state is None:
        return tree.map_structure(
            lambda x: np.repeat(np.asarray(x)[None], reset_rows.shape[0], axis=0), initial
        )

    def reset(x: np.ndarray, init: Any) -> np.ndarray:
        x = np.array(x)  # writable copy (torch outputs may share memory)
        x[reset_rows] = init
        return x

    return tree.map_structure(reset, state, initial)
