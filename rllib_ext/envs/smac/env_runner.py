"""``SMAXVectorEnvRunner``: RLlib's ``MultiAgentEnvRunner`` over one :class:`SMAXVectorEnv`.

Selected by :func:`use_smax_vector_env_runner` (called from ``rllib_ext.PPOConfig.validate``)
when the env is SMAC on the SMAX backend and ``num_envs_per_env_runner > 1``: the runner's
``num_envs_per_env_runner`` battles are stepped by one jitted, vmapped call instead of RLlib's
``SyncVectorMultiAgentEnv`` loop over ``SMACEnv`` copies. Everything else (episodes,
connectors, callbacks, metrics) is RLlib's. StarCraft II backends keep RLlib's runner.

Visible in the results as ``env_runners/smax_batched_envs`` (battles per compiled call) and
``env_runners/smax_fused_groups`` (groups of battles the fused loop alternates between).
``amp_inference=True`` keeps this runner: it is an ``AMPMultiAgentEnvRunner`` (the forward runs
under the learner's autocast dtype, its outputs cast back to float32 before actions and
``action_logp`` are computed).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Literal, NamedTuple, cast

import numpy as np
import torch
import tree
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core.columns import Columns
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RESET_TIMER,
    ENV_STEP_TIMER,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    RLMODULE_INFERENCE_TIMER,
)
from ray.rllib.utils.numpy import convert_to_numpy

from rllib_ext import _rllib_private as private
from rllib_ext.env_runners import AMPMultiAgentEnvRunner, to_float32
from rllib_ext.envs.smac.factory import smax_env_config
from rllib_ext.envs.smac.fused import (
    EnvTrack,
    build_chunk,
    fused_sampling_applies,
    gc_paused,
    initial_state_rows,
)
from rllib_ext.envs.smac.vector import SMAXBatch, SMAXVectorEnv
from rllib_ext.profiling.env_runner import sample_phase

__all__ = [
    "SMAX_BATCHED_METRIC",
    "SMAXVectorEnvRunner",
    "smax_env_config",
    "use_smax_vector_env_runner",
]

logger = logging.getLogger(__name__)

SMAX_BATCHED_METRIC = "smax_batched_envs"
"""``env_runners/<this>``: battles stepped per compiled call (0: not the batched path)."""
SMAX_FUSED_METRIC = "smax_fused_sampling"
"""``env_runners/<this>``: 1 when the last ``sample()`` ran the array-speed path."""
SMAX_GROUPS_METRIC = "smax_fused_groups"
"""``env_runners/<this>``: groups of battles the fused loop alternates between."""


def use_smax_vector_env_runner(config: AlgorithmConfig) -> bool:
    """Sets ``config.env_runner_cls`` to :class:`SMAXVectorEnvRunner` where it applies.

    Applies when the env runs on SMAX, ``num_envs_per_env_runner > 1``, the config is
    multi-agent and the user chose no env-runner class (``AMPMultiAgentEnvRunner``, which
    ``amp_inference=True`` picks, counts as no choice: this runner is one). Idempotent; an
    earlier automatic choice is undone when the config no longer qualifies. Returns whether
    the batched runner is selected.
    """
    chosen = config.env_runner_cls
    if chosen not in (None, SMAXVectorEnvRunner, AMPMultiAgentEnvRunner):
        return False
    wanted = (
        config.num_envs_per_env_runner > 1
        and config.is_multi_agent
        and smax_env_config(config.env, config.env_config) is not None
    )
    if not wanted and chosen is AMPMultiAgentEnvRunner:
        return False  # amp_inference's runner stays
    config.env_runner_cls = SMAXVectorEnvRunner if wanted else None
    return wanted


_FUSED_MODULE_OUTPUTS = frozenset({Columns.ACTION_DIST_INPUTS, Columns.STATE_OUT})
"""What the fused loop turns into episode data (RLlib's loop keeps any other output too)."""


class _UnfusedModuleOutputs(Exception):
    """The module returned outputs the fused loop does not record; raised by the first forward
    of a ``sample()`` call, before that step is handed to JAX."""


class _Step(NamedTuple):
    """One env step of the fused loop, waiting to be recorded into the tracks: the outcome
    ``new`` (``states``: its agents' ``"state"`` entries ``[E, N, D]`` or ``None``) of the
    ``actions`` ``int32 [E, N]`` (``logp [E, N]``, ``logits [E, N, A]``, recurrent ``state_out``
    rows ``[E * N, ...]`` or ``None``) under weights ``weights_seq_no``."""

    new: SMAXBatch
    states: np.ndarray | None
    actions: np.ndarray
    logp: np.ndarray
    logits: np.ndarray
    state_out: Any
    weights_seq_no: int


class SMAXVectorEnvRunner(AMPMultiAgentEnvRunner):
    """``MultiAgentEnvRunner`` whose vector env is one :class:`SMAXVectorEnv` (with
    ``amp_inference`` support, see :class:`rllib_ext.env_runners.AMPMultiAgentEnvRunner`).

    With ``fused_sampling`` (default on, ``config.env_config`` is untouched: the switch is the
    runner attribute ``fused_sampling``), time-step sampling runs as arrays (see
    :mod:`rllib_ext.envs.smac.fused`) whenever :func:`fused_sampling_applies`; otherwise, and
    for episode-count sampling (evaluation), RLlib's own loop runs over the same vector env
    (one INFO line per reason). A recurrent (stateful) module samples on the fused path too, its
    state carried as ``[E * N, ...]`` arrays exactly as RLlib's connectors would carry it.
    ``env_runners/smax_fused_sampling`` is 1 when the last ``sample()`` took the fused path.
    The fused loop records each step into its episode tracks while JAX runs the next one
    (:meth:`SMAXVectorEnv.start_step` / :meth:`SMAXVectorEnv.finish_step`).
    """

    fused_sampling: bool = True
    pause_gc: bool = True
    """The fused loop runs with Python's cyclic garbage collector paused (:func:`gc_paused`);
    its collections over the call's live episode tracks cost about 14% of the loop on
    3s5z_vs_3s6z (benchmarks/README.md). False: the collector runs as configured."""
    fused_groups: int | Literal["auto"] = "auto"
    """Groups of battles the fused loop alternates between (:class:`SMAXVectorEnv`'s
    ``num_groups``): while JAX steps one group, the policy runs for the next. ``"auto"``: 2 for
    large batches (:data:`rllib_ext.envs.smac.vector.AUTO_GROUP_ROWS`), else 1. Set before the
    env is built (class or instance attribute; ``make_env()`` rebuilds)."""
    env: SMAXVectorEnv | None

    @override(AMPMultiAgentEnvRunner)
    def __init__(self, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self._tracks: list[EnvTrack | None] | None = None
        self._recurrent_state: list[Any] = []
        """Recurrent modules on the fused path, per group of envs: the next ``STATE_IN``, a
        (nested) dict of ``[group_size * N, ...]`` arrays (row ``e * N + i``: agent ``i`` of the
        group's env ``e``)."""
        self._fused_last = False
        self._fallbacks_logged: set[str] = set()
        self._unfused_outputs = ""
        """Why the module's outputs keep this runner on RLlib's loop (``""``: they do not)."""

    @property
    def vector_env(self) -> SMAXVectorEnv:
        """The runner's :class:`SMAXVectorEnv`."""
        if self.env is None:
            raise ValueError("The SMAX vector env is not built (or closed). Fix: make_env().")
        return self.env

    @override(MultiAgentEnvRunner)
    def make_env(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
        env_config = smax_env_config(self.config.env, self.config.env_config)
        if env_config is None:
            raise ValueError(
                f"SMAXVectorEnvRunner needs a SMAC env on the SMAX backend, got env="
                f"{self.config.env!r} with env_config={dict(self.config.env_config)!r}. Fix: "
                "use env 'smax' (or backend='smax'), or leave env_runner_cls unset so "
                "rllib_ext picks RLlib's MultiAgentEnvRunner for StarCraft II."
            )
        self.env = SMAXVectorEnv(
            env_config,
            num_envs=self.config.num_envs_per_env_runner,
            worker_index=self.worker_index or 0,
            num_groups=self.fused_groups,
        )
        self.num_envs = self.env.num_envs
        private.set_needs_initial_reset(self, True)
        env_ctx = EnvContext(
            env_config,
            worker_index=self.worker_index,
            num_workers=self.config.num_env_runners,
            remote=self.config.remote_worker_envs,
        )
        make_callback(
            "on_environment_created",
            callbacks_objects=private.runner_callbacks(self),
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs=dict(
                env_runner=self,
                metrics_logger=self.metrics,
                env=self.env,
                env_context=env_ctx,
            ),
        )

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        episodes = super().sample(*args, **kwargs)
        self.metrics.log_value(SMAX_BATCHED_METRIC, self.num_envs, window=1)
        self.metrics.log_value(SMAX_FUSED_METRIC, float(self._fused_last), window=1)
        self.metrics.log_value(SMAX_GROUPS_METRIC, self.vector_env.num_groups, window=1)
        return episodes

    @override(MultiAgentEnvRunner)
    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[MultiAgentEpisode]:
        why_not = (
            "fused_sampling=False"
            if not self.fused_sampling
            else self._unfused_outputs
            or fused_sampling_applies(
                self, num_timesteps=num_timesteps, random_actions=random_actions
            )
        )
        if not why_not:
            self._fused_last = True
            assert num_timesteps is not None  # fused_sampling_applies: time-step sampling only
            try:
                with gc_paused(self.pause_gc):
                    return self._sample_fused(
                        num_timesteps, explore=explore, force_reset=force_reset
                    )
            except _UnfusedModuleOutputs as err:  # from the first forward: RLlib's loop instead
                self._unfused_outputs = why_not = str(err)
                self._tracks = None
                force_reset = True
            except BaseException:
                # Steps may be left in flight and tracks half recorded: the next call resets.
                self._tracks = None
                raise
        if self._tracks is not None:  # leaving the fused path: RLlib's loop starts afresh
            self._tracks = None
            force_reset = True
        self._fused_last = False
        if why_not in self._fallbacks_logged:
            logger.debug("SMAX fused sampling off for this call: %s", why_not)
        else:  # once per reason, e.g. a recurrent module: RLlib's loop carries its state
            self._fallbacks_logged.add(why_not)
            logger.info(
                "SMAX batched stepping: sampling with RLlib's MultiAgentEnvRunner loop "
                "(array-speed sampling is off: %s).",
                why_not,
            )
        return super()._sample(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )

    # ------------------------------------------------------------------ fused path
    def _new_track(self, batch: SMAXBatch, states: np.ndarray | None, e: int) -> EnvTrack:
        """A new episode in env ``e``, starting at its reset observation in ``batch``
        (``states``: the agents' ``"state"`` entries ``[E, N, D]``, or ``None``)."""
        track = EnvTrack(
            episode_id=uuid.uuid4().hex,
            agent_episode_ids={
                agent: uuid.uuid4().hex for agent in self.vector_env.possible_agents
            },
            env_t_started=0,
            start_time=time.perf_counter(),
        )
        track.obs.append(batch.obs[e])
        track.avail.append(batch.avail[e])
        if states is not None:
            track.state.append(states[e])
        track.infos.append({})
        return track

    def _chunk(self, track: EnvTrack, *, terminated: bool, truncated: bool) -> MultiAgentEpisode:
        env = self.vector_env
        return build_chunk(
            track,
            agents=env.possible_agents,
            terminated=terminated,
            truncated=truncated,
            observation_space=env.single_observation_spaces,
            action_space=env.single_action_spaces,
            module_id=self._module_id,
            mapping_fn=self.config.policy_mapping_fn,
        )

    def _sample_fused(
        self, num_timesteps: int, *, explore: bool, force_reset: bool
    ) -> list[MultiAgentEpisode]:
        env = self.vector_env
        n_groups, size, n_agents = env.num_groups, env.group_size, len(env.possible_agents)
        tracks = self._tracks
        initial = private.needs_initial_reset(self)
        reset = force_reset or tracks is None or env.last is None or initial
        if reset:
            with self.metrics.log_time(ENV_RESET_TIMER):
                env.reset_arrays(seed=private.runner_seed(self) if initial else None)
            private.set_needs_initial_reset(self, False)
            private.ongoing_episodes_for_metrics(self).clear()
        batches = [env.group_batch(g) for g in range(n_groups)]
        # Per group: the agents' "state" entries [group_size, N, D] (None: no state).
        states = [self._agent_states(b) for b in batches]
        self._module_id = next(iter(self.module.keys()))
        rl_module = self.module[self._module_id]
        if reset or tracks is None:
            tracks = self._tracks = [
                self._new_track(batches[g], states[g], e)
                for g in range(n_groups)
                for e in range(size)
            ]
            self._recurrent_state = [
                initial_state_rows(rl_module, np.ones(size * n_agents, dtype=bool), None)
                if rl_module.is_stateful()
                else None
                for _ in range(n_groups)
            ]
        done: list[MultiAgentEpisode] = []
        env_ts = 0
        # Per group: the step handed to JAX, waiting for its outcome (actions, logp, logits,
        # state_out, weights_seq_no).
        in_flight: list[tuple[Any, ...] | None] = [None] * n_groups
        while env_ts < num_timesteps:
            waited = 0.0  # for RLlib's env_step_timer: what the step of all envs blocked us
            for g in range(n_groups):
                finished = None
                if in_flight[g] is not None:
                    start = time.perf_counter()
                    finished = self._finish_group(g, cast(tuple[Any, ...], in_flight[g]))
                    waited += time.perf_counter() - start
                    batches[g], states[g] = finished.new, finished.states
                in_flight[g], stepped = self._act_and_start(
                    g, batches[g], states[g], explore=explore, env_ts=env_ts
                )
                env_ts += stepped
                # JAX steps this group (and the other groups) meanwhile: record the step before.
                if finished is not None:
                    done += self._record_step(tracks, finished, offset=g * size)
            if waited:
                self.metrics.log_value(ENV_STEP_TIMER, waited, reduce="ema")
        for g in range(n_groups):
            if in_flight[g] is not None:
                finished = self._finish_group(g, cast(tuple[Any, ...], in_flight[g]))
                done += self._record_step(tracks, finished, offset=g * size)
        ongoing: list[MultiAgentEpisode] = []
        for e, pending in enumerate(tracks):
            if pending is None:
                continue  # a finished episode
            if pending.steps == 0:  # just reset: nothing to return yet (RLlib cuts it, though)
                pending.carried_unstepped = True
                pending.start_time = None
                continue
            chunk = self._chunk(pending, terminated=False, truncated=False)
            private.ongoing_episodes_for_metrics(self)[chunk.id_].append(chunk)
            ongoing.append(chunk)
            tracks[e] = pending.continuation()
        private.done_episodes_for_metrics(self).extend(done)
        self._log_fused_counts(env_ts, len(done))
        return done + ongoing

    def _finish_group(self, group: int, started: tuple[Any, ...]) -> _Step:
        """Waits for ``group``'s step (``started``: what :meth:`_act_and_start` returned for it)
        and returns it as a :class:`_Step`; recurrent modules: envs reset in this step start
        their next episode from the initial state."""
        with sample_phase(self, "env_step"):
            new = self.vector_env.finish_step(group=group)
        finished = _Step(new, self._agent_states(new), *started)
        if finished.state_out is not None:
            n_agents = len(self.vector_env.possible_agents)
            self._recurrent_state[group] = initial_state_rows(
                self.module[self._module_id],
                np.repeat(new.was_reset, n_agents),
                finished.state_out,
            )
        return finished

    def _agent_states(self, batch: SMAXBatch) -> np.ndarray | None:
        env = self.vector_env
        return env.agent_states(batch) if env.settings.include_state else None

    def _act_and_start(
        self, group: int, batch: SMAXBatch, states: np.ndarray | None, *, explore: bool, env_ts: int
    ) -> tuple[tuple[Any, ...], int]:
        """One forward pass over all agents of ``group``'s envs, its actions handed to JAX
        (:meth:`SMAXVectorEnv.start_step`). Returns what :class:`_Step` needs besides the
        outcome, and the env steps this step counts (envs being reset do not count)."""
        env, module_id = self.vector_env, self._module_id
        rl_module = self.module[module_id]
        n_envs, n_agents = batch.obs.shape[:2]
        rows = n_envs * n_agents
        obs = {
            "observations": torch.from_numpy(batch.obs.reshape(rows, -1)),
            "action_mask": torch.from_numpy(batch.avail.reshape(rows, -1)),
        }
        if states is not None:
            obs["state"] = torch.from_numpy(states.reshape(rows, -1))
        module_inputs: dict[str, Any] = {Columns.OBS: obs}
        stateful = rl_module.is_stateful()
        if stateful:
            # RLlib's AddTimeDimToBatchAndZeroPad / AddStatesFromEpisodesToBatch: T=1.
            module_inputs[Columns.OBS] = {k: v.unsqueeze(1) for k, v in obs.items()}
            module_inputs[Columns.STATE_IN] = tree.map_structure(
                torch.from_numpy, self._recurrent_state[group]
            )
        module_batch = {module_id: module_inputs}
        dist_cls = (
            rl_module.get_exploration_action_dist_cls()
            if explore
            else rl_module.get_inference_action_dist_cls()
        )
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER), sample_phase(self, "inference"):
            if explore:
                # RLlib's global step estimate (for exploration schedules).
                runners = self.config.num_env_runners or 1
                t = (self.num_env_steps_sampled_lifetime // runners + env_ts) * runners
                out = self.module.forward_exploration(module_batch, t=t)
            else:
                out = self.module.forward_inference(module_batch)
            # amp_inference's CastToFloat32: actions and logp from float32 logits.
            module_out = to_float32(out[module_id])
            extra = module_out.keys() - _FUSED_MODULE_OUTPUTS
            if extra:  # RLlib would keep them in the episodes; this loop has no place for them
                raise _UnfusedModuleOutputs(f"the RLModule also outputs {sorted(extra)}")
            logits = module_out[Columns.ACTION_DIST_INPUTS]
            if stateful:  # RemoveSingleTsTimeRankFromBatch
                logits = logits[:, 0]
            dist = dist_cls.from_logits(logits)
            if not explore:
                dist = dist.to_deterministic()
            actions = dist.sample()
            logp = dist.logp(actions)
        # RLlib's TensorToNumpy piece: the same conversion (int64 -> int32, float -> float32).
        actions_np, logp_np, logits_np = convert_to_numpy((actions, logp, logits))
        actions_np = actions_np.reshape(n_envs, n_agents)
        state_out = convert_to_numpy(module_out[Columns.STATE_OUT]) if stateful else None
        with sample_phase(self, "env_step"):
            was_reset = env.start_step(actions_np, group=group)
        step = (
            actions_np,
            logp_np.reshape(n_envs, n_agents),
            logits_np.reshape(n_envs, n_agents, -1),
            state_out,
            private.weights_seq_no(self),
        )
        return step, n_envs - int(was_reset.sum())

    def _record_step(
        self, tracks: list[EnvTrack | None], step: _Step, *, offset: int
    ) -> list[MultiAgentEpisode]:
        """Appends ``step`` (of the envs ``offset, offset + 1, ...``) to their tracks (a reset
        env starts a new one) and returns the episodes it ended, as chunks (``on_episode_end``
        called for each)."""
        env, new, n_agents = self.vector_env, step.new, len(self.vector_env.possible_agents)
        done: list[MultiAgentEpisode] = []
        now = time.perf_counter()
        for e in range(new.was_reset.shape[0]):
            if new.was_reset[e]:
                tracks[offset + e] = self._new_track(new, step.states, e)
                continue
            # None only right after an episode ended, and then this env was reset above.
            track = cast(EnvTrack, tracks[offset + e])
            track.actions.append(step.actions[e])
            track.logp.append(step.logp[e])
            track.logits.append(step.logits[e])
            track.rewards.append(float(new.reward[e]) * env.reward_scale)
            track.weights_seq_no.append(step.weights_seq_no)
            track.obs.append(new.obs[e])
            track.avail.append(new.avail[e])
            if step.states is not None:
                track.state.append(step.states[e])
            if step.state_out is not None:
                agents = slice(e * n_agents, (e + 1) * n_agents)
                track.state_out.append(
                    tree.map_structure(lambda x, rows_e=agents: x[rows_e], step.state_out)
                )
            term, trunc = bool(new.terminated[e]), bool(new.truncated[e])
            track.infos.append(env.step_info(new, e))
            track.last_step_time = now
            if track.start_time is None:  # RLlib: a cut chunk's clock starts at its first step
                track.start_time = now
            if term or trunc:
                episode = self._chunk(track, terminated=term, truncated=trunc)
                done.append(episode)
                self._on_episode_end(episode, env_index=offset + e)
                tracks[offset + e] = None
        return done

    def _on_episode_end(self, episode: MultiAgentEpisode, *, env_index: int) -> None:
        make_callback(
            "on_episode_end",
            callbacks_objects=private.runner_callbacks(self),
            callbacks_functions=self.config.callbacks_on_episode_end,
            kwargs=dict(
                episode=episode,
                env_runner=self,
                metrics_logger=self.metrics,
                env=self.env,
                rl_module=self.module,
                env_index=env_index,
                prev_episode_chunks=private.ongoing_episodes_for_metrics(self)[episode.id_],
            ),
        )

    def _log_fused_counts(self, env_steps: int, episodes: int) -> None:
        """RLlib's per-step sample counters, logged once with the totals of this call."""
        if env_steps <= 0:
            return
        metrics = self.metrics
        metrics.log_value(NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
        metrics.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps, reduce="lifetime_sum", with_throughput=True
        )
        private.log_env_steps_sampled(self, env_steps)
        if episodes:
            metrics.log_value(NUM_EPISODES, episodes, reduce="sum")
            metrics.log_value(NUM_EPISODES_LIFETIME, episodes, reduce="lifetime_sum")
        for agent in self.vector_env.possible_agents:
            metrics.log_value((NUM_AGENT_STEPS_SAMPLED, agent), env_steps, reduce="sum")
            metrics.log_value(
                (NUM_AGENT_STEPS_SAMPLED_LIFETIME, agent), env_steps, reduce="lifetime_sum"
            )
        module_steps = env_steps * len(self.vector_env.possible_agents)
        metrics.log_value((NUM_MODULE_STEPS_SAMPLED, self._module_id), module_steps, reduce="sum")
        metrics.log_value(
            (NUM_MODULE_STEPS_SAMPLED_LIFETIME, self._module_id),
            module_steps,
            reduce="lifetime_sum",
        )
