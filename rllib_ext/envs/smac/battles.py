"""``SMAXBattles``: ``E`` SMAX battles stepped by one jitted, vmapped call, as arrays (no Ray).

Contract per battle: exactly :class:`rllib_ext.envs.smac.SMACEnv`'s arrays (observations,
masks, global state, rewards, terminated/truncated), in the ``"next_step"`` auto-reset mode:
the call after a battle ended resets it (its actions ignored; ``was_reset`` set, reward 0, not
terminated/truncated), so a sampler sees the true final observation first (needed to bootstrap
truncated episodes). Each battle keeps its own PRNG key chain, split exactly like
:class:`rllib_ext.envs.smac.smax.SMAXBackend` does, so battle ``i`` with seed ``s`` replays the
battle a single ``SMACEnv`` with seed ``s`` plays.

The step of a group of battles, the reset of its battles whose episode ended, and the packing
of observations / masks / state / counts into one ``float32 [E, L]`` block are one compiled
function; the host makes one device->host copy per step. Groups (``G`` equal runs of ``E / G``
consecutive battles) are stepped by separate calls, :meth:`SMAXBattles.start_step` handing one
to JAX and :meth:`SMAXBattles.finish_step` waiting for it, so a sampler can run the policy for
one group while JAX steps another. :class:`rllib_ext.envs.smac.vector.SMAXVectorEnv` is RLlib's
dict view over this; ``tests/envs/test_smax_vector.py`` tests both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, cast

import numpy as np

from rllib_ext.envs.smac.backend import agent_observations, agent_states, derive_seed
from rllib_ext.envs.smac.settings import SMACEnvSettings
from rllib_ext.envs.smac.smax import SMAXBackend, _compile, import_jax

__all__ = ["AUTO_GROUP_ROWS", "SMAXBatch", "SMAXBattles", "auto_num_groups"]


@dataclass
class SMAXBatch:
    """One observation of a run of battles plus the outcome of the call that produced it.

    Shapes: ``obs float32 [E, N, obs_dim]`` (``obs_dim + N`` with ``obs_agent_id``),
    ``state float32 [E, state_dim]``,
    ``avail float32 [E, N, A]`` (legal actions, in {0, 1}), ``reward float32 [E]`` (team
    reward, already scaled by ``reward_mode``), ``terminated``/``truncated``/``battle_won``
    ``bool [E]`` (never both terminated and truncated), ``dead_allies``/``dead_enemies``
    ``int64 [E]``, ``was_reset bool [E]``: the battle was reset in this call (then its reward
    is 0, its flags are False and this is the first observation of a new episode).
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
"""Auto-resets per step compiled for (more: all battles' reset is computed in that step)."""


