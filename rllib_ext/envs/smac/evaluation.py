"""Fresh SMAX battles played at array speed by a trained policy: :func:`play_battles`.

Contract: battle ``i`` of a call with ``seed=s`` is the battle a single
:class:`~rllib_ext.envs.smac.SMACEnv` (same ``env_config``) plays after ``reset(seed=s + i)``;
battles ``i = 0 .. episodes - 1`` are played in rounds of ``E`` (the runner's
``num_envs_per_env_runner``) stepped by one compiled call per step. Each slot of a round plays
exactly one battle from its reset to its end, whatever its length, so short battles are not
over-counted (sampling "the first ``episodes`` episodes to finish" from ``E`` envs would be).

The policy step is the fused SMAX sampler's own (:func:`~rllib_ext.envs.smac.sampling.
policy.policy_step`): ``explore=False`` takes RLlib's deterministic action (argmax),
``explore=True`` samples from the policy as training does. Every chosen action of a battle in
play is checked against that step's legal-action mask; an illegal one raises. Exact only where
the fused SMAX loop is (:func:`~rllib_ext.envs.smac.sampling.smax_rule`): callers fall back
to RLlib's env runner (one battle at a time) where it returns a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rllib_ext.envs.smac.sampling.policy import initial_state_rows, policy_step

__all__ = ["BattleOutcomes", "play_battles"]


@dataclass(frozen=True)
class BattleOutcomes:
    """Per battle, in seed order (``[episodes]`` each): ``won`` (allies alive, enemies
    eliminated), ``truncated`` (the time limit ended it: neither side won), ``returns`` (the
    episode return summed over agents, as RLlib's ``MultiAgentEpisode.get_return()``),
    ``lengths`` (env steps); ``checked_actions``: agent actions checked against the mask."""

    won: np.ndarray
    truncated: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    checked_actions: int


def _check_legal(actions: np.ndarray, avail: np.ndarray, playing: np.ndarray) -> None:
    """Raises if a battle in play (``playing bool [E]``) got a masked action
    (``actions int [E, N]``, ``avail [E, N, A]``)."""
    legal = np.take_along_axis(avail, actions[..., None].astype(np.int64), -1)[..., 0] > 0
    bad = np.argwhere(~legal & playing[:, None])
    if bad.size:
        e, agent = (int(v) for v in bad[0])
        allowed = np.flatnonzero(avail[e, agent] > 0).tolist()
        raise ValueError(
            f"Action {int(actions[e, agent])} of agent {agent} in battle {e} is masked (legal "
            f"now: {allowed}). Fix: evaluate a module that masks its logits with "
            'obs["action_mask"] (rllib_ext.modules.MaskedPPOTorchRLModule does).'
        )


def play_battles(runner: Any, episodes: int, *, explore: bool, seed: int) -> BattleOutcomes:
    """Plays ``episodes`` fresh battles (see the module docstring) with ``runner``'s module.

    Args:
        runner: a :class:`~rllib_ext.envs.smac.SMAXVectorEnvRunner` holding the trained
            weights; its ``E`` battles are reset with explicit seeds each round.
        episodes: battles to play (>= 1).
        explore: sample actions (``True``) or take the greedy ones.
        seed: battle ``i`` is reset with seed ``seed + i``.
    """
    battles = runner.vector_env.battles
    n_envs, n_agents = battles.num_envs, battles.spec.n_agents
    module_id = next(iter(runner.module.keys()))
    rl_module = runner.module[module_id]
    won = np.zeros(episodes, dtype=bool)
    truncated = np.zeros(episodes, dtype=bool)
    returns = np.zeros(episodes, dtype=np.float64)
    lengths = np.zeros(episodes, dtype=np.int64)
    checked = 0
    for start in range(0, episodes, n_envs):
        count = min(n_envs, episodes - start)
        batch = battles.reset_arrays(seed=[seed + start + e for e in range(n_envs)])
        playing = np.arange(n_envs) < count  # the other slots of a last, short round idle
        rows = np.ones(n_envs * n_agents, dtype=bool)
        recurrent = initial_state_rows(rl_module, rows, None) if rl_module.is_stateful() else None
        while playing.any():
            taken = policy_step(
                runner,
                module_id,
                batch,
                battles.agent_states(batch),
                recurrent,
                explore=explore,
                env_ts=0,
            )
            _check_legal(taken.actions, batch.avail, playing)
            checked += int(playing.sum()) * n_agents
            recurrent = taken.state_out
            batch = battles.step_arrays(taken.actions)
            index = np.flatnonzero(playing) + start
            # SMAXVectorEnv's per-agent reward (float32 -> float, then the scale), summed.
            step_return = n_agents * batch.reward.astype(np.float64) * battles.reward_scale
            returns[index] += step_return[playing]
            lengths[index] += 1
            ended = playing & (batch.terminated | batch.truncated)
            won[np.flatnonzero(ended) + start] = batch.battle_won[ended]
            truncated[np.flatnonzero(ended) + start] = batch.truncated[ended]
            playing &= ~ended
    return BattleOutcomes(won, truncated, returns, lengths, checked)
