"""``rllib_ext.testing.check_masked_multiagent_env`` passes a good env and names each broken rule."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from rllib_ext.testing import check_masked_multiagent_env, sample_legal

AGENTS = ["a0", "a1"]
EPISODE_STEPS = 5


class _TinyMaskedEnv(MultiAgentEnv):
    """Two agents, three actions; action 2 is masked after the first step.

    Each keyword breaks one rule of the contract the checker enforces.
    """

    def __init__(
        self, *, accept_masked: bool = False, empty_mask: bool = False, both_done: bool = False
    ) -> None:
        super().__init__()
        self.accept_masked = accept_masked
        self.empty_mask = empty_mask
        self.both_done = both_done
        self.agents = self.possible_agents = list(AGENTS)
        obs_space = gym.spaces.Dict(
            {
                "observations": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "action_mask": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
            }
        )
        self.observation_spaces = dict.fromkeys(AGENTS, obs_space)
        self.action_spaces = dict.fromkeys(AGENTS, gym.spaces.Discrete(3))
        self.t = 0

    def _mask(self) -> np.ndarray:
        if self.t == 0:
            return np.ones(3, np.float32)  # RLlib's own check steps with unmasked samples
        if self.empty_mask:
            return np.zeros(3, np.float32)
        return np.array([1.0, 1.0, 0.0], np.float32)

    def _obs(self) -> dict[str, Any]:
        mask = self._mask()
        return {a: {"observations": np.zeros(2, np.float32), "action_mask": mask} for a in AGENTS}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict: dict[str, int]) -> tuple:
        mask = self._mask()
        for agent, action in action_dict.items():
            if mask[action] == 0 and not self.accept_masked:
                raise ValueError(f"action {action} of {agent} is masked")
        self.t += 1
        done = self.t >= EPISODE_STEPS
        terminateds = {a: done for a in AGENTS} | {"__all__": done}
        truncateds = {a: done and self.both_done for a in AGENTS}
        truncateds["__all__"] = done and self.both_done
        rewards = dict.fromkeys(AGENTS, 0.0)
        return self._obs(), rewards, terminateds, truncateds, {}


def test_a_conforming_env_passes_and_the_report_counts_what_ran():
    report = check_masked_multiagent_env(_TinyMaskedEnv(), num_steps=20, seed=0)
    assert report.steps == 20
    assert report.episodes == 20 // EPISODE_STEPS
    assert report.terminated == report.episodes and report.truncated == 0
    assert report.illegal_action_rejected


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({"accept_masked": True}, "accepted the masked action 2 of 'a0'.*Fix: raise a ValueError"),
        ({"empty_mask": True}, "action_mask of 'a0' must be 0/1 with at least one legal"),
        ({"both_done": True}, "'a0' is terminated and truncated at once"),
    ],
)
def test_each_broken_rule_fails_with_its_fix(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_masked_multiagent_env(_TinyMaskedEnv(**broken), num_steps=20, seed=0)


def test_sample_legal_draws_only_unmasked_actions():
    rng = np.random.default_rng(0)
    mask = np.array([[0, 1, 0, 1], [1, 0, 0, 0]], np.float32)
    draws = np.stack([sample_legal(mask, rng) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 3}
    assert set(draws[:, 1].tolist()) == {0}