def _compile_batched(map_name: str, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(reset(keys), step(keys, states, actions, reset_idx))`` over a leading battle axis.

    Both return ``(keys, states, flat float32 [E, L])`` with the single backend's flat layout.
    ``step`` steps every battle, then resets those listed in ``reset_idx`` (``int32 [K]``;
    entries ``>= E`` are padding and dropped): only the few battles whose episode ended are
    reset, not all E (jit compiles once per K).
    """
    cache_key = (map_name, repr(sorted(options.items())))
    if cache_key in _BATCHED:
        return _BATCHED[cache_key]
    jax = import_jax()
    single = _compile(map_name, options)
    # The single env's jitted reset/step (key split included) vmapped: the same ops per battle.
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
this many agent rows (``num_envs * agents``) and ``num_envs`` is even, else keeps 1 group: the
forward of smaller batches is too short to hide a step behind (benchmarks/README.md, SMAX
sampling)."""


def auto_num_groups(num_envs: int, num_agents: int) -> int:
    """The group count ``num_groups="auto"`` picks (see :data:`AUTO_GROUP_ROWS`)."""
    return 2 if num_envs % 2 == 0 and num_envs * num_agents >= AUTO_GROUP_ROWS else 1


class SMAXBattles:
    """``num_envs`` SMAX battles in ``num_groups`` compiled calls; see the module docstring.

    Args:
        settings: the SMAC env settings; ``backend`` must be ``"smax"``. ``seed`` (if set) is
            spread over the battles like ``SMACEnv`` copies with ``vector_index = 0 .. E - 1``.
        num_envs: number of battles ``E`` (>= 1).
        worker_index: the env runner's index (seeding, like ``EnvContext.worker_index``).
        num_groups: ``G`` groups (dividing ``E``), or ``"auto"`` (:func:`auto_num_groups`).

    Raises:
        ValueError: ``num_envs < 1``, ``num_groups`` not dividing ``num_envs``, or a backend
            other than SMAX.
    """

    def __init__(
        self,
        settings: SMACEnvSettings,
        *,
        num_envs: int,
        worker_index: int = 0,
        num_groups: int | Literal["auto"] = 1,
    ) -> None:
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
        if settings.backend != "smax":
            raise ValueError(
                f"SMAXVectorEnv runs only the SMAX backend, got backend="
                f"{settings.backend!r}. Fix: set env_config['backend']='smax' (StarCraft II "
                "backends step one game per process through RLlib's own vector env)."
            )
        self.settings = settings
        self.num_envs = num_envs
        self.spec = spec = SMAXBackend(settings, None).spec
        self.num_groups = (
            auto_num_groups(num_envs, spec.n_agents) if num_groups == "auto" else num_groups
        )
        self.group_size = num_envs // self.num_groups
        """Battles per group (``E / G``); group ``g`` holds battles ``g * group_size`` on."""
        self.reward_scale = 1.0 if settings.reward_mode == "copy" else 1.0 / spec.n_agents
        """Factor on the team reward (``reward_mode``: 1 for "copy", 1/N for "split")."""
        self._reset_fn, self._step_fn = _compile_batched(
            settings.map_name, dict(settings.smax_options)
        )
        self._seeds = [derive_seed(settings.seed, worker_index, i) for i in range(num_envs)]
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
        self.autoreset = np.zeros(num_envs, dtype=bool)
        """``bool [E]``: the battle's episode ended; the next step resets it."""

    def _initial_keys(self, seed: int | Sequence[int | None] | None) -> Any:
        # lazy: JAX loads only where a SMAX battle is built
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
        spec = self.spec
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
        """The latest :class:`SMAXBatch` of all battles (``None`` before the first reset)."""
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
        """The latest :class:`SMAXBatch` of group ``group`` (its ``group_size`` battles)."""
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
        """Resets every battle; keys are (re)seeded on the first call or when ``seed`` is given."""
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
        self.autoreset[:] = False
        return cast(SMAXBatch, self.last)

    def _reset_index(self, group: int) -> np.ndarray:
        """``int32 [K]`` battles of ``group`` to auto-reset (indices within the group), padded
        with ``group_size`` to K in {0, 8, group_size}."""
        index = np.flatnonzero(self.autoreset[self._rows(group)]).astype(np.int32)
        if index.size == 0:
            return index
        size = _RESET_BUCKET if index.size <= _RESET_BUCKET else self.group_size
        return np.pad(index, (0, size - index.size), constant_values=self.group_size)

    def step_arrays(self, actions: np.ndarray) -> SMAXBatch:
        """Steps all battles with ``int [E, N]`` actions (ignored for battles being reset).

        Actions are not mask-checked here (the dict ``SMAXVectorEnv.step`` checks them).
        """
        self.start_step(actions)
        return self.finish_step()

    def start_step(self, actions: np.ndarray, *, group: int | None = None) -> np.ndarray:
        """The first half of :meth:`step_arrays`: hands the step to JAX, which runs it in its own
        threads while the caller goes on; :meth:`finish_step` waits for it.

        ``actions``: ``int [E, N]``, or ``[group_size, N]`` for one ``group``. Returns
        ``was_reset bool [E]`` (or ``[group_size]``): the battles this step resets instead
        (their actions are ignored), known before the step runs.
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
            was_reset = self.autoreset[rows].copy()
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
        finished it: the new batch of those battles."""
        groups = self._groups(group)
        if any(self._in_flight[g] is None for g in groups):
            raise ValueError("finish_step() without start_step(). Fix: call start_step() first.")
        for g in groups:
            flat, was_reset = cast(tuple[Any, np.ndarray], self._in_flight[g])
            self._in_flight[g] = None
            batch = self._unpack(np.asarray(flat), was_reset)
            self._group_last[g] = batch
            self.autoreset[self._rows(g)] = batch.terminated | batch.truncated
        self._last = None
        return self.group_batch(group) if group is not None else cast(SMAXBatch, self.last)

    def agent_states(self, batch: SMAXBatch) -> np.ndarray | None:
        """Every agent's ``"state"`` entry, ``float32 [E, N, D]`` (see ``state_mode``);
        ``None`` without ``include_state``."""
        if not self.settings.include_state:
            return None
        return agent_states(batch.state, self.spec.n_agents, state_mode=self.settings.state_mode)

    @staticmethod
    def step_info(batch: SMAXBatch, e: int) -> dict[str, Any]:
        """``SMACEnv``'s per-agent ``info`` after a step of battle ``e`` (not a reset)."""
        return {
            "battle_won": bool(batch.battle_won[e]),
            "dead_allies": int(batch.dead_allies[e]),
            "dead_enemies": int(batch.dead_enemies[e]),
            "episode_limit": bool(batch.truncated[e]),
            "sc2_crashed": False,
            "sc2_restarts": 0,
        }

    def close(self) -> None:
        """Drops the SMAX states (the compiled functions stay cached for the next battles)."""
        self._states = [None] * self.num_groups
