"""``rllib-ext profile`` and ``ProfilerCallback`` through real RLlib runs."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from rllib_ext.cli.main import main
from rllib_ext.profiling import PHASES, enable_profiling

SMALL = ["--training", '{"train_batch_size_per_learner": 512, "minibatch_size": 128}']
# Phases that must take time in any CartPole iteration (grad_comm needs compression, GAE
# rllib_ext's CompiledGAE).
ALWAYS = [p for p in PHASES if p not in ("learner/grad_comm", "learner/gae", "other")]


def _check_breakdown(data: dict, *, iterations: list[int]) -> None:
    assert data["iterations"] == iterations
    shares = [p["share"] for p in data["phases"].values()]
    # Leaf phases partition the iteration's wall time (RLlib's time_this_iter_s).
    assert math.isclose(sum(shares), 1.0, abs_tol=1e-6)
    seconds = sum(p["seconds"] for p in data["phases"].values())
    assert seconds == pytest.approx(data["wall_s"], rel=1e-6)
    for phase in ALWAYS:
        assert data["phases"][phase]["seconds"] > 0, phase
    # The measured phases never exceed the iteration (no double counting) and cover most of it.
    assert data["unaccounted_s"] >= -0.02 * data["wall_s"]
    assert data["phases"]["other"]["share"] < 0.25


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_profile_cartpole_writes_breakdown_trace_and_top_ops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prof"
    argv = ["profile", "--iterations", "2", "--warmup", "1", "--out", str(out), "--seed", "0"]
    assert main([*argv, *SMALL]) == 0
    printed = capsys.readouterr().out
    assert "sampling" in printed and "env_step" in printed and "top operators" in printed
    assert str(out / "trace" / "learner.pt.trace.json.gz") in printed

    data = json.loads((out / "breakdown.json").read_text())
    _check_breakdown(data, iterations=[2, 3])
    assert data["phases"]["learner/gae"]["seconds"] > 0  # CompiledGAE's own timer
    config = data["details"]["config"]
    assert config["learner_class"] == "PPOExtTorchLearner"
    assert (
        config["env_runner_class"] == "FusedSingleAgentEnvRunner"
    )  # rllib_ext.PPOConfig's default
    assert len(data["details"]["per_iteration"]) == 2
    assert (out / "breakdown.txt").read_text().startswith("phase")

    trace = json.loads(gzip.decompress((out / "trace" / "learner.pt.trace.json.gz").read_bytes()))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("aten::") for n in names)  # operator events
    assert any("Optimizer.step" in n for n in names)  # a whole update, optimizer included
    assert any(e.get("ph") == "X" and e.get("dur", 0) > 0 for e in trace["traceEvents"])
    top_ops = (out / "top_ops.txt").read_text()
    assert "Self CPU" in top_ops and "aten::" in top_ops


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_profile_stock_rllib_with_a_remote_env_runner(tmp_path: Path) -> None:
    out = tmp_path / "stock"
    argv = ["profile", "--stock", "--iterations", "1", "--no-trace", "--out", str(out)]
    argv += ["--num-env-runners", "1", "--seed", "1", *SMALL]
    assert main(argv) == 0
    data = json.loads((out / "breakdown.json").read_text())
    _check_breakdown(data, iterations=[2])
    assert data["details"]["config"]["learner_class"] == "PPOTorchLearner"
    # RLlib's GAE piece is not timed on its own: it stays in learner/connector.
    assert data["phases"]["learner/gae"]["seconds"] == 0
    assert not (out / "trace").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("codec", ["onebit", "powersgd", "fp16"])
def test_profile_two_learners_with_compression_times_gradient_communication(
    tmp_path: Path, codec: str
) -> None:
    out = tmp_path / codec
    argv = ["profile", "--num-learners", "2", "--grad-compression", codec, "--no-trace"]
    argv += ["--iterations", "1", "--warmup", "0", "--out", str(out), "--seed", "2"]
    argv += ["--training", '{"train_batch_size_per_learner": 256, "minibatch_size": 128}']
    assert main(argv) == 0
    data = json.loads((out / "breakdown.json").read_text())
    _check_breakdown(data, iterations=[1])
    # The hooks' observer saw buckets in flight, within backward.
    assert 0 < data["phases"]["learner/grad_comm"]["seconds"] <= data["wall_s"]
    assert data["details"]["config"]["num_learners"] == 2
    assert data["details"]["config"]["learner_config_dict"]["grad_compression"] == codec
    comm = data["details"]["per_iteration"][0]["details"]["comm"]
    assert comm["default_policy"]["rllib_ext/comm/bytes_sent"] > 0


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_enable_profiling_under_tune_adds_results_and_files(tmp_path: Path) -> None:
    from ray import tune

    import rllib_ext

    out = tmp_path / "tune_prof"
    config = (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
    )
    enable_profiling(config, out_dir=out, iterations=[2])  # iteration 3 traced
    tuner = tune.Tuner(
        rllib_ext.PPO,
        param_space=config,
        run_config=tune.RunConfig(
            stop={"training_iteration": 3}, storage_path=str(tmp_path / "tune"), verbose=0
        ),
    )
    results = tuner.fit()
    assert not results.errors
    df = results.get_dataframe()  # last row: iteration 3 (traced, not broken down)
    metrics = results[0].metrics_dataframe
    row = metrics[metrics["training_iteration"] == 2].iloc[0]
    shares = [row[f"rllib_ext/profile/{p}"] for p in PHASES]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert row["rllib_ext/profile/learner/gae"] > 0
    assert (
        row["env_runners/rllib_ext/profile/env_step_s"] > 0
    )  # the raw seconds, logged by the EnvRunner
    assert int(df["training_iteration"].iloc[0]) == 3
    _check_breakdown(json.loads((out / "breakdown.json").read_text()), iterations=[2])
    assert (out / "trace" / "learner.pt.trace.json.gz").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iterations", "0"], "--iterations '0' must be an integer >= 1. Fix: e.g."),
        (["--iterations", "two"], "--iterations 'two' must be an integer >= 1"),
        (["--warmup", "-1"], "--warmup '-1' must be an integer >= 0"),
        (["--stock", "--amp", "fp16"], "--stock profiles RLlib's own PPO, which has no --amp"),
    ],
)
def test_profile_bad_input_is_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("rllib-ext: error:")


def test_profile_unwritable_out_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["profile", "--out", str(blocker / "prof")]) == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and str(blocker / "prof") in err and "Fix:" in err
