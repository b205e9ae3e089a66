"""One short ``rllib-ext train`` each on CartPole and on SMAX, through the installed console
script: the smoke runs CI also makes on the oldest supported Ray (``make test-oldest``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli._procs import console_script


def _train(run_dir: Path, *argv: str) -> dict:
    done = subprocess.run(
        [console_script("rllib-ext"), "train", *argv, "--no-progress", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reached --stop-timesteps" in done.stdout, done.stdout[-2000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_cartpole_trains_with_the_defaults(tmp_path: Path) -> None:
    summary = _train(tmp_path / "run", "--stop-timesteps", "2000", "--seed", "0")
    assert summary["env_steps"] >= 2000
    row = json.loads((tmp_path / "run" / "result.json").read_text().splitlines()[-1])
    learner = row["learners"]["default_policy"]
    assert (
        learner["rllib_ext/gae/compiled"] == 1.0 and learner["rllib_ext/batching/vectorized"] == 1.0
    )


def test_smax_trains_with_the_map_preset(tmp_path: Path) -> None:
    argv = ["--env", "smax", "--env-config", '{"map_name": "3m"}', "--seed", "0"]
    argv += ["--set", "train_batch_size=1024", "--set", "minibatch_size=512"]
    argv += ["--set", "num_epochs=1", "--stop-timesteps", "1024"]
    summary = _train(tmp_path / "run", *argv)
    assert summary["backend"] == "smax" and summary["settings"]["preset"] == "smax-3m"
    row = json.loads((tmp_path / "run" / "result.json").read_text().splitlines()[-1])
    assert row["env_runners"]["rllib_ext/smax_fused_sampling"] == 1
