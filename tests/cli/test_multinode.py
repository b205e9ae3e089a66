"""``rllib-ext train --address`` on a real two-node Ray cluster (two raylets on this machine).

Both nodes come from ``ray start`` (``--head`` and ``--address``), each with 2 CPUs and one
``learner_slot`` custom resource; ``--custom-resources-per-learner '{"learner_slot": 1}'`` puts
the 2 learners on different nodes. The run (2 env runners, 2 learners, PowerSGD) trains and
checkpoints; then the worker node's raylet is killed mid-run, which must end the run with one
error line, and ``--resume`` while that node is gone must fail in one line too.
``examples/multinode_two_nodes.sh`` is the same story with a restart of the node at the end.

Never ``ray stop``: it would end every Ray on the machine. The nodes run as ``ray start --block``
in their own process groups and are stopped through those groups.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rllib_ext.cli.checkpoints import scan
from rllib_ext.cli.loop import lost_cluster_member
from tests.cli._procs import console_script, free_port, token_auth_env

SLOT = '{"learner_slot": 1}'
TRAINING = json.dumps({"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1})


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _stop_group(proc: subprocess.Popen) -> None:
    """Ends a ``ray start --block`` node: its process group holds every process it started."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@dataclass
class TwoNodes:
    address: str
    head: subprocess.Popen
    worker: subprocess.Popen

    def alive_nodes(self) -> int:
        """Alive nodes as the GCS sees them (``ray status`` lists a lost node for minutes)."""
        code = (
            f"import ray; ray.init(address={self.address!r}, logging_level='ERROR', "
            "log_to_driver=False); print('alive nodes:', sum(n['Alive'] for n in ray.nodes()))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        # Ray may print its own lines to stdout too (seen: a warning ending in "workload.").
        found = re.search(r"^alive nodes: (\d+)$", out.stdout, flags=re.MULTILINE)
        return int(found.group(1)) if out.returncode == 0 and found else 0

    def worker_raylet(self) -> int:
        found = subprocess.run(
            ["pgrep", "-g", str(self.worker.pid), "-x", "raylet"], capture_output=True, text=True
        )
        return int(found.stdout.split()[0])


@pytest.fixture
def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodes]:
    """A head and a worker node, 2 CPUs and one ``learner_slot`` each, in their own temp dir,
    under token authentication (``RAY_AUTH_MODE`` and the token shared by nodes and runs)."""
    for name, value in token_auth_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    ray = console_script("ray")
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rxmn", dir="/tmp")  # short: unix socket paths
    address = f"127.0.0.1:{port}"
    node = ["--num-cpus=2", f"--resources={SLOT}", "--disable-usage-stats", "--block"]
    started: list[subprocess.Popen] = []

    def start(args: list[str], log: str) -> subprocess.Popen:
        with (tmp_path / log).open("w") as out:
            proc = subprocess.Popen(
                [ray, "start", *args, *node], start_new_session=True, stdout=out, stderr=out
            )
        started.append(proc)
        return proc

    try:
        head = start(
            [
                "--head",
                f"--port={port}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
            ],
            "head.log",
        )
        cluster = TwoNodes(address, head, head)
        _wait_for(lambda: cluster.alive_nodes() == 1, "the head node")
        cluster.worker = start([f"--address={address}"], "worker.log")
        _wait_for(lambda: cluster.alive_nodes() == 2, "the worker node")
        yield cluster
    finally:
        for proc in reversed(started):
            _stop_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _train(address: str, run_dir: Path, *extra: str, stderr: Path) -> subprocess.Popen:
    argv = [console_script("rllib-ext"), "train", "--address", address, "--no-progress"]
    argv += ["--num-env-runners", "2", "--num-envs-per-env-runner", "1", "--num-learners", "2"]
    argv += ["--custom-resources-per-learner", SLOT, "--grad-compression", "powersgd"]
    argv += ["--training", TRAINING, "--stop-reward", "none", "--checkpoint-freq", "1", *extra]
    with stderr.open("w") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True)


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("rllib-ext: error:")]


@pytest.mark.slow
def test_learners_on_two_nodes_train_and_a_lost_node_ends_in_one_line(
    tmp_path: Path, two_nodes: TwoNodes
) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "train.err"
    proc = _train(
        two_nodes.address,
        run_dir,
        "--run-dir",
        str(run_dir),
        "--seed",
        "0",
        "--stop-timesteps",
        "100000",
        stderr=log,
    )
    try:
        _wait_for(
            lambda: proc.poll() is not None or scan(run_dir / "checkpoints").newest is not None,
            "the first checkpoint",
            timeout=240,
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        checkpoint = scan(run_dir / "checkpoints").newest
        # The learners' nodes, from the watchdog's log line ("learner 1: pid N on NODE (IP); ...").
        watch = next(line for line in log.read_text().splitlines() if "learner watchdog" in line)
        nodes = set(re.findall(r"learner \d: pid \d+ on ([0-9a-f]+)", watch))
        assert len(nodes) == 2, watch
        row = json.loads((run_dir / "result.json").read_text().splitlines()[0])
        comm = row["learners"]["default_policy"]
        assert any(key.startswith("rllib_ext/comm/") for key in comm), sorted(comm)

        os.kill(two_nodes.worker_raylet(), signal.SIGKILL)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    assert code != 0, err[-3000:]
    # Before it, Ray and RLlib log the remote failures (with the actors' tracebacks) as they see them.
    errors = _error_lines(err)
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err[-3000:]
    assert "a Ray node or actor of this run was lost" in errors[0], errors[0]
    # ... but our own error is not among them: it is raised after Ray's shutdown logging.
    assert "CLIError" not in err, err[-3000:]
    newest = scan(run_dir / "checkpoints").newest
    assert newest is not None and newest.name >= checkpoint.name
    assert f"Last complete checkpoint: {newest}." in errors[0], errors[0]
    assert f"--resume {run_dir}." in errors[0], errors[0]

    # Ray's GCS marks a node dead after missed health checks; on a busy 2-core machine that has
    # taken over 120 s.
    _wait_for(lambda: two_nodes.alive_nodes() == 1, "the worker node marked dead", timeout=360)
    resumed_log = tmp_path / "resume.err"
    resumed = _train(two_nodes.address, run_dir, "--resume", str(run_dir), stderr=resumed_log)
    assert resumed.wait(timeout=120) == 2
    err = resumed_log.read_text()
    assert "Traceback" not in err, err[-3000:]
    (error,) = _error_lines(err)
    assert "'learner_slot'" in error and "has 1" in error, error


def test_lost_peer_and_dead_actor_are_recognised_other_errors_are_not() -> None:
    from ray.exceptions import ActorDiedError, RayTaskError

    peer = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:56525. Crashing.")
    wrapped = RayTaskError("apply", "Traceback ...", peer).as_instanceof_cause()
    assert lost_cluster_member(wrapped) == f"RuntimeError: {peer}"
    assert lost_cluster_member(ActorDiedError()).startswith("ActorDiedError: ")
    bug = RayTaskError("apply", "Traceback ...", ValueError("bad shape")).as_instanceof_cause()
    assert lost_cluster_member(bug) is None
    assert lost_cluster_member(RuntimeError("Connection closed by peer")) is None
