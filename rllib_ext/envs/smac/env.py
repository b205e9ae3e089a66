"""``SMACEnv``: SMAC / SMACv2 / SMAX as an RLlib ``MultiAgentEnv`` (new API stack).

Per agent (``agent_0`` ... ``agent_{N-1}``, stable across episodes):

* observation ``Dict({"observations": Box(obs_dim), "action_mask": Box(0, 1, (A,)),
  "state": Box(state_dim)})``, all ``float32``; ``"state"`` (the global state, for a central
  critic) only with ``include_state=True``; with ``state_mode="agent_specific"`` it is the
  global state followed by the agent's one-hot id, ``Box(state_dim + N)``; with
  ``obs_agent_id=True`` the one-hot id also follows the observation, ``Box(obs_dim + N)``;
* action ``Discrete(A)``. ``action_space.sample()`` draws among the agent's currently legal
  actions, so RLlib's env checker and random policies never send illegal ones.

Dead agents (one rule for every backend and both views): they stay in the episode until it
ends, receive observations (zeros) and the team reward, and their only legal action is the
no-op (SMAC: 0 "no-op"; SMAX: 4 "stop"). RLlib therefore always sees all ``N`` agents.

Episode end: a decided battle sets ``terminateds[...]``; the time limit (and a StarCraft II
crash) sets ``truncateds[...]`` instead, so GAE bootstraps from the final observation. Both
dicts carry ``"__all__"``.

``info`` of every agent after every step: ``battle_won``, ``dead_allies``, ``dead_enemies``,
``episode_limit`` (the step hit the time limit), ``sc2_crashed`` (StarCraft II crashed in this
step) and ``sc2_restarts`` (game restarts since the previous episode ended).
:class:`rllib_ext.envs.smac.SMACMetricsCallback` turns them into ``env_runners/rllib_ext/win_rate`` etc.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.utils.annotations import override

from rllib_ext.envs.smac import backend as arrays
from rllib_ext.envs.smac.backend import Backend, Step, check_actions
from rllib_ext.envs.smac.factory import make_backend
from rllib_ext.envs.smac.settings import SMACEnvSettings

__all__ = ["MaskedDiscrete", "SMACEnv", "agent_observation_space"]

logger = logging.getLogger(__name__)


class MaskedDiscrete(gym.spaces.Discrete):
    """``Discrete(n)`` whose ``sample()`` without a mask draws only currently legal actions.

    ``mask_fn`` returns the agent's current ``int8`` mask (or ``None`` before the first reset).
    It is dropped when the space is pickled (e.g. into an RLModule spec); the copy then samples
    like a plain ``Discrete``. Equality with ``Discrete(n)`` is unchanged.
    """

    def __init__(
        self, n: int, *, mask_fn: Callable[[], np.ndarray | None] | None = None, seed: Any = None
    ) -> None:
        super().__init__(n, seed=seed)
        self._mask_fn = mask_fn

    @override(gym.spaces.Discrete)
    def sample(
        self, mask: np.ndarray | None = None, probability: np.ndarray | None = None
    ) -> np.int64:
        if mask is None and probability is None and self._mask_fn is not None:
            mask = self._mask_fn()
        return super().sample(mask=mask, probability=probability)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mask_fn"] = None
        return state


def agent_observation_space(spec: Any, settings: SMACEnvSettings) -> gym.spaces.Dict:
    """One agent's observation space: ``observations`` (obs_dim,) (``obs_dim + n_agents`` with
    ``settings.obs_agent_id``), ``action_mask`` (n_actions,) of 0/1 and, with
    ``settings.include_state``, ``state``: (state_dim,) for ``state_mode="global"``,
    (state_dim + n_agents,) for ``"agent_specific"``; float32."""
    unbounded = np.float32(np.inf)
    obs_dim = spec.obs_dim + (spec.n_agents if settings.obs_agent_id else 0)
    components: dict[str, gym.Space] = {
        "observations": gym.spaces.Box(-unbounded, unbounded, (obs_dim,), np.float32),
        "action_mask": gym.spaces.Box(0.0, 1.0, (spec.n_actions,), np.float32),
    }
    if settings.include_state:
        agent_specific = settings.state_mode == "agent_specific"
        state_dim = spec.state_dim + (spec.n_agents if agent_specific else 0)
        components["state"] = gym.spaces.Box(-unbounded, unbounded, (state_dim,), np.float32)
    return gym.spaces.Dict(components)


class SMACEnv(MultiAgentEnv):
    """The SMAC battle as an RLlib multi-agent env; see the module docstring for the contract.

    Args:
        config: the ``env_config`` (a dict or RLlib ``EnvContext``), read by
            :class:`rllib_ext.envs.smac.SMACEnvSettings`.

    Raises:
        ValueError: unknown ``env_config`` key, unknown backend, or a map the backend lacks.
        ImportError: the backend's package / game is not installed (with the steps to fix).
    """

    rllib_ext_smac_env: ClassVar[bool] = True
    """:data:`rllib_ext.envs.names.SMAC_ENV_MARK`: rllib_ext's SMAC env (subclasses too)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.settings = SMACEnvSettings.from_env_config(config)
        seed = arrays.derive_seed(
            self.settings.seed,
            # An EnvContext outside Ray (e.g. a local EnvRunner) may hold None here.
            int(getattr(config, "worker_index", 0) or 0),
            int(getattr(config, "vector_index", 0) or 0),
        )
        self.backend: Backend = make_backend(self.settings, seed)
        spec = self.backend.spec
        self.possible_agents = [f"agent_{i}" for i in range(spec.n_agents)]
        self.agents = list(self.possible_agents)
        observation_space = agent_observation_space(spec, self.settings)
        self.observation_spaces = dict.fromkeys(self.possible_agents, observation_space)
        self_ref = weakref.ref(self)
        self.action_spaces = {
            agent: MaskedDiscrete(spec.n_actions, mask_fn=_mask_getter(self_ref, i))
            for i, agent in enumerate(self.possible_agents)
        }
        self._reward_scale = 1.0 if self.settings.reward_mode == "copy" else 1.0 / spec.n_agents
        self._last: Step | None = None
        self._done = True
        self._restarts_reported = 0

    @property
    def env_info(self) -> dict[str, Any]:
        """SMAC-style ``get_env_info()`` plus the backend that runs."""
        spec = self.backend.spec
        return {
            "backend": spec.backend,
            "map_name": spec.map_name,
            "n_agents": spec.n_agents,
            "n_enemies": spec.n_enemies,
            "n_actions": spec.n_actions,
            "obs_shape": spec.obs_dim,
            "state_shape": spec.state_dim,
            "episode_limit": spec.episode_limit,
            "no_op_action": spec.no_op_action,
        }

    def global_state(self) -> np.ndarray | None:
        """``float32 [state_dim]`` global state of the current observation."""
        return None if self._last is None else self._last.state

    def _observations(self, step: Step) -> dict[str, dict[str, np.ndarray]]:
        obs = arrays.agent_observations(step.obs, obs_agent_id=self.settings.obs_agent_id)
        avail = step.avail
        if self.settings.include_state:
            states = arrays.agent_states(
                step.state, len(self.possible_agents), state_mode=self.settings.state_mode
            )
            return {
                agent: {"observations": obs[i], "action_mask": avail[i], "state": states[i]}
                for i, agent in enumerate(self.possible_agents)
            }
        return {
            agent: {"observations": obs[i], "action_mask": avail[i]}
            for i, agent in enumerate(self.possible_agents)
        }

    @override(MultiAgentEnv)
    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self._last = self.backend.reset(seed)
        self._done = False
        self.agents = list(self.possible_agents)
        return self._observations(self._last), {agent: {} for agent in self.possible_agents}

    def _action_list(self, action_dict: Mapping[str, Any]) -> list[int]:
        try:
            actions = [operator.index(action_dict[agent]) for agent in self.possible_agents]
        except KeyError as exc:
            raise ValueError(
                f"No action for {exc.args[0]!r}. Every agent acts every step (dead agents send "
                f"the no-op {self.backend.spec.no_op_action}); expected keys: "
                f"{self.possible_agents}."
            ) from None
        except TypeError:
            raise ValueError(
                f"Actions must be one integer per agent, got {dict(action_dict)!r}. "
                f"Fix: pass ints in 0..{self.backend.spec.n_actions - 1}."
            ) from None
        if len(action_dict) != len(actions):
            extra = sorted(set(action_dict) - set(self.possible_agents), key=str)
            raise ValueError(f"Unknown agent id(s) {extra}; agents are {self.possible_agents}.")
        return actions

    @override(MultiAgentEnv)
    def step(self, action_dict: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        if self._last is None or self._done:
            raise ValueError(
                "step() called on a finished episode (or before reset()). Fix: call reset()."
            )
        actions = self._action_list(action_dict)
        check_actions(actions, self._last.avail, self.possible_agents)
        step = self.backend.step(np.array(actions, dtype=np.int64))
        self._last = step
        self._done = step.terminated or step.truncated
        agents = self.possible_agents
        reward = step.reward * self._reward_scale
        rewards = dict.fromkeys(agents, reward)
        terminateds = dict.fromkeys(agents, step.terminated)
        terminateds["__all__"] = step.terminated
        truncateds = dict.fromkeys(agents, step.truncated)
        truncateds["__all__"] = step.truncated
        restarts = 0
        if self._done:
            restarts = self.backend.restarts - self._restarts_reported
            self._restarts_reported = self.backend.restarts
        info = {
            "battle_won": step.battle_won,
            "dead_allies": step.dead_allies,
            "dead_enemies": step.dead_enemies,
            "episode_limit": step.truncated and not step.crashed,
            "sc2_crashed": step.crashed,
            "sc2_restarts": restarts,
        }
        infos = {agent: dict(info) for agent in agents}
        return self._observations(step), rewards, terminateds, truncateds, infos

    @override(MultiAgentEnv)
    def close(self) -> None:
        self.backend.close()


def _mask_getter(env_ref: weakref.ref, index: int) -> Callable[[], np.ndarray | None]:
    def legal_actions() -> np.ndarray | None:
        env = env_ref()
        if env is None or env._last is None:
            return None
        return (env._last.avail[index] > 0).astype(np.int8)

    return legal_actions
