"""The train loop, checkpoints, Tune-format run files and ETA without Ray: a fake algorithm
stands in for PPO (the files go through Tune's real logger callbacks)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rllib_ext.cli.checkpoints import (
    RUN_STATE_FILE,
    SETTINGS_FILE,
    RunState,
    commit_checkpoint,
    find_checkpoint,
    read_run_state,
    scan,
)
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.interrupts import RunInterrupted, Signals
from rllib_ext.cli.progress import IterationStats, ProgressReporter, estimate_eta
from rllib_ext.cli.runconfig import CORE_OPTIONS, TrainSettings
from rllib_ext.cli.rundir import plan_run
from rllib_ext.cli.runlog import PROGRESS_FILE, RESULT_FILE, RunLog, trim_after
from rllib_ext.cli.sinks import format_summary
from rllib_ext.cli.train import Segment, run_training_loop


class FakeAlgo:
    """``train()`` returns RLlib-shaped results with the given return curve."""

    def __init__(
        self,
        returns: list[float],
        steps_per_iter: int = 1000,
        interrupt_at: int = -1,
        signum: int = signal.SIGINT,
    ):
        self.returns = returns
        self.steps_per_iter = steps_per_iter
        self.interrupt_at = interrupt_at
        self.signum = signum
        self.iteration = 0
        self.saved: list[str] = []

    def train(self) -> dict[str, Any]:
        if self.iteration == self.interrupt_at:
            raise RunInterrupted(self.signum)
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


def _loop(algo: FakeAlgo, run_dir: Path, **settings: Any):
    settings_obj = TrainSettings(run_dir=str(run_dir), **settings)
    run_log = RunLog(run_dir, {"lr": 1.0})
    reporter = ProgressReporter(
        stop_reward=settings_obj.stop_reward,
        stop_timesteps=settings_obj.stop_timesteps,
        time_budget=settings_obj.time_budget,
        enabled=False,
    )
    signals = Signals()
    try:
        return run_training_loop(
            algo,
            settings_obj,
            checkpoint_dir=run_dir / "checkpoints",
            run_log=run_log,
            progress=reporter,
            segment=Segment(RunState(0, 0, 0.0, 0.0, 0, str(run_dir)), time.perf_counter()),
            signals=signals,
        )
    finally:
        run_log.close()


def test_stops_at_the_reward_and_commits_complete_checkpoints(tmp_path: Path) -> None:
    algo = FakeAlgo([10, 100, 300, 460, 480])
    outcome = _loop(algo, tmp_path, stop_reward=450.0, checkpoint_freq=2)
    assert outcome.stop_reason == "stop_reward"
    assert algo.iteration == 4
    # Written under a temporary name, then renamed into place.
    assert [name.split(".tmp-")[0] for name in algo.saved] == [".iter_000002", ".iter_000004"]
    assert outcome.checkpoint == (tmp_path / "checkpoints" / "iter_000004").resolve()
    assert json.loads((outcome.checkpoint / SETTINGS_FILE).read_text())["stop_reward"] == 450.0
    state = read_run_state(outcome.checkpoint)
    assert state is not None and state.iteration == 4 and state.env_steps == 4000
    assert state.segments == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "iter_000002",
        "iter_000004",
    ]


def test_stops_at_timesteps_and_time_budget(tmp_path: Path) -> None:
    algo = FakeAlgo([1.0] * 10, steps_per_iter=1000)
    assert _loop(algo, tmp_path / "a", stop_timesteps=2500).stop_reason == "stop_timesteps"
    assert algo.iteration == 3
    algo = FakeAlgo([1.0] * 10)
    assert _loop(algo, tmp_path / "b", time_budget=1e-9).stop_reason == "time_budget"
    assert algo.iteration == 1


@pytest.mark.parametrize(
    ("signum", "reason"), [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")]
)
def test_a_signal_saves_a_checkpoint(tmp_path: Path, signum: int, reason: str) -> None:
    algo = FakeAlgo([1.0] * 10, interrupt_at=3, signum=signum)
    outcome = _loop(algo, tmp_path, checkpoint_freq=0)
    assert outcome.stop_reason == reason
    assert [name.split(".tmp-")[0] for name in algo.saved] == [".iter_000003"]
    assert outcome.last_result["training_iteration"] == 3
    assert outcome.state.iteration == 3


def test_run_files_are_tune_format_and_readable_by_tune(tmp_path: Path) -> None:
    from ray.tune import Result

    algo = FakeAlgo([1.0, 2.0, 3.0])
    _loop(algo, tmp_path, stop_timesteps=3000)
    frame = pd.read_csv(tmp_path / PROGRESS_FILE)
    assert list(frame["training_iteration"]) == [1, 2, 3]
    assert list(frame["env_runners/episode_return_mean"]) == [1.0, 2.0, 3.0]
    # First seen in iteration 2: the header was widened, iteration 1 has no value.
    assert math.isnan(frame["learners/default_policy/vf_loss"][0])
    assert "config/lr" not in frame.columns
    rows = [json.loads(line) for line in (tmp_path / RESULT_FILE).read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert json.loads((tmp_path / "params.json").read_text()) == {"lr": 1.0}
    assert list(tmp_path.glob("events.out.tfevents.*"))
    result = Result.from_path(str(tmp_path))
    assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3]


def test_trim_drops_later_rows_and_partial_lines_by_rename(tmp_path: Path) -> None:
    run_log = RunLog(tmp_path, {}, tensorboard=False)
    for i in range(1, 5):
        run_log.write({"training_iteration": i, "a": {"b": float(i)}})
    run_log.close()
    with (tmp_path / RESULT_FILE).open("a") as f:
        f.write('{"training_iteration": 5, "a": ')  # a kill in the middle of a row
    with (tmp_path / PROGRESS_FILE).open("a") as f:
        f.write("5,")
    inodes = {name: os.stat(tmp_path / name).st_ino for name in (RESULT_FILE, PROGRESS_FILE)}
    trim_after(tmp_path, 2)
    for name, inode in inodes.items():
        assert os.stat(tmp_path / name).st_ino != inode, f"{name} was rewritten in place"
    assert list(pd.read_csv(tmp_path / PROGRESS_FILE)["training_iteration"]) == [1, 2]
    rows = (tmp_path / RESULT_FILE).read_text().splitlines()
    assert [json.loads(r)["training_iteration"] for r in rows] == [1, 2]


def test_a_resumed_csv_keeps_its_columns_aligned(tmp_path: Path) -> None:
    run_log = RunLog(tmp_path, {}, tensorboard=False)
    run_log.write({"training_iteration": 1, "x": 10.0, "y": 20.0})
    run_log.close()
    # The next segment's results list the keys in another order and add one.
    run_log = RunLog(tmp_path, {}, tensorboard=False)
    run_log.write({"z": 3.0, "y": 21.0, "x": 11.0, "training_iteration": 2})
    run_log.write({"y": 22.0, "training_iteration": 3, "x": 12.0, "z": 4.0})
    run_log.close()
    frame = pd.read_csv(tmp_path / PROGRESS_FILE)
    assert list(frame["training_iteration"]) == [1, 2, 3]
    assert list(frame["x"]) == [10.0, 11.0, 12.0]
    assert list(frame["y"]) == [20.0, 21.0, 22.0]
    assert list(frame["z"].fillna(-1)) == [-1, 3.0, 4.0]


class _Interrupted(Exception):
    pass


class _DyingAlgo(FakeAlgo):
    def save_to_path(self, path: str) -> str:
        Path(path).mkdir(parents=True)
        (Path(path) / "rllib_checkpoint.json").write_text("{}")
        raise _Interrupted  # killed after RLlib's metadata, before the rest


def _commit(algo: FakeAlgo, checkpoint_dir: Path, iteration: int) -> Path:
    algo.iteration = iteration
    state = RunState(iteration, iteration * 10, 1.0, 1.0, 1, str(checkpoint_dir.parent))
    return commit_checkpoint(algo, checkpoint_dir, settings={"seed": 1}, state=state)


def test_resume_picks_the_newest_complete_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    first = _commit(FakeAlgo([]), checkpoints, 1)
    second = _commit(FakeAlgo([]), checkpoints, 2)
    with pytest.raises(_Interrupted):
        _commit(_DyingAlgo([]), checkpoints, 3)
    # An older version's half-written checkpoint: RLlib's metadata only.
    (checkpoints / "iter_000004").mkdir()
    (checkpoints / "iter_000004" / "rllib_checkpoint.json").write_text("{}")
    # A stale pointer in summary.json is ignored.
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"checkpoint": str(first)}))
    found = scan(checkpoints)
    assert found.complete == (first, second)
    assert len(found.incomplete) == 2
    with caplog.at_level("WARNING", logger="rllib_ext.cli"):
        assert find_checkpoint(tmp_path / "run", flag="--resume") == second
    (line,) = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
    assert ".iter_000003.tmp-" in line and "iter_000004 (no rllib_ext_settings.json" in line
    # Kept for inspection, never deleted.
    assert (checkpoints / "iter_000004").is_dir() and len(list(checkpoints.iterdir())) == 4
    with pytest.raises(CLIError, match="incomplete checkpoint"):
        find_checkpoint(checkpoints / "iter_000004", flag="evaluate")
    # A relative path comes back absolute (pyarrow rejects relative ones).
    relative = os.path.relpath(second)
    assert find_checkpoint(relative, flag="evaluate") == second
    # RLlib's own checkpoint (no rllib_ext files) named directly is accepted.
    plain = tmp_path / "plain"
    FakeAlgo([]).save_to_path(str(plain))
    assert find_checkpoint(plain, flag="evaluate") == plain.resolve()
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(CLIError, match="no complete checkpoint"):
        find_checkpoint(empty, flag="--resume")


def test_a_run_dir_is_continued_not_overwritten(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "settings.json").write_text("{}")
    first = _commit(FakeAlgo([]), run_dir / "checkpoints", 1)
    newest = _commit(FakeAlgo([]), run_dir / "checkpoints", 2)
    plan = plan_run(TrainSettings(resume=str(newest)))
    assert plan.run_dir == run_dir.resolve() and plan.continues_here
    assert plan.base.iteration == 2 and plan.base.env_steps == 20
    with pytest.raises(CLIError, match="would overwrite"):
        plan_run(TrainSettings(resume=str(first)))
    with pytest.raises(CLIError, match="would overwrite"):
        plan_run(TrainSettings(run_dir=str(run_dir)))
    branch = plan_run(TrainSettings(resume=str(first), run_dir=str(tmp_path / "branch")))
    assert not branch.continues_here and branch.base.iteration == 1
    (tmp_path / "file").write_text("")
    with pytest.raises(CLIError, match="is a file"):
        plan_run(TrainSettings(run_dir=str(tmp_path / "file")))


def test_signals_first_raises_second_exits_at_once() -> None:
    signals = Signals()
    with signals.installed():
        with pytest.raises(RunInterrupted) as info:
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                finished_section = True
        assert finished_section and info.value.signum == signal.SIGTERM
    # The second signal: a fresh process, because it calls os._exit.
    code = (
        "import os, signal, time\n"
        "from rllib_ext.cli.interrupts import Signals\n"
        "s = Signals()\n"
        "with s.installed():\n"
        "    s.stopping()\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143
    assert "second signal" in proc.stderr
    assert time.monotonic() - started < 30


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
    assert RUN_STATE_FILE != SETTINGS_FILE


class _NodeLostWhileSaving(FakeAlgo):
    """``save_to_path`` of iteration ``lost_at`` fails as RLlib's learner group does when a
    learner's node died mid-save (its ``get_state`` call raises ``ActorUnavailableError``)."""

    lost_at = 4

    def save_to_path(self, path: str) -> str:
        from ray.exceptions import ActorUnavailableError

        if self.iteration == self.lost_at:
            Path(path).mkdir(parents=True)  # the partial save RLlib leaves behind
            raise ActorUnavailableError("RpcError: Connection reset by peer", b"\x00" * 16)
        return super().save_to_path(path)


def test_a_node_lost_while_saving_ends_in_one_line_naming_the_last_complete_checkpoint(
    tmp_path: Path,
) -> None:
    algo = _NodeLostWhileSaving([1.0] * 10)
    with pytest.raises(CLIError) as info:
        _loop(algo, tmp_path, checkpoint_freq=2)
    message = str(info.value)
    assert message.startswith("a Ray node or actor of this run was lost in saving checkpoint 4")
    assert "ActorUnavailableError" in message
    newest = (tmp_path / "checkpoints" / "iter_000002").resolve()
    assert f"Last complete checkpoint: {newest}." in message
    assert f"--resume {tmp_path}." in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert scan(tmp_path / "checkpoints").newest == newest


def test_a_bug_while_saving_is_not_called_a_lost_node(tmp_path: Path) -> None:
    class _Broken(FakeAlgo):
        def save_to_path(self, path: str) -> str:
            raise ValueError("bad state")

    with pytest.raises(ValueError, match="bad state"):
        _loop(_Broken([1.0] * 10), tmp_path, checkpoint_freq=1)
