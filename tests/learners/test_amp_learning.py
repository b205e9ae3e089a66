"""AMP learns like fp32: PPO CartPole-v1 to 450 within 1.25x fp32's env steps (minutes per mode).

The comparisons are marked `learning`: not in CI (emulated fp16/bf16 on a CPU without native
support takes several minutes per run); run with `make test-learning`. `benchmarks/amp_learning.py`
prints the same comparison as a table; both train through `rllib_ext.testing.steps_to_return`.
"""

from __future__ import annotations

import math

import pytest

import rllib_ext
from rllib_ext.testing.learning import steps_to_return

TARGET = 450.0


def _config(mode: str):
    """PPO CartPole-v1, MLP [64, 64], seed 0: identical for every mode but the amp flag."""
    return (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .training(amp=False if mode == "fp32" else mode)
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def fp32_steps(ray_session) -> int:
    report = steps_to_return(_config("fp32"), target=TARGET, max_env_steps=200_000)
    assert report.reached, report
    return report.env_steps


@pytest.mark.learning
@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_amp_reaches_450_within_fp32_budget(mode: str, fp32_steps: int) -> None:
    budget = int(1.25 * fp32_steps)
    report = steps_to_return(_config(mode), target=TARGET, max_env_steps=budget)
    assert report.reached, (report, fp32_steps)
    assert report.env_steps <= budget
    assert report.learners["default_policy"]["rllib_ext/amp/dtype"] == {"fp16": "float16"}.get(
        mode, "bfloat16"
    )


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_steps_to_return_stops_at_the_budget() -> None:
    """One iteration's budget, an unreachable target: not reached, stopped after iteration 1."""
    config = _config("fp32").training(train_batch_size_per_learner=256, minibatch_size=128)
    report = steps_to_return(config, target=1e9, max_env_steps=1)
    assert not report.reached
    assert report.iterations == 1
    assert report.env_steps >= 256
    assert math.isnan(report.episode_return) or report.episode_return < 1e9
    assert "default_policy" in report.learners


def test_steps_to_return_rejects_an_empty_budget() -> None:
    with pytest.raises(ValueError, match="max_env_steps=0 must be positive.*Fix"):
        steps_to_return(_config("fp32"), target=TARGET, max_env_steps=0)
