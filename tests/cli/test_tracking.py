"""``--wandb-project``, ``--mlflow-tracking-uri`` and ``--callbacks``: the logging tools RLlib and
Tune ship, wired into ``rllib-ext train`` (:mod:`rllib_ext.cli.tracking`)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rllib_ext.cli.main import main
from rllib_ext.cli.ppo_config import build_algo_config
from rllib_ext.cli.runconfig import TrainSettings, resolve_settings
from rllib_ext.cli.runlog import RunLog, run_trial_id
from rllib_ext.cli.tracking import MLFLOW_EXPERIMENT, tracker_callbacks

TINY = ["--training", '{"train_batch_size": 200, "minibatch_size": 100, "num_epochs": 1}']
TINY += ["--num-envs-per-env-runner", "1", "--stop-reward", "none", "--seed", "0"]
TINY += ["--stop-timesteps", "400", "--no-progress"]


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("rllib-ext: error: "), err
    return err[0]


# --------------------------------------------------------------------------------------------
# Bad input: one line, before Ray.


@pytest.mark.parametrize(
    "flag,value,package",
    [("--wandb-project", "my-project", "wandb"), ("--mlflow-tracking-uri", "file:///x", "mlflow")],
)
def test_a_missing_tracker_package_is_one_line_with_the_pip_fix(
    flag: str,
    value: str,
    package: str,
    no_ray: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # absent, even where it is installed
    assert main(["train", flag, value]) == 2
    line = _one_error_line(capsys)
    assert flag in line and f"pip install {package}" in line


CALLBACK_ERRORS = {
    "not_a_path": ("MyCallbacks", ["'MyCallbacks'", "'pkg.module:Class'"]),
    "no_module": ("no_such_module_xyz:Cb", ["cannot import module 'no_such_module_xyz'"]),
    "no_name": ("tests.cli._env_doubles:Missing", ["has no 'Missing'"]),
    "not_a_callback": ("tests.cli._env_doubles:FlakyCartPole", ["FlakyCartPole", "RLlibCallback"]),
}


@pytest.mark.parametrize("case", sorted(CALLBACK_ERRORS))
def test_bad_callbacks_are_one_line_before_ray(
    case: str, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    value, fragments = CALLBACK_ERRORS[case]
    assert main(["train", "--callbacks", value]) == 2
    line = _one_error_line(capsys)
    for fragment in ["--callbacks", *fragments]:
        assert fragment in line, (fragment, line)


def test_callbacks_join_rllib_exts_own_from_flag_and_yaml(tmp_path: Path) -> None:
    from rllib_ext.envs.guard import EnvGuardCallback
    from tests.cli._env_doubles import MarkResults

    settings = resolve_settings({"callbacks": "tests.cli._env_doubles:MarkResults"})
    assert settings.callbacks == ["tests.cli._env_doubles:MarkResults"]
    classes = build_algo_config(settings).callbacks_class
    assert MarkResults in classes and EnvGuardCallback in classes
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("callbacks: [tests.cli._env_doubles:MarkResults]\n")
    assert resolve_settings({}, config_file=str(yaml_file)).callbacks == settings.callbacks


def test_no_tracker_by_default() -> None:
    assert tracker_callbacks(TrainSettings()) == []


# --------------------------------------------------------------------------------------------
# MLflow wiring. A fake `mlflow` module (injected through sys.modules, labelled FAKE) records
# what Tune's MLflowLoggerCallback asks of it, so the wiring is tested where mlflow is not
# installed; the real-mlflow test below runs where it is.


class _FakeMlflow(types.ModuleType):
    """FAKE mlflow: the calls ray.air._internal.mlflow makes, recorded."""

    __version__ = "2.0.0"

    def __init__(self) -> None:
        super().__init__("mlflow")
        self.tracking_uri: str | None = None
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.MlflowClient = self._client_class()

    def set_tracking_uri(self, uri: str | None) -> None:
        self.tracking_uri = uri

    def set_registry_uri(self, uri: str | None) -> None:
        pass

    def get_tracking_uri(self) -> str | None:
        return self.tracking_uri

    def get_registry_uri(self) -> None:
        return None

    def get_experiment_by_name(self, name: str) -> Any:
        if name not in self.experiments:
            return None
        return types.SimpleNamespace(experiment_id=self.experiments[name])

    def create_experiment(self, name: str, artifact_location: Any = None) -> str:
        self.experiments[name] = str(len(self.experiments))
        return self.experiments[name]

    def get_run(self, run_id: str) -> Any:
        return self.runs[run_id]

    def active_run(self) -> None:
        return None

    def _client_class(self) -> type:
        fake = self

        class Client:
            def __init__(self, **kwargs: Any) -> None:
                pass

            def create_run(self, run_name: str, experiment_id: str, tags: dict) -> Any:
                run_id = f"run{len(fake.runs)}"
                fake.runs[run_id] = {"name": run_name, "experiment": experiment_id}
                fake.runs[run_id].update(params={}, metrics={}, status=None)
                return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id))

            def log_param(self, run_id: str, key: str, value: Any) -> None:
                fake.runs[run_id]["params"][key] = value

            def log_metric(self, run_id: str, key: str, value: float, step: int) -> None:
                fake.runs[run_id]["metrics"].setdefault(key, []).append((step, value))

            def set_terminated(self, run_id: str, status: str) -> None:
                fake.runs[run_id]["status"] = status

        return Client


def _install_fake_mlflow(monkeypatch: pytest.MonkeyPatch) -> _FakeMlflow:
    fake = _FakeMlflow()
    submodules = {
        "mlflow.tracking": types.SimpleNamespace(MlflowClient=fake.MlflowClient),
        "mlflow.exceptions": types.SimpleNamespace(MlflowException=KeyError),
        "mlflow.utils": types.SimpleNamespace(),
        "mlflow.utils.mlflow_tags": types.SimpleNamespace(MLFLOW_RUN_NAME="mlflow.runName"),
    }
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    for name, module in submodules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return fake


def _results(n: int) -> list[dict[str, Any]]:
    return [
        {"training_iteration": i, "env_runners": {"episode_return_mean": 10.0 * i}}
        for i in range(1, n + 1)
    ]


def test_mlflow_gets_every_iteration_of_the_run_fake_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _install_fake_mlflow(monkeypatch)  # FAKE mlflow, see _FakeMlflow
    run_dir = tmp_path / "run"
    settings = TrainSettings(mlflow_tracking_uri="file:///somewhere/mlruns")
    log = RunLog(run_dir, {"lr": 0.001}, tensorboard=False, trackers=tracker_callbacks(settings))
    for result in _results(3):
        log.write(result)
    log.close()
    assert fake.tracking_uri == "file:///somewhere/mlruns"
    assert list(fake.experiments) == [MLFLOW_EXPERIMENT]
    (run,) = fake.runs.values()
    assert run["name"] == run_trial_id(run_dir) and run["params"]["lr"] == 0.001
    assert run["metrics"]["env_runners/episode_return_mean"] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    assert run["status"] == "FINISHED"
    # The run directory is written as without a tracker.
    assert len((run_dir / "result.json").read_text().splitlines()) == 3


def test_mlflow_file_store_reads_back_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow", reason="real MLflow: pip install mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses file:// without it
    uri = (tmp_path / "mlruns").as_uri()
    run_dir = tmp_path / "run"
    settings = TrainSettings(mlflow_tracking_uri=uri)
    log = RunLog(run_dir, {"lr": 0.001}, tensorboard=False, trackers=tracker_callbacks(settings))
    for result in _results(3):
        log.write(result)
    log.close()
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == run_trial_id(run_dir)
    history = client.get_metric_history(run.info.run_id, "env_runners/episode_return_mean")
    assert [(m.step, m.value) for m in history] == [(1, 10.0), (2, 20.0), (3, 30.0)]


# --------------------------------------------------------------------------------------------
# Through real RLlib (slow).


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_user_callback_runs_in_training_and_its_metric_reaches_the_run_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", *TINY, "--callbacks", "tests.cli._env_doubles:MarkResults"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 0
    progress = pd.read_csv(run_dir / "progress.csv")
    assert list(progress["marked_by_user_callback"]) == [1.0] * len(progress)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["settings"]["callbacks"] == ["tests.cli._env_doubles:MarkResults"]
