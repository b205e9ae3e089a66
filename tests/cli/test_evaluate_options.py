"""``rllib-ext evaluate`` options: --explore, --json, --video (through real RLlib, ``-m slow``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rllib_ext.cli.main import main

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("ray_session")
def test_evaluate_json_explore_and_video(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--stop-timesteps", "200", "--seed", "0", "--no-progress"]
    argv += ["--set", "train_batch_size=200", "--set", "minibatch_size=100"]
    argv += ["--set", "num_epochs=1", "--num-envs-per-env-runner", "1"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()

    assert main(["evaluate", str(run_dir), "--episodes", "3", "--json", "--seed", "1"]) == 0
    greedy = json.loads(capsys.readouterr().out)  # stdout holds exactly one JSON object
    assert greedy["episodes"] == 3 and len(greedy["returns"]) == 3
    assert greedy["policy"] == "greedy" and greedy["env"] == "CartPole-v1"
    assert greedy["mean_return"] == pytest.approx(sum(greedy["returns"]) / 3)
    assert greedy["win_rate"] is None and greedy["video_dir"] is None

    assert main(["evaluate", str(run_dir), "--episodes", "3", "--json", "--explore"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "stochastic"

    video_dir = tmp_path / "videos"
    code = main(["evaluate", str(run_dir), "--episodes", "2", "--video", str(video_dir)])
    captured = capsys.readouterr()
    if importlib.util.find_spec("moviepy") is None:
        # Without the video extra: one line naming the extra, no traceback.
        assert code == 2
        assert 'pip install "rllib-ext[video]"' in captured.err
        assert "Traceback" not in captured.err
    else:
        assert code == 0 and f"videos: {video_dir}" in captured.out
        assert len(list(video_dir.glob("*.mp4"))) == 2
