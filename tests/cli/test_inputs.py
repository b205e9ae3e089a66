"""Every bad user input ends in one ``rllib-ext: error:`` line and a non-zero exit.

The first group is refused before Ray starts (no Ray in the process); the ``slow`` group needs
a trained checkpoint or a real run (custom env forms end to end, corrupt/mismatched checkpoints).
"""

from __future__ import annotations

import json
import pickle
import shutil
import socket
from pathlib import Path

import pytest

from rllib_ext.cli.main import main

TINY = [
    "--training",
    '{"train_batch_size": 200, "minibatch_size": 100, "num_epochs": 1}',
    "--num-envs-per-env-runner",
    "1",
    "--stop-reward",
    "none",
    "--seed",
    "0",
    "--no-progress",
]


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("rllib-ext: error:")]


def _one_line_error(capsys: pytest.CaptureFixture[str], status: int, *fragments: str) -> str:
    lines = _error_lines(capsys)
    assert status != 0
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"  # nothing listens there once the socket is closed


FORMS = "'module:EnvId-v0'"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--env", "NoSuchEnv-v0"], ["'NoSuchEnv-v0' is not a known environment", FORMS]),
        (
            ["--env", "tests.cli._env_doubles:NoSuch-v0"],
            ["is not a known environment", FORMS],
        ),
        (["--env", "no_such_module_xyz:Env-v0"], ["cannot import module", FORMS]),
        (["--env", "tests.cli._env_doubles.NoSuchClass"], ["has no 'NoSuchClass'", FORMS]),
        (["--env", "json.dumps"], ["not a gymnasium.Env or MultiAgentEnv subclass", FORMS]),
        (["--env", "a:b:c"], ["not of the form 'module:EnvId-v0'"]),
        (
            ["--env", "smac_v2", "--env-config", '{"backend": "smacv2"}'],
            ["backend 'smacv2' cannot run map '3m'", "package not installed", "smax"],
        ),
        (
            ["--env", "smax", "--env-config", '{"map_name": "no_such_map"}'],
            ["'no_such_map' is not a SMAX scenario", "3m"],
        ),
        (["--env", "smax", "--env-config", '{"backend": "sc3"}'], ["backend"]),
        (["--non-finite", "ignore"], ["--non-finite", "warn, drop"]),
        (["--learner-timeout", "0"], ["--learner-timeout", "> 0"]),
        (["--restart-failed-env-runners", "maybe"], ["--restart-failed-env-runners"]),
        (["--address", "no-port-here"], ["is not HOST:PORT"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None,
)
def test_bad_input_is_one_line_before_ray(
    argv: list[str], fragments: list[str], no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["train", *argv])
    _one_line_error(capsys, status, *fragments)


def test_dead_address_fails_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    address = _dead_address()
    status = main(["train", "--address", address])
    _one_line_error(capsys, status, f"--address '{address}'", "no Ray cluster answers")


def test_run_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "not_a_dir"
    file.write_text("x")
    _one_line_error(capsys, main(["train", "--run-dir", str(file)]), "is a file")
    inner = str(file / "run")
    _one_line_error(capsys, main(["train", "--run-dir", inner]), "is under the file")


def test_non_utf8_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "latin1.yaml"
    config.write_bytes("env: CartPole-v1  # caf\u00e9\n".encode("latin-1"))
    status = main(["train", "--config", str(config)])
    _one_line_error(capsys, status, "latin1.yaml", "not UTF-8")


# ---------------------------------------------------------------------------------------------
# Through real RLlib.


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(
    "env",
    [
        "tests.cli._env_doubles:FlakyCartPole-v0",  # module:EnvId, the module registers it
        "tests.cli._env_doubles.FlakyCartPole",  # pkg.module.Class, a gymnasium.Env
        "tests.cli._env_doubles.TwoCartPoles",  # pkg.module.Class, an RLlib MultiAgentEnv
    ],
)
def test_custom_env_forms_train_end_to_end(env: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--env", env, "--env-config", '{"p_crash": 0.0}', "--stop-timesteps", "200"]
    assert main([*argv, *TINY, "--run-dir", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 200
    assert summary["settings"]["env"] == env


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, ray_session: object) -> Path:
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    argv = ["train", "--stop-timesteps", "200", *TINY, "--run-dir", str(run_dir)]
    assert main(argv) == 0
    return Path(json.loads((run_dir / "summary.json").read_text())["checkpoint"])


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: max(1, len(data) // 3)])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("suffix", [".pkl", ".json"])
def test_truncated_checkpoint_files(
    suffix: str, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, broken)
    files = sorted(p for p in broken.rglob(f"*{suffix}") if p.stat().st_size > 16)
    assert files, f"no {suffix} file in {broken}"
    for file in files:
        _truncate(file)
    capsys.readouterr()
    for argv in (
        ["train", "--resume", str(broken), *TINY, "--run-dir", str(tmp_path / "resumed")],
        ["evaluate", str(broken), "--episodes", "1"],
    ):
        status = main(argv)
        _one_line_error(capsys, status)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_checkpoint_of_another_envs_spaces(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["train", "--resume", str(checkpoint), "--env", "Acrobot-v1", *TINY]
    status = main([*argv, "--run-dir", str(tmp_path / "acrobot")])
    _one_line_error(capsys, status, "does not fit this env/model", "--env")


def test_unpickling_error_names_the_checkpoint() -> None:
    from rllib_ext.cli.inputs import one_line_error

    message = one_line_error(pickle.UnpicklingError("pickle data was truncated"), checkpoint="c")
    assert message is not None and "checkpoint 'c' is incomplete or corrupt" in message
    assert one_line_error(ValueError("unrelated")) is None
