"""Env faults cost only the episodes in flight; non-finite env data is reported or dropped.

Runs the CLI's own config (``build_algo_config`` applies the env guard) through real RLlib.
"""

from __future__ import annotations

import logging
import math

import pytest

from rllib_ext.cli.runconfig import TrainSettings
from rllib_ext.cli.train import build_algo_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

TINY = {"train_batch_size": 200, "minibatch_size": 100, "num_epochs": 1}


def _settings(env: str, **kwargs: object) -> TrainSettings:
    values = {"num_envs_per_env_runner": 1, "seed": 0, "training": TINY, **kwargs}
    return TrainSettings.from_values({"env": env, **values})


def test_env_raising_in_step_keeps_training_with_one_env_runner() -> None:
    settings = _settings(
        "tests.cli._env_doubles.FlakyCartPole",
        env_config={"p_crash": 0.01, "seed": 0},
        num_env_runners=1,
    )
    algo = build_algo_config(settings).build_algo()
    try:
        steps, results = [], []
        for _ in range(6):
            result = algo.train()
            results.append(result)
            steps.append(result["env_runners"]["num_env_steps_sampled_lifetime"])
    finally:
        algo.stop()
    assert all(later > earlier for earlier, later in zip(steps, steps[1:], strict=False)), steps
    last = results[-1]
    runners = last["env_runners"]
    assert runners["rllib_ext/env_restarts"] > 0  # env copies re-created inside the runner
    assert runners["rllib_ext/episodes_dropped"] > 0
    assert last["fault_tolerance"]["num_healthy_workers"] == 1  # the runner never went down
    for result in results:
        assert math.isfinite(result["learners"]["default_policy"]["total_loss"])


def test_nan_reward_warns_with_env_and_episode(caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings("tests.cli._env_doubles.NaNRewardCartPole", non_finite="warn")
    algo = build_algo_config(settings).build_algo()
    try:
        with caplog.at_level(logging.WARNING, logger="rllib_ext.envs.guard"):
            algo.train()
    finally:
        algo.stop()
    lines = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert lines, "no non-finite warning"
    assert "NaNRewardCartPole" in lines[0] and "episode" in lines[0] and "reward" in lines[0]


def test_nan_reward_episodes_dropped() -> None:
    settings = _settings("tests.cli._env_doubles.NaNRewardCartPole", non_finite="drop")
    algo = build_algo_config(settings).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    assert results[-1]["env_runners"]["rllib_ext/non_finite_episodes"] > 0
    for result in results:
        assert math.isfinite(result["learners"]["default_policy"]["total_loss"])
