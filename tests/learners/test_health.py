"""Learner health: a stopped learner (SIGSTOP) fails ``rllib-ext train`` in one line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from rllib_ext.learners.health import LearnerWatchdog

TIMEOUT_S = 20
MARGIN_S = 90  # Ray start-up is not in it: the clock starts at the SIGSTOP


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        LearnerWatchdog(object(), timeout_s=0)


@pytest.mark.slow
def test_stopped_learner_fails_the_run_in_one_line(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "rllib_ext.cli.main",
        "train",
        "--num-learners",
        "2",
        "--learner-timeout",
        str(TIMEOUT_S),
        "--stop-reward",
        "none",
        "--stop-timesteps",
        "100000000",
        "--num-envs-per-env-runner",
        "1",
        "--training",
        '{"train_batch_size": 200, "minibatch_size": 100, "num_epochs": 1}',
        "--run-dir",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr: list[str] = []
    watching = threading.Event()
    pids: list[int] = []

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            stderr.append(line)
            if "learner watchdog: 2 learners" in line:
                pids.extend(int(pid) for pid in re.findall(r"learner \d+: pid (\d+)", line))
                watching.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stopped: int | None = None
    try:
        assert watching.wait(300), "".join(stderr[-20:])
        assert len(pids) == 2, pids
        assert all(psutil.pid_exists(pid) for pid in pids)
        stopped = pids[1]
        os.kill(stopped, signal.SIGSTOP)
        status = proc.wait(timeout=TIMEOUT_S + MARGIN_S)
        reader.join(10)
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        # Whatever the run's own Ray left behind (raylet, workers) lives in its session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    errors = [line for line in stderr if line.startswith("rllib-ext: error:")]
    assert status != 0
    assert len(errors) == 1, "".join(stderr[-20:])
    assert f"pid {stopped}" in errors[0] and "--learner-timeout 20" in errors[0]
    assert "Last complete checkpoint" in errors[0]
