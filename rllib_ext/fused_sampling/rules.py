"""When the fused single-agent loop is exact: the one selection rule, :func:`single_agent_rule`.

The loop does what RLlib's default connector pipelines do, directly, which is exact for: the
default env-to-module / module-to-env pipelines, piece by piece of RLlib's own classes with the
flags RLlib's config gives them (plus pieces whose own class declared itself fused-equivalent,
:mod:`rllib_ext.sampling_protocol`), a vector env with gymnasium's next-step autoreset, a
stateless RLModule on the CPU, a ``Box`` observation space, a ``Box`` or ``Discrete`` action
space, no per-step episode callbacks, policy (not random) actions and numpy'd episodes. Any
dict of module outputs is handled as RLlib's pieces handle it (module-computed ``actions``,
nested extra outputs), and any ``episode_lookback_horizon``. Both sampling modes (time steps,
episodes) are covered. The rule reads the runner only: no reset, no RNG draw, no callback. The
checks every fused loop makes are in :mod:`rllib_ext.fused.rules`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rllib_ext.fused.rules import connector_mismatch, module_off_cpu, per_step_callback

__all__ = ["single_agent_rule"]


def single_agent_rule(runner: Any, *, random_actions: bool) -> str | None:
    """Why the fused loop cannot reproduce ``SingleAgentEnvRunner._sample`` for this call of
    ``runner`` (a ``SingleAgentEnvRunner``); ``None``: it can."""
    module = runner.module
    if random_actions:
        return "random actions"
    if module is None:
        return "no RLModule"
    mismatch = connector_mismatch(runner, multi_agent=False)
    if mismatch is not None:
        return mismatch
    if module.is_stateful():
        return "a stateful (recurrent) RLModule"
    off_cpu = module_off_cpu(module)
    if off_cpu is not None:
        return off_cpu
    env = runner.env
    autoreset = env.metadata.get("autoreset_mode")
    if autoreset is not None and autoreset != gym.vector.AutoresetMode.NEXT_STEP:
        return f"vector env autoreset mode {autoreset} (fused and RLlib's loop: next-step)"
    if not isinstance(env.single_observation_space, gym.spaces.Box):
        return f"observation space {type(env.single_observation_space).__name__} (fused: Box)"
    if not isinstance(env.single_action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        return f"action space {type(env.single_action_space).__name__} (fused: Box, Discrete)"
    return per_step_callback(runner)
