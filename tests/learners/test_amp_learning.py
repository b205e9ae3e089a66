"""AMP learns like fp32: PPO CartPole-v1 to 450 within 1.25x fp32's env steps (minutes per mode).

Marked `learning`: not in CI (emulated fp16/bf16 on a CPU without native support takes several
minutes per run); run with `make test-learning`. The same function prints a table in
`benchmarks/amp_learning.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from amp_learning import steps_to_reward  # noqa: E402

pytestmark = [pytest.mark.learning, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def fp32_steps() -> int:
    result = steps_to_reward("fp32")
    assert result["reached"], result
    return result["env_steps"]


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_amp_reaches_450_within_fp32_budget(mode: str, fp32_steps: int) -> None:
    result = steps_to_reward(mode, max_steps=int(1.25 * fp32_steps))
    assert result["reached"], (result, fp32_steps)
    assert result["env_steps"] <= 1.25 * fp32_steps
