"""Real algorithms + sampled episodes shared by the learner-connector tests.

Each case builds one algorithm (``rllib_ext.PPOConfig``, so the learner is
``PPOExtTorchLearner``) and samples real episodes with its local env runner once; tests run
pipelines on deep copies of them with the learner's own ``MultiRLModule``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from ray.rllib.connectors.learner import (
    AddOneTsToEpisodesAndTruncate,
    GeneralAdvantageEstimation,
)
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

import rllib_ext

GAMMA = 0.97
LAMBDA = 0.9


def small_config(**kwargs: Any) -> rllib_ext.PPOConfig:
    return (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .rl_module(model_config=kwargs.pop("model_config", {"fcnet_hiddens": [32]}))
        .training(gamma=GAMMA, lambda_=LAMBDA, train_batch_size_per_learner=512, **kwargs)
        .debugging(seed=0)
    )


def multi_agent_config() -> rllib_ext.PPOConfig:
    return (
        small_config()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
    )


class Case:
    """One built algorithm, its learner and a fixed set of sampled episodes."""

    def __init__(self, config: rllib_ext.PPOConfig, num_timesteps: int) -> None:
        self.config = config
        self.algo = config.build_algo()
        self.learner = self.algo.learner_group._learner
        self.episodes = self.algo.env_runner.sample(
            num_timesteps=num_timesteps, random_actions=False
        )

    def stock_pipeline(self):
        """RLlib's PPO learner pipeline, assembled exactly as ``PPOLearner.build`` does."""
        # The algorithm's own (validated) config: rllib_ext's SMAC auto-setup happens there.
        pipeline = self.algo.config.build_learner_connector(
            input_observation_space=None, input_action_space=None, device=torch.device("cpu")
        )
        pipeline.prepend(AddOneTsToEpisodesAndTruncate())
        pipeline.append(GeneralAdvantageEstimation(gamma=GAMMA, lambda_=LAMBDA))
        return pipeline

    def run(self, pipeline) -> dict:
        return self.run_full(pipeline)[0]

    def run_full(
        self, pipeline, *, metrics: Any = None, episodes: list | None = None
    ) -> tuple[dict, dict, list]:
        """(batch, shared_data, episodes after the call) on a fresh copy of the episodes (of
        ``episodes`` where given, else the case's)."""
        episodes = copy.deepcopy(self.episodes if episodes is None else episodes)
        shared_data: dict = {}
        batch = pipeline(
            rl_module=self.learner.module,
            batch={},
            episodes=episodes,
            shared_data=shared_data,
            metrics=metrics,
        )
        return batch, shared_data, episodes
