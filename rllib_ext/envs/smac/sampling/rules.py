"""When the fused SMAX loop is exact: the one selection rule, :func:`smax_rule`.

The loop does what RLlib's default connector pieces would do, directly, which is exact only for:
the default env-to-module / module-to-env pipelines (plus pieces that declared themselves
fused-equivalent, :mod:`rllib_ext.sampling_protocol`), one module for all agents, on the CPU,
returning only :data:`FUSED_MODULE_OUTPUTS` (found by a dry forward before the call:
:func:`~.policy.probe_outputs`), no per-step episode callbacks, time-step sampling counted in
env steps, the default one-step ``episode_lookback_horizon`` and numpy'd episodes. Pieces are
compared by exact class and flags, with the checks every fused loop makes
(:mod:`rllib_ext.fused.rules`). The rule runs before any side effect: no reset, no RNG draw
(the dry forward restores them), no callback.
"""

from __future__ import annotations

from typing import Any

from rllib_ext.envs.smac.sampling.policy import FUSED_MODULE_OUTPUTS, probe_outputs
from rllib_ext.fused.rules import connector_mismatch, module_off_cpu, per_step_callback

__all__ = ["FUSED_MODULE_OUTPUTS", "smax_rule"]


def smax_rule(
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
    mismatch = connector_mismatch(runner, multi_agent=True)
    if mismatch is not None:
        return mismatch
    if config.episode_lookback_horizon != 1:
        # EnvTrack.continuation keeps one step of lookback, as RLlib's default cut does.
        return f"episode_lookback_horizon={config.episode_lookback_horizon} (fused: 1)"
    if len(runner.module) != 1:
        return "more than one RLModule"
    for rl_module in runner.module.values():
        off_cpu = module_off_cpu(rl_module)
        if off_cpu is not None:
            return off_cpu
    callback = per_step_callback(runner)
    if callback is not None:
        return callback
    module_id = next(iter(runner.module.keys()))
    explore = config.explore if explore is None else explore
    extra = probe_outputs(runner, module_id, explore=explore) - FUSED_MODULE_OUTPUTS
    if extra:  # RLlib would keep them in the episodes; this loop has no place for them
        return f"the RLModule also outputs {sorted(extra)}"
    return None
