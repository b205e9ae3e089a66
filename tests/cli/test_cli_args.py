"""rllib-ext CLI without training: parsing, YAML precedence, bad input, doctor."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from rllib_ext.cli.checkpoints import SETTINGS_FILE
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.main import _build_parser, main
from rllib_ext.cli.runconfig import TrainSettings, resolve_checkpoint, resolve_settings
from rllib_ext.cli.train import build_algo_config, ray_init_kwargs
from rllib_ext.settings import ExtensionSettings


def _fake_checkpoint(path: Path, settings: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "rllib_checkpoint.json").write_text("{}")
    if settings is not None:
        (path / SETTINGS_FILE).write_text(json.dumps(settings))
    return path


def _train_values(argv: list[str]) -> dict[str, str]:
    args = _build_parser().parse_args(["train", *argv])
    skip = ("command", "handler", "set_values")
    return {o: getattr(args, o) for o in vars(args) if o not in skip}


# --------------------------------------------------------------------------------------------
# Parsing and precedence.


def test_defaults_train_cartpole_to_450_with_compiled_gae() -> None:
    settings = resolve_settings({})
    assert settings.env == "CartPole-v1"
    assert settings.stop_reward == 450.0
    assert settings.stop_timesteps is None and settings.time_budget is None
    assert settings.extensions["gae"] == "compiled"
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
    values.pop("preset")
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
    first = _fake_checkpoint(tmp_path / "checkpoints" / "iter_000001", {})
    last = _fake_checkpoint(tmp_path / "checkpoints" / "iter_000003", {})
    assert resolve_checkpoint(first, flag="--resume") == first
    assert resolve_checkpoint(tmp_path, flag="--resume") == last
    # A stale pointer in summary.json never wins over the directories.
    (tmp_path / "summary.json").write_text(json.dumps({"checkpoint": str(first)}))
    assert resolve_checkpoint(tmp_path, flag="--resume") == last


# --------------------------------------------------------------------------------------------
# Every ExtensionSettings field has a flag, derived from the dataclass: a new field without a
# flag path fails here.


def _setting_fields() -> list[tuple[str, Any, Any]]:
    """(name, type hint, default) of every field of every ExtensionSettings component."""
    out = []
    for part in dataclasses.fields(ExtensionSettings):
        component = part.default_factory  # type: ignore[misc]
        hints = typing.get_type_hints(component)
        for f in dataclasses.fields(component):
            out.append((f.name, hints[f.name], component().__getattribute__(f.name)))
    return out


def _spelling(value: Any, name: str) -> str:
    """How a user types a value on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return ("off" if name == "amp" else "false") if value is False else "true"
    return str(value)


def _same(a: Any, b: Any) -> bool:
    return a is b if isinstance(a, bool) or a is None else type(a) is type(b) and a == b


def _flag_help(help_text: str, flag: str) -> str:
    """The help block of one flag in `train --help` output."""
    match = re.search(rf"\n  {re.escape(flag)} (.*?)(?=\n  --|\n\n|\Z)", help_text, re.S)
    assert match, f"{flag} is not in train --help"
    return " ".join(match.group(1).split())


