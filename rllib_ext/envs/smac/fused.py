"""Array-speed sampling for :class:`rllib_ext.envs.smac.env_runner.SMAXVectorEnvRunner`.

RLlib's ``MultiAgentEnvRunner`` turns every env step into per-agent dicts, runs both connector
pipelines over them and appends to each ``MultiAgentEpisode`` agent by agent (about 70 us per
env step of 8 agents here, before the env and the forward pass). This module keeps a rollout as
arrays instead: one forward pass over all agents of all envs (``[E * N]`` rows), the action
distribution sampled once, the vector env stepped with an ``int [E, N]`` array, and per env
Python lists of array views. Episodes are built once per chunk with RLlib's own
``MultiAgentEpisode`` constructor and ``to_numpy()``, so the learner receives the same kind of
objects (same columns: observations, actions, rewards, infos, ``action_dist_inputs``,
``action_logp``, ``weights_seq_no``; terminated/truncated; ids and ``env_t_started`` continuing
across ``sample()`` calls; a one-step lookback on continued chunks like ``cut()``).

What RLlib's default connector pieces would do is done here directly, which is exact only for
what :func:`fused_sampling_applies` checks: the default env-to-module / module-to-env pipelines,
one stateless module for all agents, no ``on_episode_created/start/step`` callbacks (the
batched path calls ``on_episode_end`` only), time-step sampling (``num_timesteps``) counted in
env steps. Otherwise the runner falls back to RLlib's loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

__all__ = ["EnvTrack", "build_chunk", "fused_sampling_applies"]

_DEFAULT_ENV_TO_MODULE = (
    "AddObservationsFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "AddStatesFromEpisodesToBatch",
    "AgentToModuleMapping",
    "BatchIndividualItems",
    "NumpyToTensor",
)
_DEFAULT_MODULE_TO_ENV = (
    "GetActions",
    "TensorToNumpy",
    "UnBatchToIndividualItems",
    "ModuleToAgentUnmapping",
    "RemoveSingleTsTimeRankFromBatch",
    "NormalizeAndClipActions",
    "ListifyDataForVectorEnv",
)
_PER_STEP_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step")


def _piece_names(pipeline: Any) -> tuple[str, ...]:
    return tuple(type(piece).__name__ for piece in getattr(pipeline, "connectors", ()))


def fused_sampling_applies(runner: Any, *, num_timesteps: int | None, random_actions: bool) -> str:
    """Why the fused path cannot reproduce RLlib's loop for this call (``""``: it can)."""
    config = runner.config
    if num_timesteps is None:
        return "episode-count sampling"
    if random_actions:
        return "random actions"
    if config.count_steps_by != "env_steps":
        return "count_steps_by != 'env_steps'"
    if _piece_names(runner._env_to_module) != _DEFAULT_ENV_TO_MODULE:
        return "custom env-to-module connectors"
    if _piece_names(runner._module_to_env) != _DEFAULT_MODULE_TO_ENV:
        return "custom module-to-env connectors"
    if len(runner.module) != 1:
        return "more than one RLModule"
    module = next(iter(runner.module.values()))
    if module.is_stateful():
        return "a recurrent (stateful) RLModule"
    for callback in runner._callbacks:
        for name in _PER_STEP_CALLBACKS:
            if getattr(type(callback), name) is not getattr(RLlibCallback, name):
                return f"callback {type(callback).__name__}.{name}"
    for name in _PER_STEP_CALLBACKS:
        if getattr(config, f"callbacks_{name}", None):
            return f"config callbacks_{name}"
    return ""


