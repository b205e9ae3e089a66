"""play_battles (batched SMAX evaluation) against one SMACEnv battle at a time, same seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("jaxmarl", reason='SMAX backend needs jaxmarl: pip install "rllib-ext[smax]"')

from ray.rllib.core.columns import Columns  # noqa: E402

from rllib_ext.envs.smac import SMACEnv  # noqa: E402
from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner  # noqa: E402
from rllib_ext.envs.smac.evaluation import _check_legal, play_battles  # noqa: E402

ENV_CONFIG = {"map_name": "3m", "smax_options": {"see_enemy_actions": True}}


def _runner(num_envs: int) -> SMAXVectorEnvRunner:
    from rllib_ext import PPOConfig

    config = (
        PPOConfig()
        .environment("smax", env_config=ENV_CONFIG)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
        .debugging(seed=3)
    )
    config.validate()
    assert config.env_runner_cls is SMAXVectorEnvRunner
    return SMAXVectorEnvRunner(config=config)


def _one_at_a_time(module, episodes: int, seed: int, *, explore: bool, rng=None):
    """Battle i: a SMACEnv after reset(seed=seed + i), the module's greedy (or sampled) actions
    per step; returns (won, truncated, return summed over agents, length) per battle."""
    env = SMACEnv({**ENV_CONFIG, "backend": "smax"})
    agents = env.possible_agents
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, length = 0.0, 0
        while True:
            batch = {
                Columns.OBS: {
                    k: torch.as_tensor(np.stack([obs[a][k] for a in agents]))
                    for k in obs[agents[0]]
                }
            }
            with torch.no_grad():
                logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
            if explore:
                actions = torch.distributions.Categorical(logits=logits).sample().numpy()
            else:
                actions = logits.argmax(-1).numpy()
            obs, rewards, terminateds, truncateds, infos = env.step(
                dict(zip(agents, actions.tolist(), strict=True))
            )
            total += sum(rewards.values())
            length += 1
            if terminateds["__all__"] or truncateds["__all__"]:
                info = infos[agents[0]]
                out.append((info["battle_won"], not terminateds["__all__"], total, length))
                break
    env.close()
    return out


def test_greedy_battles_replay_single_env_battles_exactly_in_any_round_size():
    """10 battles in rounds of 4, 4 and 2 (the last round's idle slots ignored): battle i is the
    battle of a SMACEnv reset with seed 7 + i, step for step (same length, return and outcome),
    so no battle is counted twice or cut short whatever its length."""
    runner = _runner(num_envs=4)
    try:
        module = next(iter(runner.module.values()))
        outcomes = play_battles(runner, 10, explore=False, seed=7)
        reference = _one_at_a_time(module, 10, 7, explore=False)
        assert outcomes.lengths.tolist() == [r[3] for r in reference]
        assert outcomes.won.tolist() == [r[0] for r in reference]
        assert outcomes.truncated.tolist() == [r[1] for r in reference]
        np.testing.assert_allclose(outcomes.returns, [r[2] for r in reference], rtol=1e-6)
        assert outcomes.checked_actions == 3 * int(outcomes.lengths.sum())
        # The same seed set in one round of 10 plays the same battles.
        wide = _runner(num_envs=10)
        try:
            again = play_battles(wide, 10, explore=False, seed=7)
        finally:
            wide.stop()
        assert again.lengths.tolist() == outcomes.lengths.tolist()
    finally:
        runner.stop()


def test_sampled_battles_match_single_env_sampling_within_sampling_error():
    """Sampled actions: the mean return and length over 64 battles agree with the one-at-a-time
    loop's over the same seeds within 4 standard errors (the action draws differ)."""
    runner = _runner(num_envs=16)
    try:
        torch.manual_seed(0)
        outcomes = play_battles(runner, 64, explore=True, seed=100)
        reference = np.array(
            [
                r[2:]
                for r in _one_at_a_time(next(iter(runner.module.values())), 64, 100, explore=True)
            ]
        )
    finally:
        runner.stop()
    for ours, theirs in ((outcomes.returns, reference[:, 0]), (outcomes.lengths, reference[:, 1])):
        se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
        assert se > 0  # the draws vary: the check below can fail
        assert abs(ours.mean() - theirs.mean()) < 4 * se


def test_a_masked_action_raises_naming_battle_agent_and_legal_actions():
    avail = np.ones((2, 3, 5), dtype=np.float32)
    avail[1, 2, 4] = 0
    actions = np.zeros((2, 3), dtype=np.int64)
    actions[1, 2] = 4
    with pytest.raises(ValueError, match=r"Action 4 of agent 2 in battle 1 is masked .*0, 1, 2, 3"):
        _check_legal(actions, avail, np.array([True, True]))
    _check_legal(actions, avail, np.array([True, False]))  # a battle no longer in play: ignored
