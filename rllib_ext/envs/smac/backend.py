"""What every SMAC backend gives the wrappers: arrays, a fixed layout, one termination contract.

A backend (StarCraft II through smac/smacv2, or JaxMARL's SMAX) turns the game's own API into
numpy arrays of a fixed shape. The RLlib env and the PettingZoo view only build dicts from them.
This module holds the types and the per-agent array views only; :mod:`rllib_ext.envs.smac.factory` picks and builds a backend.

Contract of :class:`Step` (``T`` = team, ``N`` = n_agents, ``A`` = n_actions):

* ``obs``: ``float32 [N, obs_dim]``; ``state``: ``float32 [state_dim]``;
  ``avail``: ``float32 [N, A]`` in {0, 1}, at least one 1 per row.
* Dead agents stay in the episode: their observation is zeros (the games do this) and their
  only legal action is ``spec.no_op_action`` (SMAC: 0 "no-op"; SMAX: 4 "stop").
* ``terminated``: the battle is decided (a team is eliminated). ``truncated``: the time limit
  (or a StarCraft II crash) cut the episode; values must be bootstrapped from ``obs``/``state``.
  Never both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "Backend",
    "BackendSpec",
    "Step",
    "agent_observations",
    "agent_states",
    "check_actions",
    "derive_seed",
    "with_agent_ids",
]


@dataclass(frozen=True)
class BackendSpec:
    """Sizes and action layout of one map on one backend."""

    backend: str
    """``"smacv2"``, ``"smac"`` or ``"smax"``."""
    map_name: str
    n_agents: int
    n_enemies: int
    n_actions: int
    obs_dim: int
    state_dim: int
    episode_limit: int
    """Steps after which the episode is truncated."""
    no_op_action: int
    """The one action that is always legal for a dead agent."""


@dataclass
class Step:
    """One observation of the game plus the outcome of the step that led to it."""

    obs: np.ndarray
    state: np.ndarray
    avail: np.ndarray
    reward: float = 0.0
    """Team reward of the step (backend scale: SMAC's scaled reward, SMAX's normalised one)."""
    terminated: bool = False
    truncated: bool = False
    battle_won: bool = False
    dead_allies: int = 0
    dead_enemies: int = 0
    crashed: bool = False
    """StarCraft II crashed or lost its connection during this step (then ``truncated``)."""


class Backend(Protocol):
    """The interface :class:`rllib_ext.envs.smac.SMACEnv` drives."""

    spec: BackendSpec
    restarts: int
    """Game restarts after crashes since construction."""

    def reset(self, seed: int | None) -> Step: ...

    def step(self, actions: np.ndarray) -> Step: ...

    def close(self) -> None: ...


def check_actions(actions: Sequence[int], avail: np.ndarray, agent_ids: Sequence[str]) -> None:
    """Raises a ``ValueError`` when an action is out of range or masked.

    Args:
        actions: one Python ``int`` per agent.
        avail: ``float32 [N, A]`` legal-action mask of the current observation.
        agent_ids: names used in the message.
    """
    # A Python loop over N <= ~30 ints beats several numpy calls of ~5 us each here.
    n_actions = avail.shape[1]
    rows = avail.tolist()
    for i, action in enumerate(actions):
        if not 0 <= action < n_actions:
            raise ValueError(
                f"Action {action} for {agent_ids[i]} is out of range; allowed: integers "
                f"0..{n_actions - 1}. Fix: sample from the agent's Discrete({n_actions}) space."
            )
        if rows[i][action] <= 0:
            allowed = [a for a, legal in enumerate(rows[i]) if legal > 0]
            raise ValueError(
                f"Action {action} for {agent_ids[i]} is masked (illegal) in this state; legal "
                f"actions now: {allowed}. Fix: sample only actions whose "
                'obs["action_mask"] entry is 1 (rllib_ext.modules.MaskedPPOTorchRLModule does).'
            )


# Per-agent views of a backend's arrays (one env or a batch of envs), shared by SMACEnv and the
# batched battles.


def with_agent_ids(rows: np.ndarray) -> np.ndarray:
    """``float [..., N, D]`` per-agent rows -> a new ``[..., N, D + N]`` array, each row followed
    by its agent's one-hot id (agent ``i`` in row ``i``)."""
    n_agents = rows.shape[-2]
    ids = np.broadcast_to(np.eye(n_agents, dtype=rows.dtype), (*rows.shape[:-1], n_agents))
    return np.concatenate([rows, ids], axis=-1)


def agent_observations(obs: np.ndarray, *, obs_agent_id: bool) -> np.ndarray:
    """Every agent's ``"observations"`` entry: ``float32 [..., N, obs_dim]`` as the game gives
    it, or with ``obs_agent_id`` a new ``[..., N, obs_dim + N]`` array (one-hot id appended)."""
    return with_agent_ids(obs) if obs_agent_id else obs


def agent_states(state: np.ndarray, n_agents: int, *, state_mode: str) -> np.ndarray:
    """Every agent's ``"state"`` entry, for one env or a batch of envs.

    Args:
        state: ``float32 [..., state_dim]``, the global state (``...``: e.g. envs).
        n_agents: ``N``.
        state_mode: ``"global"`` (the state for every agent) or ``"agent_specific"`` (the
            state followed by the agent's one-hot id).

    Returns:
        A new ``float32 [..., N, D]`` array, ``D = state_dim`` (global) or
        ``state_dim + N`` (agent-specific).
    """
    rows = np.repeat(state[..., None, :], n_agents, axis=-2)
    return rows if state_mode == "global" else with_agent_ids(rows)


def derive_seed(seed: int | None, worker_index: int, vector_index: int) -> int | None:
    """A distinct, reproducible seed per env copy (``None`` stays ``None``)."""
    if seed is None:
        return None
    sequence = np.random.SeedSequence(seed, spawn_key=(worker_index, vector_index))
    return int(sequence.generate_state(1)[0])
