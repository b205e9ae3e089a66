"""``rllib-ext train --address`` under Ray's token authentication (``rllib_ext.cli.ray_auth``).

The unit tests pin the rules (where a token is found, when ``RAY_AUTH_MODE`` is set, which
errors are authentication failures); the cluster tests start a real ``ray start --head`` with
token authentication on and join it with a wrong token (one line) and, marked slow, with the
right token and ``RAY_AUTH_MODE`` unset (it trains).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllib_ext.cli.ray_auth import AUTH_FIX, auth_failure, client_auth, token_source
from tests.cli._procs import console_script, free_port, stop_ray_head, token_auth_env

# The text Ray 2.60 raises after its retries (ConnectionError from RuntimeError).
REFUSED = (
    "Failed to connect to GCS. Last connection error: ... RuntimeError: Failed to get cluster "
    "ID from GCS server: Unauthenticated: RPC error: InvalidAuthToken: Authentication token is "
    "missing or incorrect"
)


def test_the_token_is_found_in_rays_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert token_source({}) is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a" * 64)
    assert token_source({}) == str(tmp_path / ".ray" / "auth_token")
    path = tmp_path / "other_token"
    assert token_source({"RAY_AUTH_TOKEN_PATH": str(path)}) is None  # named but absent
    path.write_text("b" * 64)
    assert token_source({"RAY_AUTH_TOKEN_PATH": str(path)}) == f"RAY_AUTH_TOKEN_PATH={path}"
    assert token_source({"RAY_AUTH_TOKEN": "c", "RAY_AUTH_TOKEN_PATH": str(path)}) == (
        "RAY_AUTH_TOKEN"
    )


def test_client_auth_sends_an_available_token_and_respects_an_explicit_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    env: dict[str, str] = {}
    assert client_auth(env) == "none (no token on this machine)"
    assert env == {}
    env = {"RAY_AUTH_TOKEN": "x"}
    assert client_auth(env) == "token (from RAY_AUTH_TOKEN)"
    assert env["RAY_AUTH_MODE"] == "token"
    env = {"RAY_AUTH_TOKEN": "x", "RAY_AUTH_MODE": "disabled"}
    assert client_auth(env) == "disabled (RAY_AUTH_MODE)"
    assert env["RAY_AUTH_MODE"] == "disabled"


def test_an_authentication_failure_becomes_one_line_with_the_fix() -> None:
    try:
        try:
            raise RuntimeError(REFUSED)
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as exc:
        line = auth_failure(exc, "10.0.0.1:6379")
    assert line is not None and "\n" not in line
    assert line.startswith("--address 10.0.0.1:6379: the Ray cluster refused this client's ")
    assert line.endswith(AUTH_FIX)
    assert "RAY_AUTH_MODE" in AUTH_FIX and "auth_token" in AUTH_FIX


def test_other_connection_failures_are_not_called_authentication() -> None:
    exc = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    exc.__cause__ = RuntimeError("Failed to connect to GCS. Last connection error: timed out")
    assert auth_failure(exc, "10.0.0.1:6379") is None


@pytest.fixture
def token_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A ``ray start --head`` with token authentication on: its address and auth environment."""
    auth = token_auth_env(tmp_path)
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rxa", dir="/tmp")  # short: unix socket paths
    with (tmp_path / "head.log").open("w") as log:
        head = subprocess.Popen(
            [console_script("ray"), "start", "--head", f"--port={port}", "--num-cpus=1"]
            + [f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"]
            + ["--block"],
            env={**os.environ, **auth},
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "Ray head did not come up"
            time.sleep(0.5)
        time.sleep(2)  # the GCS listens before it serves
        yield f"127.0.0.1:{port}", auth
    finally:
        stop_ray_head(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _train(address: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [console_script("rllib-ext"), "train", "--address", address, "--no-progress"]
    argv += ["--stop-reward", "none", "--checkpoint-freq", "0", *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(argv, env={**clean, **env}, capture_output=True, text=True, timeout=300)


def test_a_wrong_token_is_one_line(token_head: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    address, auth = token_head
    wrong = {**auth, "RAY_AUTH_TOKEN": "0" * 64}
    done = _train(address, wrong, "--run-dir", str(tmp_path / "run"), "--stop-timesteps", "200")
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rllib-ext: error:")]
    assert errors == [done.stderr.strip().splitlines()[-1]], done.stderr[-3000:]
    assert f"--address {address}: the Ray cluster refused" in errors[0]
    assert "token: RAY_AUTH_TOKEN" in errors[0] and "Fix:" in errors[0]
    assert "Traceback" not in done.stderr and "gcs_client" not in done.stderr, done.stderr


@pytest.mark.slow
def test_the_right_token_with_the_mode_unset_trains(
    token_head: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """As after a plain local run on Ray >= 2.59: a token on this machine, RAY_AUTH_MODE unset."""
    address, auth = token_head
    run_dir = tmp_path / "run"
    token_only = {"RAY_AUTH_TOKEN_PATH": auth["RAY_AUTH_TOKEN_PATH"]}
    done = _train(address, token_only, "--run-dir", str(run_dir), "--stop-timesteps", "400")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ray auth: token (from RAY_AUTH_TOKEN_PATH={auth['RAY_AUTH_TOKEN_PATH']})" in (
        done.stderr
    )
    assert (run_dir / "result.json").read_text().strip()
