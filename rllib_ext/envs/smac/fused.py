"""Array-speed sampling for :class:`rllib_ext.envs.smac.env_runner.SMAXVectorEnvRunner`.

RLlib's ``MultiAgentEnvRunner`` turns every env step into per-agent dicts, runs both connector
pipelines over them and appends to each ``MultiAgentEpisode`` agent by agent (about 70 us per
env step of 8 agents here, before the env and the forward pass). This module keeps a rollout as
arrays instead: one forward pass over all agents of all envs (``[E * N]`` rows), the action
distribution sampled once, the vector env stepped with an ``int [E, N]`` array, and per env
Python lists of array views. Episode chunks are built from per-agent array slices through
RLlib's public ``SingleAgentEpisode`` constructor and ``MultiAgentEpisode.from_state`` (its
``get_state()`` layout), so the learner receives the same numpy'd objects (same columns:
observations, actions, rewards, infos, ``action_dist_inputs``, ``action_logp``,
``weights_seq_no``; terminated/truncated; ids and ``env_t_started`` continuing across
``sample()`` calls; a one-step lookback on continued chunks like ``cut()``).

A recurrent (stateful) module gets what RLlib's ``AddTimeDimToBatchAndZeroPad`` /
``AddStatesFromEpisodesToBatch`` / ``RemoveSingleTsTimeRankFromBatch`` give it: inputs with a
``T=1`` axis, ``Columns.STATE_IN`` rows = each agent's last ``STATE_OUT`` (the module's initial
state at an episode's first step), and every step's ``STATE_OUT`` kept in the episode's
``extra_model_outputs`` (the learner starts its ``max_seq_len`` chunks from them).

What RLlib's default connector pieces would do is done here directly, which is exact only for
what :func:`fused_sampling_applies` checks: the default env-to-module / module-to-env pipelines
(plus ``amp_inference``'s ``CastToFloat32``: the fused loop casts the module's outputs alike),
one module for all agents, on the CPU, returning only ``action_dist_inputs`` (and
``state_out``; other outputs are found by the first forward of a call, which then hands the call
to RLlib's loop, which keeps them in the episodes), no ``on_episode_created/start/step``
callbacks (the batched path calls ``on_episode_end`` only, with the battle's ``env_index``),
time-step sampling (``num_timesteps``) counted in env steps, RLlib's default one-step
``episode_lookback_horizon`` and numpy'd episodes (``episodes_to_numpy=True``, the default).
Otherwise the runner falls back to RLlib's loop. RLlib's ``env_reset_timer`` and
``env_step_timer`` are logged too (the latter: how long each step of all battles blocked the
loop, the rest of the step overlapping the bookkeeping).
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import tree
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.numpy import convert_to_numpy

from rllib_ext import _rllib_private as private
from rllib_ext.env_runners import CastToFloat32
from rllib_ext.profiling.env_runner import PipelineMark

__all__ = [
    "EnvTrack",
    "build_chunk",
    "fused_sampling_applies",
    "gc_paused",
    "initial_state_rows",
]

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
    # Profiling's marks only pass the batch through (rllib_ext.profiling.env_runner);
    # amp_inference's cast to float32 is applied by the fused loop itself.
    pieces = getattr(pipeline, "connectors", ())
    return tuple(
        type(p).__name__ for p in pieces if not isinstance(p, (PipelineMark, CastToFloat32))
    )


def fused_sampling_applies(runner: Any, *, num_timesteps: int | None, random_actions: bool) -> str:
    """Why the fused path cannot reproduce RLlib's loop for this call (``""``: it can)."""
    config = runner.config
    if num_timesteps is None:
        return "episode-count sampling"
    if random_actions:
        return "random actions"
    if config.count_steps_by != "env_steps":
        return "count_steps_by != 'env_steps'"
    if _piece_names(private.env_to_module(runner)) != _DEFAULT_ENV_TO_MODULE:
        return "custom env-to-module connectors"
    if _piece_names(private.module_to_env(runner)) != _DEFAULT_MODULE_TO_ENV:
        return "custom module-to-env connectors"
    if not config.episodes_to_numpy:  # the fused loop builds numpy'd chunks only
        return "episodes_to_numpy=False"
    if config.episode_lookback_horizon != 1:
        # EnvTrack.continuation keeps one step of lookback, as RLlib's default cut does.
        return f"episode_lookback_horizon={config.episode_lookback_horizon} (fused: 1)"
    if len(runner.module) != 1:
        return "more than one RLModule"
    for rl_module in runner.module.values():
        param = next(rl_module.parameters(), None)
        if param is not None and param.device.type != "cpu":  # fused inputs are CPU tensors
            return f"RLModule on {param.device}"
    for callback in private.runner_callbacks(runner):
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


REWARD_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)
"""The space ``SingleAgentEpisode`` gives a rewards buffer it builds from a list (RLlib's loop)."""


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


def initial_state_rows(rl_module: Any, reset_rows: np.ndarray, state: Any) -> Any:
    """``state`` (a (nested) dict of ``[R, ...]`` arrays, or ``None``) with the rows in
    ``reset_rows`` (``bool [R]``) set to the module's initial state (all rows when ``None``)."""
    if state is not None and not reset_rows.any():
        return state
    initial = convert_to_numpy(rl_module.get_initial_state())
    if state is None:
        return tree.map_structure(
            lambda x: np.repeat(np.asarray(x)[None], reset_rows.shape[0], axis=0), initial
        )

    def reset(x: np.ndarray, init: Any) -> np.ndarray:
        x = np.array(x)  # writable copy (torch outputs may share memory)
        x[reset_rows] = init
        return x

    return tree.map_structure(reset, state, initial)


@contextmanager
def gc_paused(pause: bool = True) -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (``pause``), back on after it.

    The fused loop allocates many small objects (per-step array views, per-chunk buffers), which
    triggers collections that scan every live object, including the call's episode tracks.
    Reference counting still frees everything without cycles; a cycle made inside the block is
    collected by the first collection after it. A collector the caller has switched off stays
    off.
    """
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
