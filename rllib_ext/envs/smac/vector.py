"""``SMAXVectorEnv``: RLlib's ``VectorMultiAgentEnv`` view of :class:`SMAXBattles`.

Per env the contract is exactly :class:`rllib_ext.envs.smac.SMACEnv`'s (same observation dicts,
masks, global state, rewards, ``terminateds``/``truncateds`` with ``"__all__"``, ``info``), and
the vector behaves like RLlib's ``SyncVectorMultiAgentEnv`` of ``SMACEnv`` copies in its
``"next_step"`` auto-reset mode. The arrays, the compiled step and the groups of battles are
:attr:`SMAXVectorEnv.battles` (Ray-free, :mod:`rllib_ext.envs.smac.battles`); this class only
turns them into RLlib's per-env dicts and spaces, and mask-checks dict actions.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from ray.rllib.env.vector.vector_multi_agent_env import VectorMultiAgentEnv
from ray.rllib.utils.annotations import override

from rllib_ext.envs.smac.backend import check_actions
from rllib_ext.envs.smac.battles import SMAXBatch, SMAXBattles
from rllib_ext.envs.smac.env import MaskedDiscrete, agent_observation_space
from rllib_ext.envs.smac.settings import SMACEnvSettings

__all__ = ["SMAXVectorEnv"]


class SMAXVectorEnv(VectorMultiAgentEnv):
    """``num_envs`` SMAX battles as RLlib's vector env; see the module docstring.

    Args:
        env_config: the SMAC ``env_config`` (dict or RLlib ``EnvContext``); its backend must be
            ``"smax"``.
        num_envs, worker_index, num_groups: as :class:`SMAXBattles`.

    Raises:
        ValueError: as :class:`SMAXBattles`.
    """

    def __init__(
        self,
        env_config: Mapping[str, Any] | None,
        *,
        num_envs: int,
        worker_index: int = 0,
        num_groups: int | Literal["auto"] = 1,
    ) -> None:
        super().__init__()
        self.settings = SMACEnvSettings.from_env_config(env_config)
        self.battles = SMAXBattles(
            self.settings, num_envs=num_envs, worker_index=worker_index, num_groups=num_groups
        )
        """The arrays under this view (what array-speed samplers step)."""
        self.num_envs = num_envs
        spec = self.battles.spec
        self.possible_agents = [f"agent_{i}" for i in range(spec.n_agents)]
        self.agents = list(self.possible_agents)
        observation_space = agent_observation_space(spec, self.settings)
        self.single_observation_spaces: dict[str, gym.Space] = dict.fromkeys(
            self.possible_agents, observation_space
        )
        self.single_action_spaces: dict[str, gym.Space] = {
            agent: MaskedDiscrete(spec.n_actions) for agent in self.possible_agents
        }
        self.single_observation_space = gym.spaces.Dict(self.single_observation_spaces)
        self.single_action_space = gym.spaces.Dict(self.single_action_spaces)
        self.metadata = {"autoreset_mode": "next_step"}
        self.envs = [_SubEnvView(self, e) for e in range(num_envs)]
        """One read-only view per battle (spaces, agents), where RLlib's runner reads
        ``env.envs[i].unwrapped``; its action spaces sample that battle's legal actions."""

    def get_action_space(self, agent_id: str) -> gym.Space:
        return self.single_action_spaces[agent_id]

    def get_observation_space(self, agent_id: str) -> gym.Space:
        return self.single_observation_spaces[agent_id]

    # ------------------------------------------------------------------ RLlib dict API
    def _observations(self, batch: SMAXBatch) -> list[dict[str, dict[str, np.ndarray]]]:
        obs, avail = batch.obs, batch.avail
        agents = self.possible_agents
        states = self.battles.agent_states(batch)
        if states is not None:
            return [
                {
                    agent: {
                        "observations": obs[e, i],
                        "action_mask": avail[e, i],
                        "state": states[e, i],
                    }
                    for i, agent in enumerate(agents)
                }
                for e in range(self.num_envs)
            ]
        return [
            {
                agent: {"observations": obs[e, i], "action_mask": avail[e, i]}
                for i, agent in enumerate(agents)
            }
            for e in range(self.num_envs)
        ]

    @override(VectorMultiAgentEnv)
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        batch = self.battles.reset_arrays(seed=seed)
        infos: list[dict[str, Any]] = [
            {agent: {} for agent in self.possible_agents} for _ in range(self.num_envs)
        ]
        return self._observations(batch), infos

    def _action_array(self, actions: Sequence[Mapping[str, Any]]) -> np.ndarray:
        spec = self.battles.spec
        last = self.battles.last
        if last is None:
            raise ValueError("step() called before reset(). Fix: call reset() first.")
        out = np.full((self.num_envs, spec.n_agents), spec.no_op_action, dtype=np.int32)
        if len(actions) != self.num_envs:
            raise ValueError(
                f"Got {len(actions)} action dicts for num_envs={self.num_envs}. Fix: pass one "
                "dict per env (RLlib's MultiAgentEnvRunner does)."
            )
        for e, action_dict in enumerate(actions):
            if self.battles.autoreset[e]:
                continue  # this env resets in this call; its actions are ignored
            try:
                row = [int(action_dict[agent]) for agent in self.possible_agents]
            except KeyError as exc:
                raise ValueError(
                    f"No action for {exc.args[0]!r} in env {e}. Every agent acts every step "
                    f"(dead agents send the no-op {spec.no_op_action}); expected keys: "
                    f"{self.possible_agents}."
                ) from None
            check_actions(row, last.avail[e], self.possible_agents)
            out[e] = row
        return out

    @override(VectorMultiAgentEnv)
    def step(self, actions: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
        battles = self.battles
        batch = battles.step_arrays(self._action_array(actions))
        agents = self.possible_agents
        rewards: list[dict[str, float]] = []
        terminateds: list[dict[str, bool]] = []
        truncateds: list[dict[str, bool]] = []
        infos: list[dict[str, Any]] = []
        for e in range(self.num_envs):
            if batch.was_reset[e]:
                rewards.append(dict.fromkeys(agents, 0.0))
                terminateds.append({**dict.fromkeys(agents, False), "__all__": False})
                truncateds.append({**dict.fromkeys(agents, False), "__all__": False})
                infos.append({agent: {} for agent in agents})
                continue
            # float32 -> Python float first, then the scale: SMACEnv's arithmetic.
            rewards.append(dict.fromkeys(agents, float(batch.reward[e]) * battles.reward_scale))
            term, trunc = bool(batch.terminated[e]), bool(batch.truncated[e])
            terminateds.append({**dict.fromkeys(agents, term), "__all__": term})
            truncateds.append({**dict.fromkeys(agents, trunc), "__all__": trunc})
            info = battles.step_info(batch, e)
            infos.append({agent: dict(info) for agent in agents})
        return self._observations(batch), rewards, terminateds, truncateds, infos

    @override(VectorMultiAgentEnv)
    def close_extras(self, **kwargs: Any) -> None:
        # Also runs (from gymnasium's __del__) for an env whose __init__ raised.
        battles = getattr(self, "battles", None)
        if battles is not None:
            battles.close()


class _SubEnvView:
    """Battle ``index`` of a :class:`SMAXVectorEnv` as RLlib's runner inspects a sub-env."""

    def __init__(self, vector: SMAXVectorEnv, index: int) -> None:
        self.possible_agents = vector.possible_agents
        self.agents = vector.possible_agents
        self.observation_spaces = vector.single_observation_spaces
        vector_ref = weakref.ref(vector)
        self.action_spaces = {
            agent: MaskedDiscrete(
                vector.battles.spec.n_actions, mask_fn=_mask_getter(vector_ref, index, i)
            )
            for i, agent in enumerate(vector.possible_agents)
        }

    @property
    def unwrapped(self) -> _SubEnvView:
        return self

    def get_observation_space(self, agent_id: str) -> gym.Space:
        return self.observation_spaces[agent_id]

    def get_action_space(self, agent_id: str) -> gym.Space:
        return self.action_spaces[agent_id]


def _mask_getter(vector_ref: weakref.ref, env_index: int, agent_index: int) -> Any:
    def legal_actions() -> np.ndarray | None:
        vector = vector_ref()
        last = None if vector is None else vector.battles.last
        if last is None:
            return None
        return (last.avail[env_index, agent_index] > 0).astype(np.int8)

    return legal_actions
