"""The SMAC path through ``rllib-ext train``: backend named, win rate shown, --stop-win-rate."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rllib_ext.cli.main import main
from rllib_ext.cli.progress import IterationStats, ProgressReporter


def _stats(iteration: int, env_steps: int, win_rate: float | None = None) -> IterationStats:
    return IterationStats(
        iteration=iteration,
        env_steps=env_steps,
        episode_return_mean=1.5,
        steps_per_s=100.0,
        elapsed_s=float(iteration),
        win_rate=win_rate,
    )


def test_bar_ends_full_when_the_last_iteration_overshoots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = ProgressReporter(
        stop_reward=None, stop_timesteps=10_000, time_budget=None, enabled=True
    )
    reporter.update(_stats(1, 6_000))
    reporter.update(_stats(2, 12_000))  # past the 10k budget
    reporter.close()
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "100%" in last and "12.0k/12.0k env steps" in last, last
    assert "/?" not in last


def test_progress_line_shows_the_win_rate(caplog: pytest.LogCaptureFixture) -> None:
    reporter = ProgressReporter(
        stop_reward=None, stop_timesteps=None, time_budget=None, enabled=False
    )
    with caplog.at_level("INFO", logger="rllib_ext.cli"):
        reporter.update(_stats(1, 800, win_rate=0.25))
        reporter.update(_stats(2, 1600))  # not a SMAC env: no win rate field
    first, second = (r.getMessage() for r in caplog.records)
    assert "win rate 0.25" in first
    assert "win rate" not in second


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("jaxmarl") is None,
    reason='needs jaxmarl: pip install "rllib-ext[smax]"',
)
@pytest.mark.usefixtures("ray_session")
def test_smac_v2_run_names_its_backend_and_stops_on_win_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "smac"
    argv = ["train", "--env", "smac_v2", "--env-config", '{"map_name": "3m"}', "--seed", "0"]
    # Tiny batches over the map preset's; --stop-win-rate 0 stops at the first iteration that
    # finished a battle, --stop-timesteps only guards against a run without one.
    argv += ["--num-envs-per-env-runner", "4", "--set", "train_batch_size=400"]
    argv += ["--set", "minibatch_size=200", "--set", "num_epochs=1", "--no-progress"]
    argv += ["--stop-win-rate", "0", "--stop-timesteps", "4000", "--run-dir", str(run_dir)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    # Without StarCraft II here, backend 'auto' falls back to SMAX, and says so.
    assert "env smac_v2: backend smax, map 3m, preset smax-3m" in captured.err
    assert "preset: smax-3m (SMAX backend, map 3m)" in captured.err
    assert "win rate " in captured.err  # the progress line
    assert "reached --stop-win-rate" in captured.out

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backend"] == "smax"
    assert 0.0 <= summary["win_rate"] <= 1.0
    assert summary["stop_reason"] == "stop_win_rate"
    assert summary["env_steps"] < 4000
    settings = summary["settings"]
    assert settings["preset"] == "smax-3m" and settings["stop_reward"] is None
    assert settings["model_config"]["central_critic"] is True
    assert summary["ppo"]["train_batch_size"] == 400  # --set over the preset's 8000
