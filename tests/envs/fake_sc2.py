"""TEST STAND-IN for StarCraft II: a tiny battle behind SMAC's documented Python API.

This is NOT StarCraft II and not SMAC. It exists so that the StarCraft II code path of
:mod:`rllib_ext.envs.smac` (``backend="smacv2"``/``"smac"``) can be tested on machines without
the game. It follows the API of ``smac``/``smacv2``'s ``StarCraft2Env`` as documented in
oxwhirl/smac and oxwhirl/smacv2 (constructor keywords, return values, action layout, sizes):

* ``reset() -> (obs_list, state)``; ``step(actions) -> (reward, terminated, info)`` with
  ``info = {"battle_won", "dead_allies", "dead_enemies"}`` and ``info["episode_limit"] = True``
  at the time limit only when ``continuing_episode=True`` (otherwise just ``terminated``);
* ``get_obs()``, ``get_obs_agent(i)``, ``get_state()``, ``get_avail_actions()``,
  ``get_avail_agent_actions(i)``, ``get_total_actions()``, ``get_obs_size()``,
  ``get_state_size()``, ``get_env_info()``, ``get_stats()``, ``full_restart()``, ``close()``;
* actions: 0 no-op (the only legal action of a dead agent), 1 stop, 2-5 move N/S/E/W, then
  attack enemy ``j``; ``step`` asserts every action is available, like SMAC does;
* obs/state sizes follow SMAC's default flags (3m: obs 30, state 48; 3s5z_vs_3s6z: 136, 230).

Failure injection (a keyword SMAC does not have, for tests): ``faults=FakeFaults(...)``, one
plan shared by every game a test (or an env runner) creates, so it survives game restarts:
``crash_at_steps`` makes ``step`` behave like SMAC after a protocol error (relaunch, return
``0, True, {}``); ``raise_at_steps`` makes ``step`` raise :class:`FakeProtocolError` (an error
escaping SMAC); ``fail_resets`` makes that many ``reset()`` calls raise
:class:`FakeConnectionError`. Step numbers count all steps of the plan, across games.
:class:`FakeCapabilityEnvWrapper` mimics SMACv2's ``StarCraftCapabilityEnvWrapper``, including
``reset()`` returning ``None`` after a retried failed reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "FAKE_MAPS",
    "FakeCapabilityEnvWrapper",
    "FakeConnectionError",
    "FakeFaults",
    "FakeProtocolError",
    "FakeStarCraft2Env",
]

# name: (n_agents, n_enemies, episode limit, protoss shields, unit_type_bits), from
# smacv2/env/starcraft2/maps/smac_maps.py.
FAKE_MAPS: dict[str, tuple[int, int, int, bool, int]] = {
    "3m": (3, 3, 60, False, 0),
    "8m": (8, 8, 120, False, 0),
    "2s3z": (5, 5, 120, True, 2),
    "3s5z": (8, 8, 150, True, 2),
    "3s5z_vs_3s6z": (8, 9, 170, True, 2),
    "10gen_protoss": (10, 10, 200, True, 3),
}

_N_ACTIONS_NO_ATTACK = 6
_ATTACK_RANGE = 0.45
_DAMAGE = 0.25


class FakeProtocolError(Exception):
    """Stands in for ``pysc2.lib.protocol.ProtocolError``."""


class FakeConnectionError(Exception):
    """Stands in for ``pysc2.lib.protocol.ConnectionError`` / websocket errors."""


@dataclass
class FakeFaults:
    """Failures to inject, shared by all fake games built with it (see module docstring)."""

    crash_at_steps: set[int] = field(default_factory=set)
    raise_at_steps: set[int] = field(default_factory=set)
    fail_resets: int = 0
    steps: int = 0
    """Steps taken by all games of this plan so far."""


class FakeStarCraft2Env:
    """SMAC-API stand-in (see module docstring). Keywords as ``StarCraft2Env``'s."""

    def __init__(
        self,
        map_name: str = "8m",
        *,
        seed: int | None = None,
        continuing_episode: bool = False,
        capability_config: Mapping[str, Any] | None = None,
        reward_win: float = 200.0,
        reward_death_value: float = 10.0,
        reward_scale: bool = True,
        reward_scale_rate: float = 20.0,
        faults: FakeFaults | None = None,
        **other_smac_kwargs: Any,
    ) -> None:
        if map_name not in FAKE_MAPS:
            raise ValueError(f"Unknown map {map_name!r}; fake maps: {sorted(FAKE_MAPS)}")
        n_agents, n_enemies, limit, shields, type_bits = FAKE_MAPS[map_name]
        if capability_config is not None:
            n_agents = int(capability_config.get("n_units", n_agents))
            n_enemies = int(capability_config.get("n_enemies", n_enemies))
        self.map_name = map_name
        self.n_agents, self.n_enemies, self.episode_limit = n_agents, n_enemies, limit
        self.n_actions = _N_ACTIONS_NO_ATTACK + n_enemies
        self.continuing_episode = continuing_episode
        self.other_smac_kwargs = dict(other_smac_kwargs)
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        extra = int(shields) + type_bits
        self._unit_feats = 5 + extra
        self._own_feats = 1 + extra
        self._ally_state_feats, self._enemy_state_feats = 4 + extra, 3 + extra
        self.reward_win, self.reward_death_value = reward_win, reward_death_value
        self.reward_scale, self.reward_scale_rate = reward_scale, reward_scale_rate
        self.max_reward = n_enemies * reward_death_value + reward_win + n_enemies
        self.faults = faults if faults is not None else FakeFaults()
        # Statistics, as in SMAC's get_stats(), plus what tests inspect.
        self.battles_won = self.battles_game = self.timeouts = self.force_restarts = 0
        self.launches = self.reset_calls = self.total_steps = 0
        self.closed = False
        self._launched = False
        self._episode_steps = 0
        self._ally_health = np.ones(n_agents)
        self._enemy_health = np.ones(n_enemies)
        self._ally_pos = np.zeros(n_agents)
        self._enemy_pos = np.ones(n_enemies)
        self._last_action = np.zeros((n_agents, self.n_actions))

    # -- sizes and info ---------------------------------------------------------------------
    def get_obs_size(self) -> int:
        return (
            4
            + self.n_enemies * self._unit_feats
            + (self.n_agents - 1) * self._unit_feats
            + self._own_feats
        )

    def get_state_size(self) -> int:
        return (
            self.n_agents * self._ally_state_feats
            + self.n_enemies * self._enemy_state_feats
            + self.n_agents * self.n_actions
        )

    def get_total_actions(self) -> int:
        return self.n_actions

    def get_env_info(self) -> dict[str, Any]:
        return {
            "state_shape": self.get_state_size(),
            "obs_shape": self.get_obs_size(),
            "n_actions": self.n_actions,
            "n_agents": self.n_agents,
            "episode_limit": self.episode_limit,
        }

    def get_stats(self) -> dict[str, Any]:
        return {
            "battles_won": self.battles_won,
            "battles_game": self.battles_game,
            "win_rate": self.battles_won / max(self.battles_game, 1),
            "timeouts": self.timeouts,
            "restarts": self.force_restarts,
        }

    # -- game process -----------------------------------------------------------------------
    def _launch(self) -> None:
        self.launches += 1
        self._launched = True
        self.closed = False

    def full_restart(self) -> None:
        self._launch()
        self.force_restarts += 1

    def close(self) -> None:
        self.closed = True
        self._launched = False

    def reset(self, episode_config: Mapping[str, Any] | None = None) -> tuple[list, np.ndarray]:
        self.reset_calls += 1
        if self.faults.fail_resets > 0:
            self.faults.fail_resets -= 1
            raise FakeConnectionError("fake: connection to StarCraft II lost during reset")
        if not self._launched:
            self._launch()
        self._episode_steps = 0
        self._ally_health = np.ones(self.n_agents)
        self._enemy_health = np.ones(self.n_enemies)
        self._ally_pos = self._rng.uniform(0.0, 0.1, self.n_agents)
        self._enemy_pos = self._rng.uniform(0.9, 1.0, self.n_enemies)
        self._last_action = np.zeros((self.n_agents, self.n_actions))
        return self.get_obs(), self.get_state()

    # -- rules ------------------------------------------------------------------------------
    def _in_range(self, agent_id: int) -> np.ndarray:
        return np.abs(self._enemy_pos - self._ally_pos[agent_id]) < _ATTACK_RANGE

    def get_avail_agent_actions(self, agent_id: int) -> list[int]:
        if self._ally_health[agent_id] <= 0:
            return [1] + [0] * (self.n_actions - 1)
        avail = [0, 1, 1, 1, 1, 1] + [0] * self.n_enemies
        targets = self._in_range(agent_id) & (self._enemy_health > 0)
        for j in np.flatnonzero(targets):
            avail[_N_ACTIONS_NO_ATTACK + j] = 1
        return avail

    def get_avail_actions(self) -> list[list[int]]:
        return [self.get_avail_agent_actions(i) for i in range(self.n_agents)]

    def step(self, actions: Iterable[int]) -> tuple[float, bool, dict[str, Any]]:
        if not self._launched:
            raise FakeConnectionError("fake: step() on a closed game")
        actions_int = [int(a) for a in actions]
        for agent_id, action in enumerate(actions_int):
            avail = self.get_avail_agent_actions(agent_id)
            assert avail[action] == 1, f"Agent {agent_id} cannot perform action {action}"
        self.total_steps += 1
        self.faults.steps += 1
        if self.faults.steps in self.faults.raise_at_steps:
            self._launched = False
            raise FakeProtocolError("fake: the game crashed (protocol error)")
        if self.faults.steps in self.faults.crash_at_steps:
            self.full_restart()  # what SMAC does on a protocol error ...
            return 0, True, {}  # ... and what it returns
        self._last_action = np.eye(self.n_actions)[actions_int]
        self._episode_steps += 1
        enemy_health_before = self._enemy_health.copy()
        ally_alive_before = self._ally_health > 0
        for agent_id, action in enumerate(actions_int):
            if action == 4:  # east: towards the enemy
                self._ally_pos[agent_id] += 0.1
            elif action == 5:
                self._ally_pos[agent_id] -= 0.1
            elif action >= _N_ACTIONS_NO_ATTACK:
                target = action - _N_ACTIONS_NO_ATTACK
                self._enemy_health[target] = max(0.0, self._enemy_health[target] - _DAMAGE)
        self._enemy_pos -= 0.05 * (self._enemy_health > 0)
        for j in np.flatnonzero(self._enemy_health > 0):
            in_range = (np.abs(self._ally_pos - self._enemy_pos[j]) < _ATTACK_RANGE) & (
                self._ally_health > 0
            )
            if in_range.any() and self._rng.random() < 0.5:
                victim = self._rng.choice(np.flatnonzero(in_range))
                self._ally_health[victim] = max(0.0, self._ally_health[victim] - _DAMAGE)
        dead_allies = int((self._ally_health <= 0).sum())
        dead_enemies = int((self._enemy_health <= 0).sum())
        new_kills = int(((enemy_health_before > 0) & (self._enemy_health <= 0)).sum())
        reward = float((enemy_health_before - self._enemy_health).sum() * self.n_enemies)
        reward += new_kills * self.reward_death_value
        info: dict[str, Any] = {
            "battle_won": False,
            "dead_allies": dead_allies,
            "dead_enemies": dead_enemies,
        }
        terminated = False
        if dead_enemies == self.n_enemies or dead_allies == self.n_agents:
            terminated = True
            self.battles_game += 1
            if dead_enemies == self.n_enemies and ally_alive_before.any():
                info["battle_won"] = True
                self.battles_won += 1
                reward += self.reward_win
        elif self._episode_steps >= self.episode_limit:
            terminated = True
            if self.continuing_episode:
                info["episode_limit"] = True
            self.battles_game += 1
            self.timeouts += 1
        if self.reward_scale:
            reward /= self.max_reward / self.reward_scale_rate
        return reward, terminated, info

    # -- observations -----------------------------------------------------------------------
    def get_obs_agent(self, agent_id: int) -> np.ndarray:
        obs = np.zeros(self.get_obs_size(), dtype=np.float32)
        if self._ally_health[agent_id] <= 0:
            return obs  # SMAC: dead agents observe zeros
        obs[:4] = 1.0
        offset = 4
        for j in range(self.n_enemies):
            if self._enemy_health[j] > 0:
                dist = abs(self._enemy_pos[j] - self._ally_pos[agent_id])
                obs[offset : offset + 5] = (dist < 1.0, dist, 0.0, 0.0, self._enemy_health[j])
            offset += self._unit_feats
        for i in range(self.n_agents):
            if i == agent_id:
                continue
            if self._ally_health[i] > 0:
                dist = abs(self._ally_pos[i] - self._ally_pos[agent_id])
                obs[offset : offset + 5] = (1.0, dist, 0.0, 0.0, self._ally_health[i])
            offset += self._unit_feats
        obs[offset] = self._ally_health[agent_id]
        return obs

    def get_obs(self) -> list[np.ndarray]:
        return [self.get_obs_agent(i) for i in range(self.n_agents)]

    def get_state(self) -> np.ndarray:
        state = np.zeros(self.get_state_size(), dtype=np.float32)
        ally = state[: self.n_agents * self._ally_state_feats].reshape(self.n_agents, -1)
        ally[:, 0], ally[:, 2] = self._ally_health, self._ally_pos
        start = self.n_agents * self._ally_state_feats
        enemy = state[start : start + self.n_enemies * self._enemy_state_feats]
        enemy = enemy.reshape(self.n_enemies, -1)
        enemy[:, 0], enemy[:, 1] = self._enemy_health, self._enemy_pos
        state[start + self.n_enemies * self._enemy_state_feats :] = self._last_action.ravel()
        return state

    def save_replay(self) -> None:
        pass


class FakeCapabilityEnvWrapper:
    """Mimics smacv2's ``StarCraftCapabilityEnvWrapper`` around :class:`FakeStarCraft2Env`.

    Like the real wrapper: requires ``capability_config``, delegates everything, and when the
    inner reset fails it retries by calling ``self.reset()`` *without returning its value*, so
    ``reset()`` returns ``None``. ``cannot_reset_times`` (test keyword) sets how many inner
    resets fail that way.
    """

    def __init__(self, *, cannot_reset_times: int = 0, **kwargs: Any) -> None:
        if "capability_config" not in kwargs:
            raise KeyError("capability_config")  # the real wrapper indexes kwargs the same way
        self.env = FakeStarCraft2Env(**kwargs)
        self._cannot_reset_times = cannot_reset_times

    def reset(self) -> tuple[list, np.ndarray] | None:
        try:
            if self._cannot_reset_times > 0:
                self._cannot_reset_times -= 1
                raise RuntimeError("fake CannotResetException: units did not spawn")
            return self.env.reset({})
        except RuntimeError:
            self.reset()  # smacv2's behaviour: the retry's value is dropped
            return None

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not built yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)
