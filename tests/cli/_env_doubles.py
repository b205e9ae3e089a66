"""Test doubles for env-fault, input-path and --callbacks tests: small CartPole variants and a
user callback (:class:`MarkResults`).

Importing this module registers ``FlakyCartPole-v0`` with gymnasium, so
``--env tests.cli._env_doubles:FlakyCartPole-v0`` exercises the ``module:EnvId`` form.
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.env.multi_agent_env import MultiAgentEnv

__all__ = ["FlakyCartPole", "MarkResults", "NaNRewardCartPole", "TwoCartPoles"]


class _CartPole(gym.Env):
    """CartPole-v1 behind a plain ``gym.Env`` (``gym.make`` needs an Env class entry point)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        return self.env.step(action)


class FlakyCartPole(_CartPole):
    """CartPole whose ``step()`` raises with probability ``p_crash`` (env_config, default 1 %)."""

    def __init__(self, env_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {**(env_config or {}), **kwargs}
        super().__init__()
        self._p_crash = float(config.get("p_crash", 0.01))
        self._rng = random.Random(config.get("seed"))

    def step(self, action: Any) -> Any:
        if self._rng.random() < self._p_crash:
            raise RuntimeError("FlakyCartPole: simulated env crash")
        return self.env.step(action)


class NaNRewardCartPole(_CartPole):
    """CartPole whose reward is nan on step ``nan_at_step`` (default 5) of every
    ``nan_every``-th episode (default 2: the 2nd, 4th, ...)."""

    def __init__(self, env_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {**(env_config or {}), **kwargs}
        super().__init__()
        self._nan_at = int(config.get("nan_at_step", 5))
        self._nan_every = int(config.get("nan_every", 2))
        self._t = 0
        self._episode = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self._t = 0
        self._episode += 1
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self._t += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._t == self._nan_at and self._episode % self._nan_every == 0:
            reward = float("nan")
        return obs, reward, terminated, truncated, info


class TwoCartPoles(MultiAgentEnv):
    """Two independent CartPoles as agents ``a0``/``a1`` (for the ``pkg.module.Class`` form)."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._envs = {f"a{i}": gym.make("CartPole-v1") for i in range(2)}
        self.agents = self.possible_agents = list(self._envs)
        self.observation_spaces = {a: e.observation_space for a, e in self._envs.items()}
        self.action_spaces = {a: e.action_space for a, e in self._envs.items()}
        self._done: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self._done = set()
        obs = {a: e.reset(seed=seed)[0] for a, e in self._envs.items()}
        return obs, {a: {} for a in obs}

    def step(self, actions: dict[str, Any]) -> Any:
        obs, rew, term, trunc = {}, {}, {}, {}
        for agent, action in actions.items():
            o, r, te, tr, _ = self._envs[agent].step(action)
            obs[agent], rew[agent], term[agent], trunc[agent] = o, r, te, tr
            if te or tr:
                self._done.add(agent)
        term["__all__"] = len(self._done) == len(self._envs)
        trunc["__all__"] = False
        return obs, rew, term, trunc, {a: {} for a in obs}


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)


class MarkResults(RLlibCallback):
    """A user callback for ``--callbacks``: marks every training result."""

    def on_train_result(self, *, result: dict, **kwargs: Any) -> None:
        result["marked_by_user_callback"] = 1
