"""Episode chunks of the fused single-agent loop: the one place that knows RLlib's episode layout.

:func:`build_single_agent_chunk` turns a :class:`~rllib_ext.fused_sampling.tracks.Track` into the
list-based ``SingleAgentEpisode`` ``SingleAgentEnvRunner._sample`` holds for the same steps:
RLlib's public constructor over the track's lists (lookback as ``cut()`` leaves it). The loop
hands it to ``on_episode_end`` as RLlib's does, then calls ``to_numpy()`` (in place), so dtypes
and buffers come from RLlib's own code. The cost is per chunk, not per step. The chunk's clock goes through :mod:`rllib_ext._rllib_private`.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ext import _rllib_private as private
from rllib_ext.fused_sampling.tracks import Track

__all__ = ["build_single_agent_chunk"]


def build_single_agent_chunk(
    track: Track,
    items: dict[str, Any],
    *,
    terminated: bool,
    truncated: bool,
    observation_space: Any,
    action_space: Any,
    start_time: float | None,
    last_step_time: float | None,
) -> SingleAgentEpisode:
    """The list-based ``SingleAgentEpisode`` chunk RLlib's loop holds for ``track`` (before its
    ``to_numpy()``), whose per-step lists are ``items`` (:meth:`Track.items`; at least the
    first observation)."""
    episode = SingleAgentEpisode(
        track.episode_id,
        observation_space=observation_space,
        action_space=action_space,
        terminated=terminated,
        truncated=truncated,
        t_started=track.t_started,
        len_lookback_buffer=track.lookback,
        **items,
    )
    private.set_episode_clock(episode, start_time=start_time, last_step_time=last_step_time)
    return episode
