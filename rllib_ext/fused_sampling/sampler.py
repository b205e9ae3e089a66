"""``SingleAgentFusedSampler``: RLlib's ``SingleAgentEnvRunner._sample``, one batched forward a step.

It owns what a fused rollout carries between ``sample()`` calls: one :class:`~.tracks.Track` per
env, which envs await their reset observation, and the envs' last observations. A step is one
forward over all envs (:func:`~.policy.act`), one ``env.step`` through RLlib's fault-tolerant
``_try_env_step`` and a few appends to the call's :class:`~.tracks.StepLog`; per-env work
happens only where an episode starts or ends, and episode objects are built once per chunk
(:func:`~.chunks.build_single_agent_chunk`). The order of operations, the RNG draws, the counters and the
episode metrics are those of RLlib's loop, for both sampling modes. Exact where
:func:`~.rules.single_agent_rule` says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ext import _rllib_private as private
from rllib_ext.fused.episodes import call_on_episode_end, register_ongoing_chunk
from rllib_ext.fused_sampling.chunks import build_single_agent_chunk
from rllib_ext.fused_sampling.metrics import log_connector_metrics
from rllib_ext.fused_sampling.policy import act
from rllib_ext.fused_sampling.tracks import StepLog, Track

__all__ = ["SingleAgentFusedSampler"]


class SingleAgentFusedSampler:
    """The fused loop of one ``SingleAgentEnvRunner`` (``runner``)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.tracks: list[Track] | None = None
        """Per env: its episode chunk in progress (``None``: nothing in progress)."""
        self.awaiting_reset: np.ndarray | None = None
        """``bool [N]``: the env's episode ended; its next step returns the reset observation."""
        self.observations: np.ndarray | None = None
        """The envs' last observations ``[N, ...]`` (the next forward's input)."""
        self.ended_len: dict[int, tuple[int, int]] = {}
        """This call, per env: ``(log length, episode length)`` when its last episode ended."""

    @property
    def active(self) -> bool:
        """Whether episodes are in progress (the next time-step call continues them)."""
        return self.tracks is not None

    def drop(self) -> None:
        """Forgets the episodes in progress (the next call, fused or not, resets the envs)."""
        self.tracks = self.awaiting_reset = self.observations = None

    def sample(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        force_reset: bool,
    ) -> list[SingleAgentEpisode]:
        """``num_timesteps`` env steps (or ``num_episodes`` whole episodes) of all envs, as
        RLlib's numpy'd episode chunks: the finished ones, then (time steps only) one
        continued chunk per running episode."""
        runner = self.runner
        log = StepLog()
        self.ended_len = {}
        if (
            force_reset
            or num_episodes is not None
            or self.tracks is None
            or private.needs_initial_reset(runner)
        ):
            self._reset(log)
        if num_episodes is not None:
            private.set_needs_initial_reset(runner, True)
        done: list[SingleAgentEpisode] = []
        with _eval_mode(runner.module):
            ts = self._loop(log, done, num_timesteps, num_episodes, explore=explore)
        log_connector_metrics(
            runner,
            forwards=len(log.timing),
            to_module_s=sum(t[0] for t in log.timing),
            to_env_s=sum(t[1] for t in log.timing),
            episodes_length=self._episodes_length(log),
        )
        private.done_episodes_for_metrics(runner).extend(done)
        ongoing: list[SingleAgentEpisode] = []
        if num_timesteps is not None:
            ongoing = self._continue_chunks(log)
        private.log_env_steps_sampled(runner, ts)
        private.increase_sampled_metrics(runner, ts, len(done))
        if num_episodes is not None:
            self.drop()
        return done + ongoing

    def _loop(
        self,
        log: StepLog,
        done: list[SingleAgentEpisode],
        num_timesteps: int | None,
        num_episodes: int | None,
        *,
        explore: bool,
    ) -> int:
        """RLlib's ``while`` loop: steps all envs until the call's env steps (or episodes) are
        taken, appending finished episodes to ``done``; returns the env steps taken."""
        runner = self.runner
        ts = eps = 0
        while (ts < num_timesteps) if num_timesteps is not None else (eps < (num_episodes or 0)):
            assert self.observations is not None  # set by _reset
            step = act(runner, self.observations, explore=explore, env_ts=ts)
            # RLlib's fault-tolerant step: a seam profilers time as "env_step" themselves.
            results = private.try_env_step(runner, step.actions_for_env)
            if results is ENV_STEP_FAILURE:  # RLlib re-created the env: start over
                ts = 0
                self._reset(log)
                continue
            observations, rewards, terminateds, truncateds, infos = results
            tracks, awaiting = self.tracks, self.awaiting_reset
            assert tracks is not None and awaiting is not None
            s = len(log)
            log.obs.append(observations)
            log.infos.append(infos)
            log.actions.append(step.actions)
            log.rewards.append(rewards)
            log.extra.append(step.extra)
            log.weights_seq_no.append(step.weights_seq_no)
            log.timing.append((step.to_module_s, step.to_env_s))
            now = time.perf_counter()
            log.times.append(now)
            self.observations = observations
            # Envs that awaited a reset got their reset observation: no step counted.
            for i in np.flatnonzero(awaiting):
                tracks[i].reset(observations[i], infos[i], first=s + 1, time=now)
            stepped = ~awaiting
            ts += int(stepped.sum())
            ended = np.flatnonzero(stepped & (np.asarray(terminateds) | np.asarray(truncateds)))
            awaiting[:] = False
            for i in ended:
                eps += 1
                track = tracks[i]
                track.end = s + 1
                episode = self._chunk(
                    track,
                    log,
                    track.items(log, int(i)),
                    terminated=bool(terminateds[i]),
                    truncated=bool(truncateds[i]),
                )
                call_on_episode_end(runner, episode, env_index=int(i), env=runner.env.unwrapped)
                done.append(episode.to_numpy())  # RLlib: the callback, then numpy
                self.ended_len[int(i)] = (s + 1, len(episode))
                tracks[i] = Track()
                awaiting[i] = True
                if num_episodes is not None and eps >= num_episodes:
                    break
        return ts

    def _episodes_length(self, log: StepLog) -> int:
        """The summed length of the envs' episode chunks after the call's last step (an
        episode that ended on it counted whole), as RLlib's last env-to-module run saw them."""
        total = 0
        for i, track in enumerate(self.tracks or ()):
            at, length = self.ended_len.get(i, (-1, 0))
            if at == len(log):
                total += length
            elif track.is_reset:
                total += track.steps(log)
        return total

    def _reset(self, log: StepLog) -> None:
        """RLlib's ``_reset_envs_and_episodes``: new episodes, the envs reset (seeded on the
        first reset); the new episodes' steps start at the log's next step."""
        runner = self.runner
        private.ongoing_episodes_for_metrics(runner).clear()
        seed = private.runner_seed(runner) if private.needs_initial_reset(runner) else None
        observations, infos = private.try_env_reset(runner, seed=seed)
        now = time.perf_counter()
        self.tracks = [Track() for _ in range(runner.num_envs)]
        for i, track in enumerate(self.tracks):
            track.reset(observations[i], infos[i], first=len(log), time=now)
        self.awaiting_reset = np.zeros(runner.num_envs, dtype=bool)
        self.observations = observations
        private.set_needs_initial_reset(runner, False)

    def _continue_chunks(self, log: StepLog) -> list[SingleAgentEpisode]:
        """The running episodes' chunks (registered for the episode metrics), each continued
        in a new track; episodes not stepped yet are continued but not returned."""
        runner, tracks = self.runner, self.tracks
        assert tracks is not None
        lookback = runner.config.episode_lookback_horizon
        ongoing = []
        for i, track in enumerate(tracks):
            if not track.is_reset:
                continue  # RLlib cuts it into another empty episode: the same Track
            items, steps = track.items(log, i), track.steps(log)
            if track.t_started + steps > 0:
                chunk = self._chunk(track, log, items, terminated=False, truncated=False)
                register_ongoing_chunk(runner, chunk)
                ongoing.append(chunk.to_numpy())
            tracks[i] = track.continuation(items, steps, lookback)
        return ongoing

    def _chunk(
        self,
        track: Track,
        log: StepLog,
        items: dict[str, Any],
        *,
        terminated: bool,
        truncated: bool,
    ) -> SingleAgentEpisode:
        env = self.runner.env
        start_time, last_step_time = track.clock(log)
        return build_single_agent_chunk(
            track,
            items,
            terminated=terminated,
            truncated=truncated,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            start_time=start_time,
            last_step_time=last_step_time,
        )


@contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """``module`` in eval mode for the block (RLlib's forwards switch it per call)."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        if was_training:
            module.train()
