"""PettingZoo view of the SMAC env: ``parallel_env(**env_config) -> pettingzoo.ParallelEnv``.

It is a thin view over :class:`rllib_ext.envs.smac.SMACEnv` (same backends, same dead-agent
rule, same ``info``), translated to PettingZoo's semantics:

* ``agents`` holds every agent while the battle runs (dead agents stay, with only the no-op
  legal); when the episode ends every agent is terminated (battle decided) or truncated
  (time limit / crash) and ``agents`` becomes empty;
* no ``"__all__"`` keys;
* ``obs[agent]["action_mask"]`` is ``int8``, PettingZoo's convention (so
  ``action_space(agent).sample(mask=obs[agent]["action_mask"])`` works); the RLlib view uses
  ``float32`` as RLlib's masking modules expect;
* ``state()`` / ``state_space`` give the global state.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv
from ray.rllib.utils.annotations import override

from rllib_ext.envs.smac.env import SMACEnv

__all__ = ["SMACParallelEnv", "parallel_env"]


class SMACParallelEnv(ParallelEnv):
    """SMAC battles as a PettingZoo ``ParallelEnv``; ``env_config`` as for ``SMACEnv``."""

    metadata = {"name": "smac_rllib_ext", "render_modes": [], "is_parallelizable": True}

    def __init__(self, env_config: dict[str, Any] | None = None, render_mode: None = None) -> None:
        if render_mode is not None:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported (allowed: None). "
                "Fix: StarCraft II replays go through sc2_options={'replay_dir': ...}."
            )
        self.render_mode = render_mode
        self._env = SMACEnv(env_config)
        info = self._env.env_info
        self.possible_agents = list(self._env.possible_agents)
        self.agents: list[str] = []
        rllib_space = self._env.observation_spaces[self.possible_agents[0]]
        components = dict(rllib_space.spaces)
        components["action_mask"] = gym.spaces.Box(0, 1, (info["n_actions"],), np.int8)
        self._observation_spaces = {
            agent: gym.spaces.Dict(components) for agent in self.possible_agents
        }
        self._action_spaces: dict[str, gym.spaces.Discrete] = {
            agent: gym.spaces.Discrete(info["n_actions"]) for agent in self.possible_agents
        }
        self.state_space = gym.spaces.Box(-np.inf, np.inf, (info["state_shape"],), np.float32)

    @property
    def env_info(self) -> dict[str, Any]:
        """Sizes, backend and map (see ``SMACEnv.env_info``)."""
        return self._env.env_info

    @override(ParallelEnv)
    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_spaces[agent]

    @override(ParallelEnv)
    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    @staticmethod
    def _convert(obs: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
        return {
            agent: {**o, "action_mask": o["action_mask"].astype(np.int8)}
            for agent, o in obs.items()
        }

    @override(ParallelEnv)
    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            for i, agent in enumerate(self.possible_agents):
                self._action_spaces[agent].seed(seed + i)
        obs, infos = self._env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return self._convert(obs), infos

    @override(ParallelEnv)
    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        if not self.agents:
            raise ValueError("step() called with no live agents (episode over). Fix: reset().")
        obs, rewards, terminations, truncations, infos = self._env.step(actions)
        terminations.pop("__all__")
        truncations.pop("__all__")
        if any(terminations.values()) or any(truncations.values()):
            self.agents = []
        return self._convert(obs), rewards, terminations, truncations, infos

    @override(ParallelEnv)
    def state(self) -> np.ndarray:
        state = self._env.global_state()
        if state is None:
            raise ValueError("state() before reset(). Fix: call reset() first.")
        return state

    @override(ParallelEnv)
    def render(self) -> None:
        return None

    @override(ParallelEnv)
    def close(self) -> None:
        self._env.close()


def parallel_env(render_mode: None = None, **env_config: Any) -> SMACParallelEnv:
    """PettingZoo constructor: ``parallel_env(map_name="3m", backend="smax")``."""
    return SMACParallelEnv(env_config, render_mode=render_mode)
