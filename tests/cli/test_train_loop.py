"""The train loop, metric sinks and ETA without Ray: a fake algorithm stands in for PPO."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from rllib_ext.cli.progress import IterationStats, ProgressReporter, estimate_eta
from rllib_ext.cli.runconfig import CORE_OPTIONS, SETTINGS_FILE, TrainSettings
from rllib_ext.cli.sinks import MetricsWriter, flatten_metrics, format_summary
from rllib_ext.cli.train import run_training_loop


class FakeAlgo:
    """``train()`` returns RLlib-shaped results with the given return curve."""

    def __init__(self, returns: list[float], steps_per_iter: int = 1000, interrupt_at: int = -1):
        self.returns = returns
        self.steps_per_iter = steps_per_iter
        self.interrupt_at = interrupt_at
        self.iteration = 0
        self.saved: list[str] = []

    def train(self) -> dict[str, Any]:
        if self.iteration == self.interrupt_at:
            raise KeyboardInterrupt
        self.iteration += 1
        extra = {"learners": {"default_policy": {"vf_loss": 1.0}}} if self.iteration > 1 else {}
        return {
            "training_iteration": self.iteration,
            "num_env_steps_sampled_lifetime": self.iteration * self.steps_per_iter,
            "time_this_iter_s": 0.5,
            "env_runners": {"episode_return_mean": self.returns[self.iteration - 1]},
            "config": {"lr": 1.0},
            "hostname": "box",
            **extra,
        }

    def save_to_path(self, path: str) -> str:
        Path(path).mkdir(parents=True)
        (Path(path) / "rllib_checkpoint.json").write_text("{}")
        self.saved.append(Path(path).name)
        return path


def _loop(algo: FakeAlgo, tmp_path: Path, **settings: Any):
    settings_obj = TrainSettings(**settings)
    writer = MetricsWriter(tmp_path)
    reporter = ProgressReporter(
        stop_reward=settings_obj.stop_reward,
        stop_timesteps=settings_obj.stop_timesteps,
        time_budget=settings_obj.time_budget,
        enabled=False,
    )
    try:
        return run_training_loop(
            algo,
            settings_obj,
            checkpoint_dir=tmp_path / "checkpoints",
            writer=writer,
            progress=reporter,
            started=time.perf_counter(),
        )
    finally:
        writer.close()


def test_stops_at_the_reward_and_saves_a_final_checkpoint(tmp_path: Path) -> None:
    algo = FakeAlgo([10, 100, 300, 460, 480])
    outcome = _loop(algo, tmp_path, stop_reward=450.0, checkpoint_freq=2)
    assert outcome.stop_reason == "stop_reward"
    assert algo.iteration == 4
    assert algo.saved == ["iter_000002", "iter_000004"]
    assert outcome.checkpoint == (tmp_path / "checkpoints" / "iter_000004").resolve()
    assert json.loads((outcome.checkpoint / SETTINGS_FILE).read_text())["stop_reward"] == 450.0


def test_stops_at_timesteps_and_time_budget(tmp_path: Path) -> None:
    algo = FakeAlgo([1.0] * 10, steps_per_iter=1000)
    assert _loop(algo, tmp_path / "a", stop_timesteps=2500).stop_reason == "stop_timesteps"
    assert algo.iteration == 3
    algo = FakeAlgo([1.0] * 10)
    assert _loop(algo, tmp_path / "b", time_budget=1e-9).stop_reason == "time_budget"
    assert algo.iteration == 1


def test_ctrl_c_saves_a_checkpoint(tmp_path: Path) -> None:
    algo = FakeAlgo([1.0] * 10, interrupt_at=3)
    outcome = _loop(algo, tmp_path, checkpoint_freq=0)
    assert outcome.stop_reason == "interrupted"
    assert algo.saved == ["iter_000003"]
    assert outcome.last_result["training_iteration"] == 3


def test_metrics_csv_widens_its_header_and_tensorboard_gets_events(tmp_path: Path) -> None:
    algo = FakeAlgo([1.0, 2.0, 3.0])
    _loop(algo, tmp_path, stop_timesteps=3000)
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert "env_runners/episode_return_mean" in rows[0]
    assert "learners/default_policy/vf_loss" in rows[0]  # first seen in iteration 2
    assert rows[0]["learners/default_policy/vf_loss"] == ""
    assert [float(r["env_runners/episode_return_mean"]) for r in rows] == [1.0, 2.0, 3.0]
    assert "config/lr" not in rows[0] and "hostname" not in rows[0]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_flatten_metrics_keeps_numeric_leaves() -> None:
    import numpy as np

    flat = flatten_metrics(
        {"a": {"b": 1, "c": np.float32(2.5), "d": "text", "e": [1, 2]}, "f": True, "date": "x"}
    )
    assert flat == {"a/b": 1.0, "a/c": 2.5, "f": 1.0}


def test_eta_uses_the_nearest_criterion() -> None:
    history = [
        IterationStats(1, 1000, 100.0, 1000.0, 1.0),
        IterationStats(2, 2000, 200.0, 1000.0, 2.0),
    ]
    # Reward rises 100/s: 250 more -> 2.5 s; timesteps: 8000 more at 1000/s -> 8 s.
    eta = estimate_eta(history, stop_reward=450.0, stop_timesteps=10_000, time_budget=None)
    assert eta == pytest.approx(2.5)
    eta = estimate_eta(history, stop_reward=None, stop_timesteps=None, time_budget=5.0)
    assert eta == pytest.approx(3.0)
    flat = [IterationStats(1, 1, 5.0, 1.0, 1.0), IterationStats(2, 2, 4.0, 1.0, 2.0)]
    assert estimate_eta(flat, stop_reward=450.0, stop_timesteps=None, time_budget=None) is None
    assert estimate_eta([], stop_reward=450.0, stop_timesteps=None, time_budget=None) is None


def test_summary_table_formats_values() -> None:
    text = format_summary([("steps", 32000), ("ret", 451.25), ("x", None)], title="t")
    assert "32,000" in text and "451.25" in text and "-" in text


def test_settings_defaults_match_the_option_table() -> None:
    defaults = TrainSettings()
    for option in CORE_OPTIONS:
        assert getattr(defaults, option.key) == option.default, option.key
    assert math.isfinite(defaults.stop_reward)
