"""rllib-ext CLI without training: parsing, YAML precedence, bad input, doctor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_ext.cli.main import _build_parser, main
from rllib_ext.cli.runconfig import (
    EXTENSION_OPTIONS,
    SETTINGS_FILE,
    CLIError,
    TrainSettings,
    resolve_checkpoint,
    resolve_settings,
)
from rllib_ext.cli.train import build_algo_config, ray_init_kwargs
from rllib_ext.settings import GAE_IMPLS, extension_keys


def _fake_checkpoint(path: Path, settings: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "rllib_checkpoint.json").write_text("{}")
    if settings is not None:
        (path / SETTINGS_FILE).write_text(json.dumps(settings))
    return path


def _train_values(argv: list[str]) -> dict[str, str]:
    args = _build_parser().parse_args(["train", *argv])
    return {o: getattr(args, o) for o in vars(args) if o not in ("command", "handler")}


# --------------------------------------------------------------------------------------------
# Parsing and precedence.


def test_defaults_train_cartpole_to_450_with_vectorized_gae() -> None:
    settings = resolve_settings({})
    assert settings.env == "CartPole-v1"
    assert settings.stop_reward == 450.0
    assert settings.stop_timesteps is None and settings.time_budget is None
    assert settings.extensions["gae"] == "vectorized"
    assert settings.resume is None and settings.address is None


def test_flags_are_parsed_and_converted() -> None:
    values = _train_values(
        [
            "--env-config", '{"max_episode_steps": 100}',
            "--num-env-runners", "2",
            "--num-gpus-per-learner", "0.5",
            "--stop-reward", "none",
            "--time-budget", "30",
            "--gae", "rllib",
            "--seed", "7",
        ]
    )  # fmt: skip
    # Only flags that were given reach the settings (so YAML keys are not overwritten).
    assert "num_learners" not in values and "config" in values
    values.pop("config")
    values.pop("progress")
    settings = resolve_settings(values)
    assert settings.env_config == {"max_episode_steps": 100}
    assert settings.num_env_runners == 2
    assert settings.num_gpus_per_learner == 0.5
    assert settings.stop_reward is None
    assert settings.time_budget == 30.0
    assert settings.extensions["gae"] == "rllib"
    assert settings.seed == 7


def test_command_line_flag_beats_yaml_and_yaml_beats_default(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(
        "num_env_runners: 1\nseed: 3\nstop-timesteps: 8000\ngae: rllib\n"
        "env_config:\n  max_episode_steps: 50\n"
    )
    settings = resolve_settings({"num_env_runners": "2"}, config_file=str(yaml_file))
    assert settings.num_env_runners == 2  # flag
    assert settings.seed == 3  # YAML
    assert settings.stop_timesteps == 8000  # YAML, dashed key
    assert settings.extensions["gae"] == "rllib"
    assert settings.env_config == {"max_episode_steps": 50}
    assert settings.stop_reward == 450.0  # default


def test_resume_starts_from_the_checkpoints_settings(tmp_path: Path) -> None:
    saved = TrainSettings(env="CartPole-v1", seed=11, num_env_runners=1, run_dir="old").to_dict()
    saved["extensions"] = {"gae": "rllib"}
    checkpoint = _fake_checkpoint(tmp_path / "run" / "checkpoints" / "iter_000002", saved)
    settings = resolve_settings({"resume": str(tmp_path / "run"), "num_env_runners": "0"})
    assert settings.resume == str(checkpoint)
    assert settings.seed == 11  # inherited
    assert settings.extensions["gae"] == "rllib"  # inherited
    assert settings.num_env_runners == 0  # flag wins
    assert settings.run_dir is None  # never inherited


def test_resolve_checkpoint_accepts_run_dirs(tmp_path: Path) -> None:
    first = _fake_checkpoint(tmp_path / "checkpoints" / "iter_000001")
    last = _fake_checkpoint(tmp_path / "checkpoints" / "iter_000003")
    assert resolve_checkpoint(first, flag="--resume") == first
    assert resolve_checkpoint(tmp_path, flag="--resume") == last
    (tmp_path / "summary.json").write_text(json.dumps({"checkpoint": str(first)}))
    assert resolve_checkpoint(tmp_path, flag="--resume") == first


def test_extension_flag_table_matches_the_library() -> None:
    keys = set(extension_keys())
    for option in EXTENSION_OPTIONS:
        assert option.key in keys, option.key
    gae = next(o for o in EXTENSION_OPTIONS if o.key == "gae")
    for value in GAE_IMPLS:
        assert gae.convert(value) == value


def test_ray_is_sized_to_the_config() -> None:
    assert ray_init_kwargs(TrainSettings())["num_cpus"] == 1
    kwargs = ray_init_kwargs(TrainSettings(num_env_runners=2, num_learners=2))
    assert kwargs["num_cpus"] == 4
    joined = ray_init_kwargs(TrainSettings(address="auto"))
    assert joined["address"] == "auto" and "num_cpus" not in joined


def test_stock_config_gets_the_same_settings_without_extension_flags() -> None:
    from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

    settings = TrainSettings(seed=5, num_env_runners=1, extensions={"gae": "rllib"})
    ours = build_algo_config(settings)
    stock = build_algo_config(settings, config_cls=StockPPOConfig)
    assert type(stock) is StockPPOConfig
    assert ours.learner_config_dict["gae"] == "rllib"
    assert "gae" not in stock.learner_config_dict
    for key in ("lr", "train_batch_size", "minibatch_size", "num_epochs", "lambda_", "seed"):
        assert getattr(ours, key) == getattr(stock, key), key
    assert ours.num_env_runners == stock.num_env_runners == 1


# --------------------------------------------------------------------------------------------
# Bad input: one line on stderr, non-zero exit, no Ray.

BAD_INPUTS = {
    "gae": (["train", "--gae", "fast"], ["'fast'", "rllib, vectorized", "Fix"]),
    "num_learners": (["train", "--num-learners", "-1"], ["--num-learners", "'-1'", ">= 0"]),
    "env_config_json": (["train", "--env-config", "{bad"], ["--env-config", "not valid JSON"]),
    "env_config_list": (["train", "--env-config", "[1, 2]"], ["JSON object"]),
    "env_config_key": (["train", "--env-config", '{"foo": 1}'], ["foo", "--env-config"]),
    "unknown_env": (["train", "--env", "Cartpole-v1"], ["'Cartpole-v1'", "CartPole-v1"]),
    "resume_missing": (["train", "--resume", "/no/such/ckpt"], ["/no/such/ckpt", "Fix"]),
    "evaluate_missing": (["evaluate", "/no/such/ckpt"], ["/no/such/ckpt", "Fix"]),
    "unknown_flag": (["train", "--num-workers", "2"], ["--num-workers"]),
    "training_key": (["train", "--training", '{"sgd_minibatch": 5}'], ["sgd_minibatch"]),
    "gpus_without_cuda": (["train", "--num-gpus-per-learner", "1"], ["CUDA"]),
    "episodes": (["evaluate", "x", "--episodes", "0"], ["--episodes 0"]),
    "no_command": ([], ["choose a command"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_error_line(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    if case == "gpus_without_cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    argv, fragments = BAD_INPUTS[case]
    assert main(argv) == 2
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rllib")]
    assert len(err_lines) == 1, err_lines
    assert err_lines[0].startswith("rllib-ext: error: ")
    for fragment in fragments:
        assert fragment in err_lines[0], (fragment, err_lines[0])


def test_unknown_yaml_key_names_the_key_and_the_close_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("num_env_runner: 1\n")
    assert main(["train", "--config", str(yaml_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "'num_env_runner'" in err[0] and "'num_env_runners'" in err[0]


def test_bad_yaml_value_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("num_learners: -3\n")
    assert main(["train", "--config", str(yaml_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_learners" in err and "-3" in err and "\n" not in err


def test_conflicting_extension_flags_fail_before_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--gae", "rllib", "--standardize-advantages", "masked"]) == 2
    err = capsys.readouterr().err.strip()
    assert "standardize_advantages" in err and "\n" not in err


def test_installed_console_script_prints_no_traceback() -> None:
    script = shutil.which("rllib-ext", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("console script not installed: pip install -e . --no-deps")
    proc = subprocess.run(
        [script, "train", "--gae", "fast"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if line.startswith("rllib-ext: error:")
    ]
    assert "'fast'" in proc.stderr and "vectorized" in proc.stderr


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--stop-reward", "--gae", "--resume", "--address", "--config"):
        assert flag in out


# --------------------------------------------------------------------------------------------
# doctor


def test_doctor_prints_every_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SC2PATH", str(tmp_path))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for line in ("[versions]", "[accelerators]", "[optional backends]"):
        assert line in out
    for name in ("python", "ray", "torch", "gymnasium", "pettingzoo", "numpy"):
        assert f"\n  {name} " in out, name
    for name in ("cuda available", "cuda device count", "nccl version", "cuda bf16", "cpu bf16"):
        assert name in out, name
    for name in ("jaxmarl", "jax", "smacv2", "smac", "pysc2"):
        assert f"\n  {name} " in out, name
    assert "SC2PATH" in out and "(exists)" in out


def test_doctor_reports_a_missing_sc2path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SC2PATH", "/no/such/StarCraftII")
    assert main(["doctor"]) == 0
    assert "MISSING" in capsys.readouterr().out


def test_cli_error_is_an_exception_type() -> None:
    assert issubclass(CLIError, Exception)