@dataclass
class EnvTrack:
    """One env's episode chunk in progress: per step array views, no per-agent dicts.

    ``obs``/``avail``/``state``/``infos`` have one entry more than the per-action lists (the
    observation after the last action). ``lookback`` is the last step of the previous chunk of
    the same episode (continued chunks only), as ``cut(len_lookback_buffer=1)`` keeps it.
    """

    episode_id: str
    env_t_started: int
    obs: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, obs_dim]`` per observation."""
    avail: list[np.ndarray] = field(default_factory=list)
    """``float32 [N, A]`` per observation."""
    state: list[np.ndarray] = field(default_factory=list)
    """``float32 [state_dim]`` per observation (only with ``include_state``)."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    """``int64 [N]`` per step."""
    logp: list[np.ndarray] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    weights_seq_no: list[int] = field(default_factory=list)
    lookback: dict[str, Any] | None = None

    def continuation(self) -> EnvTrack:
        """The next chunk of this episode (needs >= 1 step): ``cut(len_lookback_buffer=1)``.

        The new chunk starts at this chunk's last observation; its lookback holds the
        observation before it and the action / reward / model outputs that led from one to the
        other.
        """
        last = {
            "obs": self.obs[-2],
            "avail": self.avail[-2],
            "state": self.state[-2] if self.state else None,
            "info": self.infos[-2],
            "action": self.actions[-1],
            "logp": self.logp[-1],
            "logits": self.logits[-1],
            "reward": self.rewards[-1],
            "weights_seq_no": self.weights_seq_no[-1],
        }
        return EnvTrack(
            episode_id=self.episode_id,
            env_t_started=self.env_t_started + len(self.actions),
            obs=[self.obs[-1]],
            avail=[self.avail[-1]],
            state=[self.state[-1]] if self.state else [],
            infos=[self.infos[-1]],
            lookback=last,
        )


def _obs_dict(
    agents: Sequence[str], obs: np.ndarray, avail: np.ndarray, state: np.ndarray | None
) -> dict[str, dict[str, np.ndarray]]:
    if state is None:
        return {a: {"observations": obs[i], "action_mask": avail[i]} for i, a in enumerate(agents)}
    return {
        a: {"observations": obs[i], "action_mask": avail[i], "state": state}
        for i, a in enumerate(agents)
    }


def build_chunk(
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

    The first observation of a continued chunk (and the previous step's action, reward and
    model outputs) go into a one-step lookback buffer, as ``MultiAgentEpisode.cut()`` does.
    """
    has_state = bool(track.state)
    observations = []
    infos = []
    for t in range(len(track.obs)):
        state = track.state[t] if has_state else None
        observations.append(_obs_dict(agents, track.obs[t], track.avail[t], state))
        info = track.infos[t]
        infos.append({a: dict(info) for a in agents})
    actions, rewards, extra = [], [], []
    steps = [
        (
            track.actions[t],
            track.logp[t],
            track.logits[t],
            track.rewards[t],
            track.weights_seq_no[t],
        )
        for t in range(len(track.actions))
    ]
    lookback = 0
    if track.lookback is not None:
        lb = track.lookback
        steps.insert(
            0, (lb["action"], lb["logp"], lb["logits"], lb["reward"], lb["weights_seq_no"])
        )
        state = lb["state"] if has_state else None
        observations.insert(0, _obs_dict(agents, lb["obs"], lb["avail"], state))
        infos.insert(0, {a: dict(lb["info"]) for a in agents})
        lookback = 1
    for action, logp, logits, reward, seq_no in steps:
        actions.append({a: action[i] for i, a in enumerate(agents)})
        rewards.append(dict.fromkeys(agents, reward))
        extra.append(
            {
                a: {
                    Columns.ACTION_DIST_INPUTS: logits[i],
                    Columns.ACTION_LOGP: logp[i],
                    "weights_seq_no": seq_no,
                }
                for i, a in enumerate(agents)
            }
        )
    flags_t = {**dict.fromkeys(agents, terminated), "__all__": terminated}
    flags_u = {**dict.fromkeys(agents, truncated), "__all__": truncated}
    episode = MultiAgentEpisode(
        id_=track.episode_id,
        observations=observations,
        infos=infos,
        actions=actions,
        rewards=rewards,
        extra_model_outputs=extra,
        terminateds=flags_t,
        truncateds=flags_u,
        env_t_started=track.env_t_started,
        agent_t_started=dict.fromkeys(agents, track.env_t_started),
        len_lookback_buffer=lookback,
        observation_space=observation_space,
        action_space=action_space,
        agent_module_ids=dict.fromkeys(agents, module_id),
        agent_to_module_mapping_fn=mapping_fn,
    )
    return episode.to_numpy()
