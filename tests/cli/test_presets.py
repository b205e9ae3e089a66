"""Per-env presets: shipped files, precedence below every user source, SMAC auto preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllib_ext.cli.main import main
from rllib_ext.cli.presets import (
    SMAC_PRESET,
    auto_preset,
    list_presets,
    load_preset,
    preset_names,
)
from rllib_ext.cli.runconfig import CLIError, resolve_settings

SMAC_MAP = '{"map_name": "3m"}'


def test_every_shipped_preset_loads_with_a_description() -> None:
    names = preset_names()
    assert {"cartpole", "smac", "smax-3m", "smax-2s3z", "smax-3s5z_vs_3s6z"} <= set(names)
    for preset in list_presets():
        assert preset.description, preset.name
        assert "\n" not in preset.description
    for name in ("smax-3m", "smax-2s3z", "smax-3s5z_vs_3s6z"):
        values = load_preset(name).values
        assert values["env"] == "smax"
        assert values["env_config"]["map_name"] == name.removeprefix("smax-")
        assert values["stop_reward"] is None


def test_cartpole_preset_is_the_cli_defaults() -> None:
    from rllib_ext.cli.runconfig import DEFAULT_TRAINING

    preset, defaults = resolve_settings({}, preset="cartpole"), resolve_settings({})
    assert preset.training == DEFAULT_TRAINING and defaults.training == {}
    same = {"preset": None, "training": {}}
    assert preset.to_dict() | same == defaults.to_dict() | same


def test_presets_command_lists_names_and_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for preset in list_presets():
        assert f"{preset.name}  " in out and preset.description in out


def test_user_sources_win_over_the_preset(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("num_envs_per_env_runner: 4\ntraining: {num_epochs: 3}\n")
    settings = resolve_settings(
        {"stop_timesteps": "5000", "model_config": '{"fcnet_hiddens": [64]}'},
        preset="smax-3m",
        config_file=str(yaml_file),
        set_values=["minibatch_size=500"],
    )
    assert settings.preset == "smax-3m"
    assert settings.stop_timesteps == 5000  # flag over the preset's 1M
    assert settings.num_envs_per_env_runner == 4  # --config over the preset
    assert settings.training["num_epochs"] == 3
    assert settings.training["minibatch_size"] == 500  # --set
    assert settings.training["train_batch_size"] == 8000  # the preset's, not overridden
    # model_config merges key by key: the user's hiddens, the preset's central critic.
    assert settings.model_config["fcnet_hiddens"] == [64]
    assert settings.model_config["central_critic"] is True


def test_env_config_updates_the_presets_while_the_env_is_the_presets() -> None:
    settings = resolve_settings({"env_config": '{"map_name": "2s3z"}'}, preset="smax-3m")
    assert settings.env_config["map_name"] == "2s3z"
    assert settings.env_config["smax_options"]["walls_cause_death"] is True
    # Another env: the preset's env_config is not carried over to it.
    other = resolve_settings({"env": "CartPole-v1", "env_config": "{}"}, preset="smax-3m")
    assert other.env_config == {}


@pytest.mark.parametrize("env", ["smac_v2", "smac", "smax"])
def test_smac_envs_get_smac_sized_settings_without_a_preset(env: str) -> None:
    settings = resolve_settings({"env": env, "env_config": SMAC_MAP})
    assert settings.preset == SMAC_PRESET
    assert settings.stop_reward is None  # no CartPole stop rule on SMAX returns
    assert settings.training["train_batch_size"] == 8000
    assert settings.training["minibatch_size"] == 2000
    assert settings.training["entropy_coeff"] == 0.0
    assert settings.model_config["central_critic"] is True
    assert settings.env_config == {"map_name": "3m"}
    # ... and the user still wins.
    mine = resolve_settings(
        {"env": env, "stop_reward": "5", "training": '{"train_batch_size": 1000}'}
    )
    assert mine.stop_reward == 5.0 and mine.training["train_batch_size"] == 1000


def test_cartpole_keeps_its_defaults_and_no_preset() -> None:
    settings = resolve_settings({})
    assert settings.preset is None and auto_preset(settings.env) is None
    assert settings.stop_reward == 450.0 and settings.model_config == {}


def test_an_unknown_preset_names_the_choices() -> None:
    with pytest.raises(CLIError) as info:
        resolve_settings({}, preset="smax-3n")
    message = str(info.value)
    assert "'smax-3n'" in message and "Did you mean 'smax-3m'?" in message
    assert "cartpole" in message and "rllib-ext presets" in message


def test_stop_win_rate_is_a_fraction() -> None:
    assert resolve_settings({"stop_win_rate": "0.9"}).stop_win_rate == 0.9
    with pytest.raises(CLIError, match=r"--stop-win-rate '1.5' must be a fraction"):
        resolve_settings({"stop_win_rate": "1.5"})
