"""The fused SMAX loop's records: per-env episode tracks and what one step hands to them.

An :class:`EnvTrack` is one env's episode chunk in progress as per-step array views (no
per-agent dicts); :class:`ActionRecord` is what the policy step produced for a group of envs,
:class:`StepRecord` that plus the outcome JAX returned. Shapes: ``E`` envs of the group,
``N`` agents, ``A`` actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from rllib_ext.envs.smac.battles import SMAXBatch

__all__ = ["ActionRecord", "EnvTrack", "StepRecord"]


class ActionRecord(NamedTuple):
    """The policy's step for a group of envs: ``actions int32 [E, N]``, ``logp float32 [E, N]``,
    ``logits float32 [E, N, A]``, recurrent ``state_out`` rows ``[E * N, ...]`` (or ``None``),
    under the weights ``weights_seq_no``."""

    actions: np.ndarray
    logp: np.ndarray
    logits: np.ndarray
    state_out: Any
    weights_seq_no: int


class StepRecord(NamedTuple):
    """One env step waiting to be recorded into the tracks: the outcome ``new`` of ``taken``
    (``states``: the agents' ``"state"`` entries ``[E, N, D]`` in ``new``, or ``None``)."""

    new: SMAXBatch
    states: np.ndarray | None
    taken: ActionRecord


@dataclass
class EnvTrack:
    """One env's episode chunk in progress: per step array views, no per-agent dicts.

    The first ``lookback`` entries of every list are the previous chunk's last step (continued
    chunks: one, as ``cut(len_lookback_buffer=1)`` keeps it). ``obs``/``avail``/``state``/
    ``infos`` have one entry more than the per-step lists (the observation after the last
    action).
    """

    episode_id: str
    agent_episode_ids: dict[str, str]
    env_t_started: int
    start_time: float | None
    """``perf_counter`` at the reset; ``None`` for a continued chunk until its first step (RLlib's
    ``cut()`` chunks start their clock there, so time between ``sample()`` calls is not counted)."""
    lookback: int = 0
    obs: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, obs_dim]`` per observation."""
    avail: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, A]`` per observation."""
    state: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, D]`` per observation: every agent's ``"state"`` entry (only with
    ``include_state``; ``D`` per ``state_mode``)."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    """``int32 [N]`` per step."""
    logp: list[np.ndarray] = field(default_factory=list)
    """``float32 [N]`` per step."""
    logits: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, A]`` per step (``action_dist_inputs``)."""
    rewards: list[float] = field(default_factory=list)
    weights_seq_no: list[int] = field(default_factory=list)
    state_out: list[Any] = field(default_factory=list)
    """Recurrent modules only: the module's ``STATE_OUT`` per step, a (nested) dict of
    ``float32 [N, ...]`` arrays."""
    last_step_time: float | None = None
    carried_unstepped: bool = False
    """The episode was reset but not yet stepped when a ``sample()`` call ended. RLlib's loop
    still ``cut()``s it, and that cut's env-to-agent time map starts with one ``"S"`` (skip)
    lookback entry, which the chunk built from this track then carries too."""

    @property
    def steps(self) -> int:
        """Env steps in this chunk (lookback excluded)."""
        return len(self.actions) - self.lookback

    def continuation(self) -> EnvTrack:
        """The next chunk of this episode (needs >= 1 step), like ``cut(len_lookback_buffer=1)``:
        it starts at this chunk's last observation; the lookback is the step that led there."""
        return EnvTrack(
            episode_id=self.episode_id,
            agent_episode_ids=self.agent_episode_ids,
            env_t_started=self.env_t_started + self.steps,
            start_time=None,
            lookback=1,
            obs=self.obs[-2:],
            avail=self.avail[-2:],
            state=self.state[-2:],
            infos=self.infos[-2:],
            actions=self.actions[-1:],
            logp=self.logp[-1:],
            logits=self.logits[-1:],
            rewards=self.rewards[-1:],
            weights_seq_no=self.weights_seq_no[-1:],
            state_out=self.state_out[-1:],
        )