@pytest.mark.parametrize("name,hint,default", _setting_fields(), ids=lambda v: str(v)[:30])
def test_every_extension_setting_has_a_flag_with_its_default_and_choices(
    name: str, hint: Any, default: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = "--" + name.replace("_", "-")
    assert main(["train", "--help"]) == 0
    block = _flag_help(capsys.readouterr().out, flag)
    assert block.count("(default:") == 1, block
    assert f"(default: {_spelling(default, name)})" in block or (
        isinstance(default, float) and f"(default: {default:g})" in block
    ), block

    assert _same(resolve_settings({}).extensions[name], default)  # the flag's default
    if typing.get_origin(hint) is typing.Literal or hint is bool:
        choices = typing.get_args(hint) if hint is not bool else (True, False)
        assert "{" + ",".join(_spelling(c, name) for c in choices) + "}" in block
        for choice in choices:
            parsed = resolve_settings({name: _spelling(choice, name)}).extensions[name]
            assert _same(parsed, choice), (choice, parsed)
        assert main(["train", flag, "no-such-choice"]) == 2
    else:
        assert _same(resolve_settings({name: str(default)}).extensions[name], default)
        assert main(["train", flag, "-5"]) == 2  # below every range here
    capsys.readouterr()


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
    "gae": (["train", "--gae", "fast"], ["'fast'", "rllib, compiled", "Fix"]),
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
    "episodes_text": (["evaluate", "x", "--episodes", "ten"], ["--episodes 'ten'", ">= 1", "Fix"]),
    "num_envs": (["evaluate", "x", "--num-envs", "0"], ["--num-envs 0", ">= 1", "Fix"]),
    "num_envs_text": (["evaluate", "x", "--num-envs", "all"], ["--num-envs 'all'", "Fix"]),
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


# Issue 12: rllib_ext keys in --training / --set / YAML are checked like their flags, before Ray.

EXTENSION_BAD_INPUTS = {
    "training_fp8": (["--training", '{"amp": "fp8"}'], ["amp=", "'fp8'", "off, fp16, bf16, auto"]),
    "training_amp_zero": (["--training", '{"amp": 0}'], ["amp=", "0", "off, fp16, bf16, auto"]),
    "set_amp_zero": (["--set", "amp=0"], ["--set", "amp=", "0", "off, fp16"]),
    "flag_scale_inf": (["--amp-init-scale", "inf"], ["--amp-init-scale", "'inf'", "finite"]),
    "training_scale_inf": (["--training", '{"amp_init_scale": Infinity}'], ["inf", "finite"]),
    "set_scale_nan": (["--set", "amp_init_scale=nan"], ["'nan'", "finite number > 0"]),
    "legacy_fp16_string": (["--training", '{"fp16": "false"}'], ["fp16='false'", "boolean"]),
    "set_without_equals": (["--set", "amp"], ["--set 'amp'", "KEY=VALUE"]),
    "masked_with_rllib_gae": (
        ["--set", "gae=rllib", "--standardize-advantages", "masked"],
        ["standardize_advantages='masked'", "needs gae='compiled'"],
    ),
}


@pytest.mark.parametrize("case", sorted(EXTENSION_BAD_INPUTS))
def test_bad_extension_value_anywhere_is_one_error_line_before_ray(
    case: str, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, fragments = EXTENSION_BAD_INPUTS[case]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rllib-ext: error: "), err
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


def test_bad_yaml_training_amp_is_one_error_line(
    tmp_path: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("training:\n  amp: fp8\n")
    assert main(["train", "--config", str(yaml_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'fp8'" in err[0] and "training" in err[0], err


def test_extension_keys_in_training_win_over_defaults_and_lose_to_flags(tmp_path: Path) -> None:
    # Used to be overwritten by the flag defaults: fp32 ran while summary.json said fp16.
    settings = resolve_settings({"training": '{"amp": "bf16", "lr": 0.001}'})
    assert settings.extensions["amp"] == "bf16"
    assert settings.training == {"lr": 0.001}  # no rllib_ext key left in the PPO arguments
    assert build_algo_config(settings).learner_config_dict["amp"] == "bf16"

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("training:\n  amp: bf16\n  fp16_loss_scaling: 64\n")
    from_yaml = resolve_settings({}, config_file=str(yaml_file))
    assert from_yaml.extensions["amp"] == "bf16"
    assert from_yaml.extensions["amp_init_scale"] == 64  # the tutorial's name, resolved
    # Precedence: flag > --set > --training > YAML > defaults.
    both = resolve_settings({"training": '{"amp": "fp16"}'}, config_file=str(yaml_file))
    assert both.extensions["amp"] == "fp16"
    with_set = resolve_settings(
        {"training": '{"amp": "fp16"}'}, config_file=str(yaml_file), set_values=["amp=auto"]
    )
    assert with_set.extensions["amp"] == "auto"
    flag = resolve_settings({"amp": "off", "training": '{"amp": "fp16"}'}, set_values=["amp=bf16"])
    assert flag.extensions["amp"] is False
    legacy = resolve_settings({"training": '{"fp16": false}'})
    assert legacy.extensions["amp"] is False


def test_set_accepts_any_training_key_as_json_or_text() -> None:
    settings = resolve_settings(
        {"training": '{"lr": 0.1, "num_epochs": 3}'},
        set_values=[
            "lr=1e-4",
            'model={"fcnet_hiddens": [32]}',
            "grad_compression=none",
            "gae=rllib",
        ],
    )
    assert settings.training == {"lr": 1e-4, "num_epochs": 3, "model": {"fcnet_hiddens": [32]}}
    assert settings.extensions["grad_compression"] is None
    assert settings.extensions["gae"] == "rllib"
    config = build_algo_config(settings)
    assert config.lr == 1e-4 and config.num_epochs == 3


def test_resume_keeps_the_extension_values_that_ran(tmp_path: Path) -> None:
    # An old checkpoint whose `training` still holds the overwritten amp: `extensions` ran.
    saved = TrainSettings(training={"amp": "fp16"}).to_dict()
    saved["extensions"] = {**saved["extensions"], "amp": False}
    _fake_checkpoint(tmp_path / "run" / "checkpoints" / "iter_000001", saved)
    settings = resolve_settings({"resume": str(tmp_path / "run")})
    assert settings.extensions["amp"] is False and settings.training == {}


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
    assert "'fast'" in proc.stderr and "compiled" in proc.stderr


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--stop-reward", "--gae", "--resume", "--address", "--config", "--set"):
        assert flag in out
    for group in ("run:", "environment:", "resources:", "PPO hyper-parameters", "rllib_ext comp"):
        assert f"\n{group}" in out, group
    for flag in ("--checkpoint-dir", "--seed", "--run-dir", "--amp", "--grad-compression"):
        assert _flag_help(out, flag).count("(default:") == 1, flag
    assert "(default: off)" in _flag_help(out, "--amp")  # a value --amp accepts


def test_profile_takes_only_the_flags_it_uses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--num-learners", "--grad-compression", "--set", "--iterations"):
        assert flag in out, flag
    for flag in ("--stop-reward", "--stop-timesteps", "--checkpoint-dir", "--resume", "--run-dir"):
        assert flag not in out, flag
    assert main(["profile", "--stop-reward", "100"]) == 2
    assert "--stop-reward" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["--amp", "bf16"], ["--set", "gae=rllib"], ["--training", '{"fp16": true}']]
)
def test_profile_stock_refuses_rllib_ext_keys_from_any_source(
    argv: list[str], no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "--stock", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stock profiles RLlib's own PPO" in err[0], err


def test_parser_and_version_import_neither_ray_nor_torch() -> None:
    code = (
        "import sys\n"
        "from rllib_ext.cli.main import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "main(['train', '--help'])\n"
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert re.match(r"rllib-ext \d", proc.stdout)  # the version line


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
