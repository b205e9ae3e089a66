"""Fault injection: ``rllib-ext train`` killed at 21 points of one run, resumed after each.

One Ray head is started for the test (``ray start --head --block`` in its own process group);
every ``rllib-ext train`` segment is a separate process that joins it with ``--address`` and
trains CartPole with tiny batches, a checkpoint per iteration. Kill points, in turn:

* SIGKILL at a random moment (start-up, training, writing a row or a checkpoint);
* SIGKILL while a checkpoint is half written (the test hook
  :data:`~rllib_ext.cli.checkpoints.COMMIT_DELAY_ENV` holds the commit open);
* SIGTERM (exit 143 with a summary), one SIGINT (exit 130), and two SIGINTs in quick
  succession, the second one landing in the final checkpoint write (exit 130 at once).

After every kill the next segment resumes the run directory. Checked: it restores the newest
*complete* checkpoint, its first iteration follows that checkpoint's and its lifetime env steps
are past the checkpoint's, ``summary.json`` always parses, and at the end ``result.json`` and
``progress.csv`` hold every iteration exactly once.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from rllib_ext.cli.checkpoints import COMMIT_DELAY_ENV, RunState, read_run_state, scan
from tests.cli._procs import console_script, free_port, stop_ray_head, token_auth_env

pytestmark = pytest.mark.slow

KILL_POINTS = 21
KINDS = ("sigkill_random", "sigkill_commit", "sigterm", "sigkill_random", "sigint_twice", "sigint")
BATCH = 128
TRAINING = json.dumps(
    {"train_batch_size_per_learner": BATCH, "minibatch_size": 64, "num_epochs": 1}
)
EXPECTED_CODE = {"sigterm": 143, "sigint": 130, "sigint_twice": 130}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head for this module only.

    Token authentication on, with its own token (``RAY_AUTH_MODE`` set explicitly for the
    head and the runs, see ``token_auth_env``). Its own ``--temp-dir``: ``ray start`` writes the cluster address into the temp dir, and in
    the default one (``/tmp/ray``) every later ``ray.init()`` on the machine would join this
    cluster. Never ``ray stop``: that would end every Ray on the machine.
    """
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rxf", dir="/tmp")  # short: unix socket paths
    folder = tmp_path_factory.mktemp("ray_head")
    log = (folder / "head.log").open("w")
    # The head and every `rllib-ext train --address` of the module share one token.
    patch = pytest.MonkeyPatch()
    for name, value in token_auth_env(folder).items():
        patch.setenv(name, value)
    head = subprocess.Popen(
        [console_script("ray"), "start", "--head", f"--port={port}", "--num-cpus=2", "--block"]
        + [f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, "ray start --head exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "Ray head did not come up"
            time.sleep(0.5)
        yield address
    finally:
        stop_ray_head(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        patch.undo()


def _rows(run_dir: Path) -> list[dict]:
    """Complete rows of result.json (a SIGKILL can cut the last one short)."""
    path = run_dir / "result.json"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().split("\n")[:-1]:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _newest(run_dir: Path) -> tuple[Path | None, RunState | None]:
    newest = scan(run_dir / "checkpoints").newest
    return newest, read_run_state(newest) if newest is not None else None


def _wait(proc: subprocess.Popen, condition, what: str, timeout: float = 180.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return True


def test_kill_anywhere_and_resume(tmp_path: Path, ray_head: str) -> None:
    rng = random.Random(12)
    script = console_script("rllib-ext")
    run_dir = tmp_path / "run"
    common = ["--address", ray_head, "--no-progress"]
    survived, unverified = 0, 0
    previous_state: RunState | None = None
    started = time.monotonic()

    def segment(extra: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, Path | None]:
        newest, _ = _newest(run_dir)
        if newest is None:  # nothing complete yet: start the run (again)
            argv = ["train", "--run-dir", str(run_dir), "--seed", "0", "--stop-reward", "none"]
            argv += ["--stop-timesteps", "100000000", "--training", TRAINING]
        else:
            argv = ["train", "--resume", str(run_dir)]
        proc = subprocess.Popen(
            [script, *argv, *common, *extra],
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        return proc, newest

    def verify(proc: subprocess.Popen, resumed: Path | None, state: RunState | None, err: str):
        """The segment's rows continue right after the checkpoint it had to resume."""
        nonlocal survived, unverified
        own = [r for r in _rows(run_dir) if r.get("pid") == proc.pid]
        if resumed is not None and "resumed from" in err:
            assert f"resumed from {resumed} " in err, err[-3000:]
        if not own:
            return
        first_iteration = state.iteration if state is not None else 0
        assert own[0]["training_iteration"] == first_iteration + 1
        steps = [r["num_env_steps_sampled_lifetime"] for r in own]
        assert steps[0] > (state.env_steps if state is not None else 0)
        assert steps == sorted(steps)
        survived += unverified
        unverified = 0

    for point in range(KILL_POINTS):
        kind = KINDS[point % len(KINDS)]
        _, state_before = _newest(run_dir)
        env = {COMMIT_DELAY_ENV: "1.5" if kind in ("sigkill_commit", "sigint_twice") else ""}
        extra = ["--checkpoint-freq", "0" if kind == "sigint_twice" else "1"]
        proc, resumed = segment(extra, env)
        try:

            def own_row(pid: int = proc.pid) -> bool:
                return any(r.get("pid") == pid for r in _rows(run_dir))

            if kind == "sigkill_random":
                time.sleep(rng.uniform(0.5, 9.0))
                os.killpg(proc.pid, signal.SIGKILL)
            elif kind == "sigkill_commit":
                pattern = re.compile(rf"^\.iter_\d+\.tmp-{proc.pid}-")

                def in_commit(pattern: re.Pattern[str] = pattern) -> bool:
                    folder = run_dir / "checkpoints"
                    return folder.is_dir() and any(pattern.match(p.name) for p in folder.iterdir())

                assert _wait(proc, in_commit, "a checkpoint write"), proc.communicate()[1][-3000:]
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                assert _wait(proc, own_row, "a training iteration"), proc.communicate()[1][-3000:]
                proc.send_signal(signal.SIGTERM if kind == "sigterm" else signal.SIGINT)
                if kind == "sigint_twice":
                    time.sleep(0.3)  # inside the final checkpoint write (held open 1.5 s)
                    proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        unverified += 1
        if kind in EXPECTED_CODE:
            assert proc.returncode == EXPECTED_CODE[kind], err[-3000:]
            if kind != "sigint_twice":
                assert "Traceback" not in err, err[-3000:]
                summary = json.loads((run_dir / "summary.json").read_text())
                assert summary["stop_reason"] == (
                    "terminated" if kind == "sigterm" else "interrupted"
                )
        else:
            assert proc.returncode == -signal.SIGKILL
        verify(proc, resumed, state_before, err)
        if (run_dir / "summary.json").exists():
            json.loads((run_dir / "summary.json").read_text())  # always whole (atomic write)
        _, state_after = _newest(run_dir)
        if previous_state is not None:
            assert state_after is not None
            assert state_after.iteration >= previous_state.iteration
            assert state_after.env_steps >= previous_state.env_steps
        previous_state = state_after

    # The last segment runs to its stop criterion and verifies the remaining kill points.
    newest, state = _newest(run_dir)
    assert newest is not None and state is not None
    stop = state.env_steps + 2 * BATCH
    proc, resumed = segment(["--stop-timesteps", str(stop), "--checkpoint-freq", "1"], {})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    verify(proc, resumed, state, err)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "stop_timesteps" and summary["env_steps"] >= stop
    assert summary["segments"] >= 2
    iterations = [r["training_iteration"] for r in _rows(run_dir)]
    assert iterations == list(range(1, summary["iterations"] + 1))
    progress = pd.read_csv(run_dir / "progress.csv")
    assert list(progress["training_iteration"]) == iterations
    steps = list(progress["num_env_steps_sampled_lifetime"])
    assert steps == sorted(steps)
    assert survived == KILL_POINTS
    print(
        f"\nfault injection: survived {survived}/{KILL_POINTS} kill points "
        f"({summary['iterations']} iterations, {summary['segments']} segments in the final "
        f"lineage, {time.monotonic() - started:.0f} s)"
    )
