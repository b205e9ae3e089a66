"""Episode chunks of the fused SMAX loop: the one place that knows RLlib's episode layout.

:func:`build_smax_chunk` turns an :class:`~rllib_ext.envs.smac.sampling.tracks.EnvTrack` into the
numpy'd ``MultiAgentEpisode`` RLlib's ``MultiAgentEnvRunner`` would have returned for the same
steps: per-agent ``SingleAgentEpisode``s from RLlib's public constructor over array slices, and
the multi-agent episode through :mod:`rllib_ext._rllib_private` (its private state keys).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import tree
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

from rllib_ext import _rllib_private as private
from rllib_ext.envs.smac.sampling.tracks import EnvTrack

__all__ = ["REWARD_SPACE", "build_smax_chunk"]


REWARD_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)
"""The space ``SingleAgentEpisode`` gives a rewards buffer it builds from a list (RLlib's loop)."""


def build_smax_chunk(
    track: EnvTrack,
    *,
    agents: Sequence[str],
    terminated: bool,
    truncated: bool,
    observation_space: dict[str, Any],
    action_space: dict[str, Any],
    module_id: str,
    mapping_fn: Any,
) -> MultiAgentEpisode:
    """The numpy'd ``MultiAgentEpisode`` chunk RLlib's loop would have returned for ``track``.

    Each agent's ``SingleAgentEpisode`` comes from RLlib's public constructor with ready
    ``InfiniteLookbackBuffer``s over per-agent array slices; the multi-agent episode from
    ``MultiAgentEpisode.from_state`` (through :mod:`rllib_ext._rllib_private`, which owns the
    private state keys) with those agent episodes. The cost is per chunk and agent, not per step.
    """
    lookback = track.lookback
    steps = track.steps
    t0 = track.env_t_started
    # np.array over a list of same-shape arrays stacks them like np.stack, with less overhead
    # per element.
    obs = np.array(track.obs)  # [L + T + 1, N, obs_dim]
    avail = np.array(track.avail)  # [L + T + 1, N, A]
    state = np.array(track.state) if track.state else None  # [L + T + 1, N, D]
    actions = np.array(track.actions)  # [L + T, N] int32
    logp = np.array(track.logp)  # [L + T, N]
    logits = np.array(track.logits)  # [L + T, N, A]
    rewards = np.asarray(track.rewards, dtype=np.float64)  # [L + T]
    seq_no = np.asarray(track.weights_seq_no, dtype=np.int64)  # [L + T]
    # Recurrent modules: a (nested) dict of [L + T, N, ...] arrays.
    state_out = (
        tree.map_structure(lambda *steps: np.array(steps), *track.state_out)
        if track.state_out
        else None
    )
    agent_episodes: dict[str, SingleAgentEpisode] = {}
    for i, agent in enumerate(agents):
        observations = {"observations": obs[:, i], "action_mask": avail[:, i]}
        if state is not None:
            observations["state"] = state[:, i]
        extra_model_outputs = {
            Columns.ACTION_DIST_INPUTS: InfiniteLookbackBuffer(logits[:, i], lookback),
            Columns.ACTION_LOGP: InfiniteLookbackBuffer(logp[:, i], lookback),
            "weights_seq_no": InfiniteLookbackBuffer(seq_no.copy(), lookback),
        }
        if state_out is not None:
            extra_model_outputs[Columns.STATE_OUT] = InfiniteLookbackBuffer(
                tree.map_structure(lambda x, i=i: x[:, i], state_out), lookback
            )
        # RLlib's public constructor with ready buffers (an ndarray/dict buffer is finalized,
        # the infos list is not), as ``to_numpy()`` leaves the loop's episodes.
        agent_episodes[agent] = SingleAgentEpisode(
            track.agent_episode_ids[agent],
            observations=InfiniteLookbackBuffer(observations, lookback),
            observation_space=observation_space[agent],
            infos=InfiniteLookbackBuffer([dict(info) for info in track.infos], lookback),
            actions=InfiniteLookbackBuffer(actions[:, i], lookback),
            action_space=action_space[agent],
            rewards=InfiniteLookbackBuffer(rewards.copy(), lookback, space=REWARD_SPACE),
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs=extra_model_outputs,
            t_started=t0,
            agent_id=agent,
            module_id=module_id,
            multi_agent_episode_id=track.episode_id,
        )
    env_t_to_agent_t: defaultdict[str, InfiniteLookbackBuffer] = defaultdict(InfiniteLookbackBuffer)
    # Every agent acts at every env step: agent time == env time.
    agent_t: list[Any] = list(range(t0 - lookback, t0 + steps + 1))
    t_lookback = lookback
    if track.carried_unstepped and lookback == 0:
        agent_t, t_lookback = ["S", *agent_t], 1
    for agent in agents:
        env_t_to_agent_t[agent] = InfiniteLookbackBuffer(list(agent_t), lookback=t_lookback)
    episode = private.multi_agent_episode_from_parts(
        agent_to_module=dict.fromkeys(agents, module_id),
        env_t_to_agent_t=env_t_to_agent_t,
        start_time=track.start_time,
        last_step_time=track.last_step_time,
        id_=track.episode_id,
        agent_to_module_mapping_fn=mapping_fn,
        observation_space=observation_space,
        action_space=action_space,
        env_t_started=t0,
        env_t=t0 + steps,
        agent_t_started=defaultdict(int, dict.fromkeys(agents, t0)),
        is_terminated=terminated,
        is_truncated=truncated,
        custom_data={},
    )
    episode.agent_episodes = agent_episodes
    return episode
