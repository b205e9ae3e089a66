"""``SMAXVectorEnv``: N SMAX battles stepped by one jitted, vmapped call (RLlib ``VectorMultiAgentEnv``).

Per env the contract is exactly :class:`rllib_ext.envs.smac.SMACEnv`'s (same observation dicts,
masks, global state, rewards, ``terminateds``/``truncateds`` with ``"__all__"``, ``info``), and
the vector behaves like RLlib's ``SyncVectorMultiAgentEnv`` of ``SMACEnv`` copies in its
``"next_step"`` auto-reset mode: the call after an env's episode ended resets that env (its
actions are ignored; reward 0, not terminated/truncated, empty infos), so the runner sees the
true final observation first (needed to bootstrap truncated episodes).

Speed: the JaxMARL step of all N envs, the reset of the envs whose episode ended, and the
packing of observations / masks / state / counts into one ``float32 [N, L]`` block are one
compiled function; the host makes one device->host copy per step. Each env keeps its own PRNG
key chain, split exactly like :class:`rllib_ext.envs.smac.smax.SMAXBackend` does, so env ``i``
with seed ``s`` replays the battle a single ``SMACEnv`` with seed ``s`` plays.

Arrays (``E`` = num_envs, ``N`` = agents, ``A`` = actions) are also available without dicts:
:meth:`SMAXVectorEnv.step_arrays` / :attr:`SMAXVectorEnv.last` for array-speed samplers.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, cast

import gymnasium as gym
import numpy as np
from ray.rllib.env.vector.vector_multi_agent_env import VectorMultiAgentEnv
from ray.rllib.utils.annotations import override

from rllib_ext.envs.smac.env import (
    MaskedDiscrete,
    agent_observation_space,
    agent_observations,
    agent_states,
    derive_seed,
)
from rllib_ext.envs.smac.settings import SMACEnvSettings
from rllib_ext.envs.smac.smax import SMAXBackend, _compile

__all__ = ["SMAXBatch", "SMAXVectorEnv"]

logger = logging.getLogger(__name__)


@dataclass
class SMAXBatch:
    """One observation of all envs plus the outcome of the call that produced it.

    Shapes: ``obs float32 [E, N, obs_dim]`` (``obs_dim + N`` with ``obs_agent_id``),
    ``state float32 [E, state_dim]``,
    ``avail float32 [E, N, A]`` (legal actions, in {0, 1}), ``reward float32 [E]`` (team
    reward, already scaled by ``reward_mode``), ``terminated``/``truncated``/``battle_won``
    ``bool [E]`` (never both terminated and truncated), ``dead_allies``/``dead_enemies``
    ``int64 [E]``, ``was_reset bool [E]``: the env was reset in this call (then its reward is 0,
    its flags are False and this is the first observation of a new episode).
    """

    obs: np.ndarray
    state: np.ndarray
    avail: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    battle_won: np.ndarray
    dead_allies: np.ndarray
    dead_enemies: np.ndarray
    was_reset: np.ndarray


_BATCHED: dict[tuple[str, str], tuple[Any, Any]] = {}
_RESET_BUCKET = 8
"""Auto-resets per step compiled for (more: all envs' reset is computed in that step)."""


def _compile_batched(map_name: str, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(reset(keys), step(keys, states, actions, reset_idx))`` over a leading env axis.

    Both return ``(keys, states, flat float32 [E, L])`` with the single backend's flat layout.
    ``step`` steps every env, then resets the envs listed in ``reset_idx`` (``int32 [K]``;
    entries ``>= E`` are padding and dropped): a reset costs ~40% of a step on 3s5z_vs_3s6z, so
    only the few envs whose episode ended are reset, not all E (jit compiles once per K).
    """
    cache_key = (map_name, repr(sorted(options.items())))
    if cache_key in _BATCHED:
        return _BATCHED[cache_key]
    import jax

    single = _compile(map_name, options)
    # The single env's jitted reset/step (key split included) vmapped: the same ops per env.
    v_reset = jax.vmap(single.reset)
    v_step = jax.vmap(single.step)

    def step(keys: Any, states: Any, actions: Any, reset_idx: Any) -> tuple[Any, ...]:
        out = v_step(keys, states, actions)
        if reset_idx.shape[0] == 0:
            return out
        # Out-of-range padding indices: clipped on the gather, dropped on the scatter.
        reset_out = v_reset(keys[reset_idx.clip(0, keys.shape[0] - 1)])
        return jax.tree_util.tree_map(
            lambda stepped, reset: stepped.at[reset_idx].set(reset, mode="drop"), out, reset_out
        )

    compiled = (jax.jit(v_reset), jax.jit(step))
    _BATCHED[cache_key] = compiled
    return compiled


AUTO_GROUP_ROWS = 512
"""``num_groups="auto"`` splits the battles into 2 groups when all battles together hold at least
this many agent rows (``num_envs * agents``) and ``num_envs`` is even, else keeps 1 group.

Two groups let the policy's forward for one group run while JAX steps the other. On a 2-core
CPU (benchmarks/README.md, "Groups of battles") that paid on 3s5z_vs_3s6z with 64 battles (512
rows: 1.03-1.45x in 11 paired runs) and not on 3m with 64 battles (192 rows: 0.85-1.01x in 5),
whose forward is too short to hide the step behind."""


def auto_num_groups(num_envs: int, num_agents: int) -> int:
    """The group count ``num_groups="auto"`` picks (see :data:`AUTO_GROUP_ROWS`)."""
    return 2 if num_envs % 2 == 0 and num_envs * num_agents >= AUTO_GROUP_ROWS else 1


class SMAXVectorEnv(VectorMultiAgentEnv):
    """``num_envs`` SMAX battles in one compiled call; see the module docstring.

    Args:
        env_config: the SMAC ``env_config`` (dict or RLlib ``EnvContext``); its backend must be
            ``"smax"``. ``seed`` (if set) is spread over the envs like ``SMACEnv`` copies with
            ``vector_index = 0 .. num_envs - 1`` get it.
        num_envs: number of battles ``E`` (>= 1).
        worker_index: the env runner's index (seeding, like ``EnvContext.worker_index``).
        num_groups: ``G`` equal groups of ``E / G`` consecutive battles, each stepped by its own
            compiled call (:meth:`start_step` / :meth:`finish_step` with ``group=g``), so a
            sampler can run the policy for one group while JAX steps another. Per battle
            nothing changes (same seeds, same key chains); ``group=None`` steps all groups.
            ``"auto"``: :func:`auto_num_groups` (2 for large batches, else 1).

    Raises:
        ValueError: ``num_envs < 1``, ``num_groups`` not dividing ``num_envs``, or a backend
            other than SMAX.
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
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(
                f"num_envs={num_envs!r} must be an integer >= 1. Fix: pass the number of "
                "battles to step together, e.g. num_envs=64."
            )
        if num_groups != "auto" and (
            not isinstance(num_groups, int) or num_groups < 1 or num_envs % num_groups
        ):
            raise ValueError(
                f"num_groups={num_groups!r} must be 'auto' or an integer >= 1 that divides "
                f"num_envs={num_envs}. Fix: pass 'auto', 1 (one call for all battles) or a "
                "divisor of num_envs, e.g. 2."
            )
        self.settings = SMACEnvSettings.from_env_config(env_config)
        if self.settings.backend != "smax":
            raise ValueError(
                f"SMAXVectorEnv runs only the SMAX backend, got backend="
                f"{self.settings.backend!r}. Fix: set env_config['backend']='smax' (StarCraft II "
                "backends step one game per process through RLlib's own vector env)."
            )
        self.num_envs = num_envs
        self.spec_smax = SMAXBackend(self.settings, None).spec
        spec = self.spec_smax
        self.num_groups = (
            auto_num_groups(num_envs, spec.n_agents) if num_groups == "auto" else num_groups
        )
        self.group_size = num_envs // self.num_groups
        """Battles per group (``E / G``); group ``g`` holds battles ``g * group_size`` on."""
        self._reset_fn, self._step_fn = _compile_batched(
            self.settings.map_name, dict(self.settings.smax_options)
        )
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
        self.reward_scale = 1.0 if self.settings.reward_mode == "copy" else 1.0 / spec.n_agents
        """Factor on the team reward (``reward_mode``: 1 for "copy", 1/N for "split")."""
        self._seeds = [derive_seed(self.settings.seed, worker_index, i) for i in range(num_envs)]
        # Flat layout of SMAXBackend: obs | state | avail | (alive allies, alive enemies, r, done)
        self._obs_end = spec.n_agents * spec.obs_dim
        self._state_end = self._obs_end + spec.state_dim
        self._avail_end = self._state_end + spec.n_agents * spec.n_actions
        # Per group: PRNG keys, SMAX states, the step handed to JAX, the latest batch.
        self._keys: list[Any] = [None] * self.num_groups
        self._states: list[Any] = [None] * self.num_groups
        self._in_flight: list[tuple[Any, np.ndarray] | None] = [None] * self.num_groups
        self._group_last: list[SMAXBatch | None] = [None] * self.num_groups
        self._last: SMAXBatch | None = None
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self.envs = [_SubEnvView(self, e) for e in range(num_envs)]
        """One read-only view per battle (spaces, agents), where RLlib's runner reads
        ``env.envs[i].unwrapped``; its action spaces sample that battle's legal actions."""

    # ------------------------------------------------------------------ arrays
    def get_action_space(self, agent_id: str) -> gym.Space:
        return self.single_action_spaces[agent_id]

    def get_observation_space(self, agent_id: str) -> gym.Space:
        return self.single_observation_spaces[agent_id]

    def _initial_keys(self, seed: int | Sequence[int | None] | None) -> Any:
        import jax
        import jax.numpy as jnp

        if seed is None:
            seeds: list[int | None] = list(self._seeds)
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]  # SyncVectorMultiAgentEnv's rule
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(
                    f"reset(seed=...) got {len(seeds)} seeds for num_envs={self.num_envs}. "
                    "Fix: pass one int (env i gets seed + i) or exactly one seed per env."
                )
        drawn = [
            s if s is not None else int(np.random.SeedSequence().generate_state(1)[0])
            for s in seeds
        ]
        return jnp.stack([jax.random.PRNGKey(s) for s in drawn])

    def _unpack(self, flat: np.ndarray, was_reset: np.ndarray) -> SMAXBatch:
        spec = self.spec_smax
        n_envs = flat.shape[0]
        tail = flat[:, self._avail_end :]
        dead_allies = spec.n_agents - tail[:, 0].astype(np.int64)
        dead_enemies = spec.n_enemies - tail[:, 1].astype(np.int64)
        allies_gone = dead_allies == spec.n_agents
        enemies_gone = dead_enemies == spec.n_enemies
        # Same rules as SMAXBackend.step: elimination terminates, the time limit truncates.
        terminated = (allies_gone | enemies_gone) & ~was_reset
        truncated = (tail[:, 3] > 0) & ~terminated & ~was_reset
        return SMAXBatch(
            obs=agent_observations(
                flat[:, : self._obs_end].reshape(n_envs, spec.n_agents, spec.obs_dim),
                obs_agent_id=self.settings.obs_agent_id,
            ),
            state=flat[:, self._obs_end : self._state_end],
            avail=flat[:, self._state_end : self._avail_end].reshape(
                n_envs, spec.n_agents, spec.n_actions
            ),
            reward=np.where(was_reset, np.float32(0.0), tail[:, 2]),
            terminated=terminated,
            truncated=truncated,
            battle_won=enemies_gone & ~allies_gone & ~was_reset,
            dead_allies=dead_allies,
            dead_enemies=dead_enemies,
            was_reset=was_reset,
        )

    @property
    def last(self) -> SMAXBatch | None:
        """The latest :class:`SMAXBatch` of all envs (``None`` before the first reset)."""
        if self._last is None and all(b is not None for b in self._group_last):
            batches = cast(list[SMAXBatch], self._group_last)
            self._last = (
                batches[0]
                if len(batches) == 1
                else SMAXBatch(
                    **{
                        f.name: np.concatenate([getattr(b, f.name) for b in batches])
                        for f in fields(SMAXBatch)
                    }
                )
            )
        return self._last

    def group_batch(self, group: int) -> SMAXBatch:
        """The latest :class:`SMAXBatch` of group ``group`` (its ``group_size`` envs)."""
        batch = self._group_last[group]
        if batch is None:
            raise ValueError("No batch yet. Fix: call reset_arrays() first.")
        return batch

    def _rows(self, group: int) -> slice:
        return slice(group * self.group_size, (group + 1) * self.group_size)

    def _groups(self, group: int | None) -> range:
        if group is None:
            return range(self.num_groups)
        if not 0 <= group < self.num_groups:
            raise ValueError(
                f"group={group!r} is not one of 0..{self.num_groups - 1} (num_groups="
                f"{self.num_groups}). Fix: pass a group index, or None for all envs."
            )
        return range(group, group + 1)

    def reset_arrays(self, *, seed: int | Sequence[int | None] | None = None) -> SMAXBatch:
        """Resets every env; keys are (re)seeded on the first call or when ``seed`` is given."""
        if seed is not None or self._keys[0] is None:
            keys = self._initial_keys(seed)
            self._keys = [keys[self._rows(g)] for g in range(self.num_groups)]
        for g in range(self.num_groups):
            self._keys[g], self._states[g], flat = self._reset_fn(self._keys[g])
            self._group_last[g] = self._unpack(
                np.asarray(flat), np.ones(self.group_size, dtype=bool)
            )
            self._in_flight[g] = None
        self._last = None
        self._autoreset[:] = False
        return cast(SMAXBatch, self.last)

    def _reset_index(self, group: int) -> np.ndarray:
        """``int32 [K]`` envs of ``group`` to auto-reset (indices within the group), padded with
        ``group_size`` to K in {0, 8, group_size}."""
        index = np.flatnonzero(self._autoreset[self._rows(group)]).astype(np.int32)
        if index.size == 0:
            return index
        size = _RESET_BUCKET if index.size <= _RESET_BUCKET else self.group_size
        return np.pad(index, (0, size - index.size), constant_values=self.group_size)

    def step_arrays(self, actions: np.ndarray) -> SMAXBatch:
        """Steps all envs with ``int [E, N]`` actions (ignored for envs being auto-reset).

        Actions are not mask-checked here (the dict :meth:`step` checks them like ``SMACEnv``).
        """
        self.start_step(actions)
        return self.finish_step()

    def start_step(self, actions: np.ndarray, *, group: int | None = None) -> np.ndarray:
        """The first half of :meth:`step_arrays`: hands the step to JAX, which runs it in its own
        threads while the caller goes on; :meth:`finish_step` waits for it.

        ``actions``: ``int [E, N]``, or ``[group_size, N]`` for one ``group``. Returns
        ``was_reset bool [E]`` (or ``[group_size]``): the envs this step resets instead (their
        actions are ignored), known before the step runs.
        """
        groups = self._groups(group)
        if self._keys[0] is None:
            raise ValueError("step() called before reset(). Fix: call reset() first.")
        if any(self._in_flight[g] is not None for g in groups):
            raise ValueError("start_step() called twice. Fix: call finish_step() in between.")
        actions = np.asarray(actions, dtype=np.int32)
        resets = []
        for g in groups:
            rows = self._rows(g)
            was_reset = self._autoreset[rows].copy()
            self._keys[g], self._states[g], flat = self._step_fn(
                self._keys[g],
                self._states[g],
                actions if group is not None else actions[rows],
                self._reset_index(g),
            )
            self._in_flight[g] = (flat, was_reset)
            resets.append(was_reset)
        return resets[0] if len(resets) == 1 else np.concatenate(resets)

    def finish_step(self, *, group: int | None = None) -> SMAXBatch:
        """The step :meth:`start_step` began (for ``group``, or all groups), once JAX has
        finished it: the new batch of those envs."""
        groups = self._groups(group)
        if any(self._in_flight[g] is None for g in groups):
            raise ValueError("finish_step() without start_step(). Fix: call start_step() first.")
        for g in groups:
            flat, was_reset = cast(tuple[Any, np.ndarray], self._in_flight[g])
            self._in_flight[g] = None
            batch = self._unpack(np.asarray(flat), was_reset)
            self._group_last[g] = batch
            self._autoreset[self._rows(g)] = batch.terminated | batch.truncated
        self._last = None
        return self.group_batch(group) if group is not None else cast(SMAXBatch, self.last)

    # ------------------------------------------------------------------ RLlib dict API
    def _observations(self, batch: SMAXBatch) -> list[dict[str, dict[str, np.ndarray]]]:
        obs, avail = batch.obs, batch.avail
        agents = self.possible_agents
        if self.settings.include_state:
            states = self.agent_states(batch)
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

    def agent_states(self, batch: SMAXBatch) -> np.ndarray:
        """Every agent's ``"state"`` entry, ``float32 [E, N, D]`` (see ``state_mode``)."""
        return agent_states(
            batch.state, len(self.possible_agents), state_mode=self.settings.state_mode
        )

    @override(VectorMultiAgentEnv)
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        batch = self.reset_arrays(seed=seed)
        infos: list[dict[str, Any]] = [
            {agent: {} for agent in self.possible_agents} for _ in range(self.num_envs)
        ]
        return self._observations(batch), infos

    def _action_array(self, actions: Sequence[Mapping[str, Any]]) -> np.ndarray:
        from rllib_ext.envs.smac import check_actions

        spec = self.spec_smax
        last = self.last
        if last is None:
            raise ValueError("step() called before reset(). Fix: call reset() first.")
        out = np.full((self.num_envs, spec.n_agents), spec.no_op_action, dtype=np.int32)
        if len(actions) != self.num_envs:
            raise ValueError(
                f"Got {len(actions)} action dicts for num_envs={self.num_envs}. Fix: pass one "
                "dict per env (RLlib's MultiAgentEnvRunner does)."
            )
        for e, action_dict in enumerate(actions):
            if self._autoreset[e]:
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

    @staticmethod
    def step_info(batch: SMAXBatch, e: int) -> dict[str, Any]:
        """``SMACEnv``'s per-agent ``info`` after a step of env ``e`` (not a reset)."""
        return {
            "battle_won": bool(batch.battle_won[e]),
            "dead_allies": int(batch.dead_allies[e]),
            "dead_enemies": int(batch.dead_enemies[e]),
            "episode_limit": bool(batch.truncated[e]),
            "sc2_crashed": False,
            "sc2_restarts": 0,
        }

    @override(VectorMultiAgentEnv)
    def step(self, actions: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
        if self.last is None:
            raise ValueError("step() called before reset(). Fix: call reset() first.")
        batch = self.step_arrays(self._action_array(actions))
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
            rewards.append(dict.fromkeys(agents, float(batch.reward[e]) * self.reward_scale))
            term, trunc = bool(batch.terminated[e]), bool(batch.truncated[e])
            terminateds.append({**dict.fromkeys(agents, term), "__all__": term})
            truncateds.append({**dict.fromkeys(agents, trunc), "__all__": trunc})
            info = self.step_info(batch, e)
            infos.append({agent: dict(info) for agent in agents})
        return self._observations(batch), rewards, terminateds, truncateds, infos

    @override(VectorMultiAgentEnv)
    def close_extras(self, **kwargs: Any) -> None:
        # Also runs (from gymnasium's __del__) for an env whose __init__ raised.
        self._states = [None] * len(getattr(self, "_states", ()))


class _SubEnvView:
    """Battle ``index`` of a :class:`SMAXVectorEnv` as RLlib's runner inspects a sub-env."""

    def __init__(self, vector: SMAXVectorEnv, index: int) -> None:
        self.possible_agents = vector.possible_agents
        self.agents = vector.possible_agents
        self.observation_spaces = vector.single_observation_spaces
        vector_ref = weakref.ref(vector)
        self.action_spaces = {
            agent: MaskedDiscrete(
                vector.spec_smax.n_actions, mask_fn=_mask_getter(vector_ref, index, i)
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
        if vector is None or vector.last is None:
            return None
        return (vector.last.avail[env_index, agent_index] > 0).astype(np.int8)

    return legal_actions
