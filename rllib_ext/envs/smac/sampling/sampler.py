"""``SMAXFusedSampler``: RLlib's ``MultiAgentEnvRunner._sample`` for SMAX battles, as arrays.

It owns what a fused rollout carries between ``sample()`` calls: one :class:`EnvTrack` per
battle and, for recurrent modules, the next ``STATE_IN`` rows per group. A call steps the
battles group by group (:class:`~rllib_ext.envs.smac.battles.SMAXBattles`), recording one
group's step while JAX runs the next, and returns RLlib's episodes: finished chunks (after
``on_episode_end``) and one continued chunk per running episode, with RLlib's counters, timers
and episode metrics logged on the runner. Exact where :func:`~.rules.smax_rule` says so.
"""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import tree
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
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
)

from rllib_ext import _rllib_private as private
from rllib_ext.envs.smac.battles import SMAXBatch
from rllib_ext.envs.smac.sampling.chunks import build_smax_chunk
from rllib_ext.envs.smac.sampling.policy import initial_state_rows, policy_step
from rllib_ext.envs.smac.sampling.tracks import ActionRecord, EnvTrack, StepRecord
from rllib_ext.fused.episodes import call_on_episode_end, register_ongoing_chunk
from rllib_ext.sampling_protocol import sample_phase

__all__ = ["SMAXFusedSampler", "gc_paused"]


