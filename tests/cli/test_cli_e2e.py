"""End-to-end ``rllib-ext train`` / ``evaluate`` runs through real RLlib (``-m slow``)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ray.tune import Result

from rllib_ext.cli.main import main

pytestmark = pytest.mark.slow


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.usefixtures("ray_session")
def test_short_run_writes_everything_and_evaluate_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--stop-timesteps", "4000", "--checkpoint-freq", "1", "--seed", "0"]
    assert main([*argv, "--run-dir", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "reached --stop-timesteps" in out and "episode_return_mean" in out

    summary = _summary(run_dir)
    assert summary["stop_reason"] == "stop_timesteps"
    assert summary["env_steps"] >= 4000
    assert summary["wall_time_s"] > 0
    assert summary["settings"]["extensions"]["gae"] == "compiled"
    assert summary["settings"]["seed"] == 0
    checkpoint = Path(summary["checkpoint"])
    assert (checkpoint / "rllib_checkpoint.json").is_file()
    # --checkpoint-freq 1: one checkpoint per iteration.
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert len(saved) == summary["iterations"] >= 2, saved

    # Tune's trial layout, read with Tune's own reader and pandas.
    progress = pd.read_csv(run_dir / "progress.csv")
    assert list(progress["training_iteration"]) == list(range(1, summary["iterations"] + 1))
    assert "env_runners/episode_return_mean" in progress.columns
    assert "learners/default_policy/rllib_ext/gae/compiled" in progress.columns  # the extension ran
    assert "config/lr" not in progress.columns
    tune_result = Result.from_path(str(run_dir))
    assert tune_result.metrics["training_iteration"] == summary["iterations"]
    assert list(run_dir.glob("events.out.tfevents.*"))

    assert main(["evaluate", str(checkpoint), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "mean return:" in out and "episodes: 3" in out
    # A run directory works as well as the checkpoint itself, and so does a relative path.
    assert main(["evaluate", str(run_dir), "--episodes", "1"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", str(checkpoint.relative_to(tmp_path)), "--episodes", "1"]) == 0


@pytest.mark.usefixtures("ray_session")
def test_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    argv = ["train", "--stop-timesteps", "2000", "--seed", "3", "--gae", "rllib", "--no-progress"]
    assert main([*argv, "--run-dir", str(first)]) == 0
    before = _summary(first)
    assert before["iterations"] == 1

    resume = ["train", "--resume", str(first), "--stop-timesteps", "4000", "--no-progress"]
    assert main([*resume, "--run-dir", str(second)]) == 0
    after = _summary(second)
    assert after["iterations"] == 2  # continued, not restarted
    assert after["env_steps"] >= 4000
    assert after["settings"]["resume"] == before["checkpoint"]
    assert after["settings"]["seed"] == 3  # inherited from the checkpoint
    assert after["settings"]["extensions"]["gae"] == "rllib"
    assert after["segments"] == 2 and after["train_time_s"] > before["train_time_s"]
    assert list(pd.read_csv(second / "progress.csv")["training_iteration"]) == [2]

    # Without --run-dir the run continues in its own directory: each iteration once.
    assert main(["train", "--resume", str(first), "--stop-timesteps", "4000"]) == 0
    assert list(pd.read_csv(first / "progress.csv")["training_iteration"]) == [1, 2]
    assert _summary(first)["segments"] == 2


@pytest.mark.usefixtures("ray_session")
def test_default_run_reaches_450(tmp_path: Path) -> None:
    run_dir = tmp_path / "default"
    # The time budget only guards against a hang; the default run takes well under a minute.
    assert main(["train", "--run-dir", str(run_dir), "--time-budget", "900", "--seed", "0"]) == 0
    summary = _summary(run_dir)
    assert summary["stop_reason"] == "stop_reward", summary
    assert summary["episode_return_mean"] >= 450
    assert Path(summary["checkpoint"], "rllib_checkpoint.json").is_file()


@pytest.mark.parametrize(
    ("signum", "code", "reason"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_saves_a_checkpoint_and_a_summary(
    tmp_path: Path, signum: int, code: int, reason: str
) -> None:
    """SIGINT to the process group (what Ctrl-C in a terminal sends) and SIGTERM to the process
    (what Kubernetes and ``kill PID`` send) both stop the run with a final checkpoint and a summary.

    SIGTERM goes to the process only: Ray shields its local services from SIGINT but not from
    SIGTERM, so a SIGTERM to the whole group also ends the raylet, and Ray's core worker then
    ends the driver with status 1 whenever it notices that before the checkpoint is written.
    HOME points at an empty directory: nothing may land in ~/ray_results.
    """
    script = shutil.which("rllib-ext", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("console script not installed: pip install -e . --no-deps")
    home = tmp_path / "home"
    home.mkdir()
    run_dir = tmp_path / "interrupted"
    argv = ["train", "--stop-reward", "none", "--stop-timesteps", "10000000", "--seed", "0"]
    proc = subprocess.Popen(
        [script, *argv, "--run-dir", str(run_dir), "--checkpoint-freq", "0"],
        start_new_session=True,
        # A shell starts background jobs with SIGINT ignored; Python then never raises
        # KeyboardInterrupt. Restore the default so the test sees what a terminal user sees.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        progress = run_dir / "progress.csv"
        while not (progress.exists() and len(progress.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no iteration finished in time"
            time.sleep(0.5)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    summary = _summary(run_dir)
    assert summary["stop_reason"] == reason
    checkpoint = Path(summary["checkpoint"])
    assert checkpoint.parent == run_dir / "checkpoints"
    assert (checkpoint / "rllib_checkpoint.json").is_file()
    iterations = list(pd.read_csv(run_dir / "progress.csv")["training_iteration"])
    assert iterations == list(range(1, summary["iterations"] + 1))
    assert reason in out
    ray_results = home / "ray_results"
    assert not ray_results.exists() or not any(ray_results.iterdir())


@pytest.mark.usefixtures("ray_session")
def test_evaluate_plays_a_multi_agent_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The multi-agent hook of evaluate: two CartPoles sharing one policy (untrained)."""
    from ray.rllib.env.multi_agent_env import make_multi_agent
    from ray.tune.registry import register_env

    import rllib_ext

    two_cartpoles = make_multi_agent("CartPole-v1")
    register_env("cli_test_two_cartpoles", lambda cfg: two_cartpoles({"num_agents": 2}))
    config = (
        rllib_ext.PPOConfig()
        .environment("cli_test_two_cartpoles")
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *a, **k: "shared")
        .env_runners(num_env_runners=0)
    )
    algo = config.build_algo()
    try:
        checkpoint = algo.save_to_path(str(tmp_path / "multi_agent"))
    finally:
        algo.stop()
    assert main(["evaluate", str(checkpoint), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "cli_test_two_cartpoles" in out and "mean return:" in out


@pytest.mark.skipif(
    importlib.util.find_spec("jaxmarl") is None,
    reason='needs jaxmarl: pip install "rllib-ext[smax]"',
)
@pytest.mark.usefixtures("ray_session")
def test_train_and_evaluate_smac_v2_report_win_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "smac"
    argv = ["train", "--env", "smac_v2", "--env-config", '{"map_name": "3m"}', "--seed", "0"]
    argv += ["--stop-timesteps", "600", "--num-envs-per-env-runner", "2", "--no-progress"]
    argv += ["--training", '{"train_batch_size_per_learner": 600, "minibatch_size": 200}']
    assert main([*argv, "--run-dir", str(run_dir)]) == 0
    assert "win_rate" in capsys.readouterr().out
    summary = _summary(run_dir)
    assert 0.0 <= summary["win_rate"] <= 1.0  # SMACMetricsCallback added by rllib_ext.PPOConfig

    assert main(["evaluate", str(run_dir), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "episodes: 3" in out and "win rate:" in out and "/3 battles won" in out
    assert "batched: 3 battles at once" in out  # the SMAX checkpoint's batched evaluation

    # The batched path and RLlib's runner (one battle at a time) on the same checkpoint and
    # fixed seeds: sampled actions, the same mean return within 4 standard errors.
    returns = {}
    for num_envs in ("40", "1"):
        argv = ["evaluate", str(run_dir), "--episodes", "40", "--explore", "--json"]
        assert main([*argv, "--seed", "5", "--num-envs", num_envs]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["battles_at_once"] == int(num_envs) and len(result["wins"]) == 40
        returns[num_envs] = np.asarray(result["returns"])
    batched, single = returns["40"], returns["1"]
    se = np.sqrt(batched.var() / 40 + single.var() / 40)
    assert se > 0 and abs(batched.mean() - single.mean()) < 4 * se