class SMAXFusedSampler:
    """The fused loop of one env runner (``runner``: a ``MultiAgentEnvRunner`` whose ``env`` is
    a :class:`~rllib_ext.envs.smac.vector.SMAXVectorEnv`)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.tracks: list[EnvTrack | None] | None = None
        """Per battle: its episode chunk in progress (``None``: not started, or just ended)."""
        self.recurrent_state: list[Any] = []
        """Recurrent modules, per group: the next ``STATE_IN``, a (nested) dict of
        ``[group_size * N, ...]`` arrays (row ``e * N + i``: agent ``i`` of battle ``e``)."""
        self.module_id = ""

    @property
    def active(self) -> bool:
        """Whether episodes are in progress (the next call continues them)."""
        return self.tracks is not None

    def drop(self) -> None:
        """Forgets the episodes in progress (the next call, fused or not, resets the battles)."""
        self.tracks = None

    def sample(self, num_timesteps: int, *, explore: bool, force_reset: bool) -> list[Any]:
        """At least ``num_timesteps`` env steps of all battles, as RLlib's episode chunks."""
        runner, vector = self.runner, self.runner.vector_env
        battles = vector.battles
        n_groups, size = battles.num_groups, battles.group_size
        initial = private.needs_initial_reset(runner)
        reset = force_reset or self.tracks is None or battles.last is None or initial
        if reset:
            with runner.metrics.log_time(ENV_RESET_TIMER):
                battles.reset_arrays(seed=private.runner_seed(runner) if initial else None)
            private.set_needs_initial_reset(runner, False)
            private.ongoing_episodes_for_metrics(runner).clear()
        batches = [battles.group_batch(g) for g in range(n_groups)]
        states = [battles.agent_states(b) for b in batches]  # [group_size, N, D] or None
        self.module_id = next(iter(runner.module.keys()))
        rl_module = runner.module[self.module_id]
        if reset or self.tracks is None:
            self.tracks = [
                self._new_track(batches[g], states[g], e)
                for g in range(n_groups)
                for e in range(size)
            ]
            rows = np.ones(size * len(vector.possible_agents), dtype=bool)
            self.recurrent_state = [
                initial_state_rows(rl_module, rows, None) if rl_module.is_stateful() else None
                for _ in range(n_groups)
            ]
        tracks = self.tracks
        done: list[MultiAgentEpisode] = []
        env_ts = 0
        in_flight: list[ActionRecord | None] = [None] * n_groups  # per group: handed to JAX
        while env_ts < num_timesteps:
            waited = 0.0  # for RLlib's env_step_timer: what the step of all battles blocked us
            for g in range(n_groups):
                finished = None
                if in_flight[g] is not None:
                    start = time.perf_counter()
                    finished = self._finish_group(g, cast(ActionRecord, in_flight[g]))
                    waited += time.perf_counter() - start
                    batches[g], states[g] = finished.new, finished.states
                taken = policy_step(
                    runner,
                    self.module_id,
                    batches[g],
                    states[g],
                    self.recurrent_state[g],
                    explore=explore,
                    env_ts=env_ts,
                )
                with sample_phase(runner, "env_step"):
                    was_reset = battles.start_step(taken.actions, group=g)
                in_flight[g] = taken
                env_ts += size - int(was_reset.sum())  # battles being reset take no step
                # JAX steps this group (and the other groups) meanwhile: record the step before.
                if finished is not None:
                    done += self._record_step(finished, offset=g * size)
            if waited:
                runner.metrics.log_value(ENV_STEP_TIMER, waited, reduce="ema")
        for g in range(n_groups):
            if in_flight[g] is not None:
                finished = self._finish_group(g, cast(ActionRecord, in_flight[g]))
                done += self._record_step(finished, offset=g * size)
        ongoing: list[MultiAgentEpisode] = []
        for e, pending in enumerate(tracks):
            if pending is None:
                continue  # a finished episode
            if pending.steps == 0:  # just reset: nothing to return yet (RLlib cuts it, though)
                pending.carried_unstepped = True
                pending.start_time = None
                continue
            chunk = self._chunk(pending, terminated=False, truncated=False)
            register_ongoing_chunk(runner, chunk)
            ongoing.append(chunk)
            tracks[e] = pending.continuation()
        private.done_episodes_for_metrics(runner).extend(done)
        self._log_counts(env_ts, len(done))
        return done + ongoing

    def _new_track(self, batch: SMAXBatch, states: np.ndarray | None, e: int) -> EnvTrack:
        """A new episode in battle ``e`` of ``batch``, starting at its reset observation."""
        track = EnvTrack(
            episode_id=uuid.uuid4().hex,
            agent_episode_ids={
                agent: uuid.uuid4().hex for agent in self.runner.vector_env.possible_agents
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
        vector = self.runner.vector_env
        return build_smax_chunk(
            track,
            agents=vector.possible_agents,
            terminated=terminated,
            truncated=truncated,
            observation_space=vector.single_observation_spaces,
            action_space=vector.single_action_spaces,
            module_id=self.module_id,
            mapping_fn=self.runner.config.policy_mapping_fn,
        )

    def _finish_group(self, group: int, taken: ActionRecord) -> StepRecord:
        """Waits for ``group``'s step; recurrent modules: battles reset in it start their next
        episode from the initial state."""
        battles = self.runner.vector_env.battles
        with sample_phase(self.runner, "env_step"):
            new = battles.finish_step(group=group)
        if taken.state_out is not None:
            n_agents = battles.spec.n_agents
            self.recurrent_state[group] = initial_state_rows(
                self.runner.module[self.module_id],
                np.repeat(new.was_reset, n_agents),
                taken.state_out,
            )
        return StepRecord(new, battles.agent_states(new), taken)

    def _record_step(self, step: StepRecord, *, offset: int) -> list[MultiAgentEpisode]:
        """Appends ``step`` (of the battles ``offset, offset + 1, ...``) to their tracks (a reset
        battle starts a new one); returns the episodes it ended (``on_episode_end`` called)."""
        tracks = cast(list[EnvTrack | None], self.tracks)
        battles = self.runner.vector_env.battles
        new, taken, n_agents = step.new, step.taken, battles.spec.n_agents
        done: list[MultiAgentEpisode] = []
        now = time.perf_counter()
        for e in range(new.was_reset.shape[0]):
            if new.was_reset[e]:
                tracks[offset + e] = self._new_track(new, step.states, e)
                continue
            # None only right after an episode ended, and then this battle was reset above.
            track = cast(EnvTrack, tracks[offset + e])
            track.actions.append(taken.actions[e])
            track.logp.append(taken.logp[e])
            track.logits.append(taken.logits[e])
            track.rewards.append(float(new.reward[e]) * battles.reward_scale)
            track.weights_seq_no.append(taken.weights_seq_no)
            track.obs.append(new.obs[e])
            track.avail.append(new.avail[e])
            if step.states is not None:
                track.state.append(step.states[e])
            if taken.state_out is not None:
                agents = slice(e * n_agents, (e + 1) * n_agents)
                track.state_out.append(
                    tree.map_structure(lambda x, rows_e=agents: x[rows_e], taken.state_out)
                )
            term, trunc = bool(new.terminated[e]), bool(new.truncated[e])
            track.infos.append(battles.step_info(new, e))
            track.last_step_time = now
            if track.start_time is None:  # RLlib: a cut chunk's clock starts at its first step
                track.start_time = now
            if term or trunc:
                episode = self._chunk(track, terminated=term, truncated=trunc)
                done.append(episode)
                call_on_episode_end(self.runner, episode, env_index=offset + e, env=self.runner.env)
                tracks[offset + e] = None
        return done

    def _log_counts(self, env_steps: int, episodes: int) -> None:
        """RLlib's per-step sample counters, logged once with the totals of this call."""
        if env_steps <= 0:
            return
        runner, metrics, module_id = self.runner, self.runner.metrics, self.module_id
        metrics.log_value(NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
        metrics.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps, reduce="lifetime_sum", with_throughput=True
        )
        private.log_env_steps_sampled(runner, env_steps)
        if episodes:
            metrics.log_value(NUM_EPISODES, episodes, reduce="sum")
            metrics.log_value(NUM_EPISODES_LIFETIME, episodes, reduce="lifetime_sum")
        agents = runner.vector_env.possible_agents
        for agent in agents:
            metrics.log_value((NUM_AGENT_STEPS_SAMPLED, agent), env_steps, reduce="sum")
            metrics.log_value(
                (NUM_AGENT_STEPS_SAMPLED_LIFETIME, agent), env_steps, reduce="lifetime_sum"
            )
        module_steps = env_steps * len(agents)
        metrics.log_value((NUM_MODULE_STEPS_SAMPLED, module_id), module_steps, reduce="sum")
        metrics.log_value(
            (NUM_MODULE_STEPS_SAMPLED_LIFETIME, module_id), module_steps, reduce="lifetime_sum"
        )


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
