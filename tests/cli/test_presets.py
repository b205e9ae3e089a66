"""Per-env presets: shipped files, precedence below every user source, the SMAC auto preset
(chosen by backend and map, printed with its reason)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.main import _build_parser, _option_values, main
from rllib_ext.cli.presets import (
    SMAC_PRESET,
    SMAX_PRESET,
    auto_preset,
    choose_preset,
    list_presets,
    load_preset,
    log_preset,
    preset_line,
    preset_names,
)
from rllib_ext.cli.runconfig import TrainSettings, resolve_settings
from rllib_ext.envs.smac import sc2

SMAC_ENVS = ["smac_v2", "smac", "smax"]
MAPPED = "3s5z_vs_3s6z"  # has smax-3s5z_vs_3s6z
UNMAPPED = "25m"  # a SMAX map without its own preset
SMAX_OPTIONS = {"see_enemy_actions": True, "walls_cause_death": True}


@pytest.fixture
def no_sc2(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' finds no StarCraft II (as on this machine): SMAX runs."""
    monkeypatch.setattr(sc2, "availability", lambda package, map_name: (False, "not here"))


@pytest.fixture
def with_sc2(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' finds StarCraft II with every map: the game runs."""
    monkeypatch.setattr(sc2, "availability", lambda package, map_name: (True, "ok"))


def _map(name: str, **more: object) -> str:
    return json.dumps({"map_name": name, **more})


def _env_config(settings: TrainSettings) -> Any:
    """``rllib_ext.PPOConfig`` with the env and env-runner settings ``settings`` resolved."""
    from rllib_ext import PPOConfig

    return (
        PPOConfig()
        .environment(settings.env, env_config=settings.env_config)
        .env_runners(
            num_env_runners=settings.num_env_runners,
            num_envs_per_env_runner=settings.num_envs_per_env_runner,
        )
    )


def test_every_shipped_preset_loads_with_a_description() -> None:
    names = preset_names()
    assert {"cartpole", "smac", "smax", "smax-3m", "smax-2s3z", "smax-3s5z_vs_3s6z"} <= set(names)
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
    same = {"preset": None, "preset_reason": None, "training": {}}
    assert preset.to_dict() | same == defaults.to_dict() | same


def test_presets_command_lists_names_descriptions_and_a_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for preset in list_presets():
        assert f"{preset.name}  " in out and preset.description in out
        assert f"$ {preset.example}\n" in out and preset.example.startswith("rllib-ext train ")
        # The command resolves (flags parsed and checked as `train` does) to this preset's run.
        args = _build_parser().parse_args(shlex.split(preset.example)[1:])
        settings = resolve_settings(
            _option_values(args), set_values=args.set_values, preset=args.preset
        )
        assert settings.preset == preset.name or (
            preset.name == "smac" and settings.env == "smac_v2"
        )
    assert load_preset("cartpole").example == "rllib-ext train --preset cartpole"


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


@pytest.mark.usefixtures("no_sc2")
@pytest.mark.parametrize("env", SMAC_ENVS)
def test_a_mapped_map_on_smax_gets_its_map_preset_under_the_users_env(env: str) -> None:
    settings = resolve_settings({"env": env, "env_config": _map(MAPPED)})
    map_preset = load_preset(f"smax-{MAPPED}").values
    assert settings.preset == f"smax-{MAPPED}"
    assert settings.preset_reason == f"SMAX backend, map {MAPPED}"
    assert settings.env == env  # the user's env name, not the preset's 'smax'
    assert settings.env_config == {"map_name": MAPPED, "smax_options": SMAX_OPTIONS}
    # The map preset's recipe and batched battles, as with --preset smax-3s5z_vs_3s6z.
    assert settings.num_envs_per_env_runner == map_preset["num_envs_per_env_runner"] == 64
    assert settings.num_env_runners == 0
    extension_keys = ("amp", "standardize_advantages")  # rllib_ext's flags, not PPO's
    assert settings.training == {
        k: v for k, v in map_preset["training"].items() if k not in extension_keys
    }
    assert settings.extensions["standardize_advantages"] == "masked"
    assert settings.extensions["amp"] == "auto"
    assert settings.model_config == map_preset["model_config"]
    assert settings.stop_reward is None and settings.stop_timesteps == 3_000_000


@pytest.mark.usefixtures("no_sc2")
def test_the_map_preset_selects_the_batched_smax_runner_for_smac_v2() -> None:
    from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner

    settings = resolve_settings({"env": "smac_v2", "env_config": _map(MAPPED)})
    config = _env_config(settings)
    config.validate()
    assert config.env_runner_cls is SMAXVectorEnvRunner


@pytest.mark.usefixtures("no_sc2")
@pytest.mark.parametrize("env", SMAC_ENVS)
def test_an_unmapped_map_on_smax_gets_the_generic_smax_preset(env: str) -> None:
    settings = resolve_settings({"env": env, "env_config": _map(UNMAPPED)})
    assert settings.preset == SMAX_PRESET == "smax"
    assert settings.preset_reason == f"SMAX backend, no preset for map {UNMAPPED}"
    assert settings.env == env
    assert settings.env_config == {"map_name": UNMAPPED, "smax_options": SMAX_OPTIONS}
    assert settings.stop_reward is None and settings.stop_timesteps is None  # no map budget
    assert settings.num_envs_per_env_runner == 64  # batched battles
    assert settings.model_config["value_norm"] is True
    assert settings.model_config["death_masking"] is True
    assert settings.model_config["central_critic"] is True
    assert settings.training["lr"] == [[0, 0.0005], [3_000_000, 0.00005]]
    assert settings.extensions["amp"] == "auto"


def test_the_generic_smax_preset_is_the_3s5z_vs_3s6z_recipe_without_map_and_budget() -> None:
    generic = dict(load_preset("smax").values)
    recipe = dict(load_preset("smax-3s5z_vs_3s6z").values)
    recipe["env_config"] = {k: v for k, v in recipe["env_config"].items() if k != "map_name"}
    del recipe["stop_timesteps"]
    assert generic == recipe


@pytest.mark.usefixtures("no_sc2")
def test_without_a_map_the_default_map_picks_the_preset() -> None:
    settings = resolve_settings({"env": "smax"})
    assert settings.preset == "smax-3m" and settings.env_config["map_name"] == "3m"


@pytest.mark.usefixtures("with_sc2")
@pytest.mark.parametrize("env", ["smac_v2", "smac"])
def test_starcraft2_found_gets_the_smac_preset(env: str) -> None:
    settings = resolve_settings({"env": env, "env_config": _map(MAPPED)})
    package = "smacv2" if env == "smac_v2" else "smac"
    assert settings.preset == SMAC_PRESET
    assert settings.preset_reason == f"StarCraft II backend {package}"
    assert settings.env_config == {"map_name": MAPPED}  # no SMAX options
    assert settings.num_envs_per_env_runner == 16
    assert settings.training["train_batch_size"] == 8000
    assert settings.model_config["central_critic"] is True
    # backend='smax' asked for explicitly: the map preset again.
    smax = resolve_settings({"env": env, "env_config": _map(MAPPED, backend="smax")})
    assert smax.preset == f"smax-{MAPPED}"
    assert smax.env_config["backend"] == "smax"


@pytest.mark.usefixtures("no_sc2")
@pytest.mark.parametrize("backend", ["smacv2", "smac"])
def test_a_starcraft2_backend_asked_for_gets_the_smac_preset(backend: str) -> None:
    settings = resolve_settings({"env": "smac_v2", "env_config": _map(MAPPED, backend=backend)})
    assert settings.preset == SMAC_PRESET
    assert settings.preset_reason == f"StarCraft II backend {backend}"
    assert settings.env_config == {"map_name": MAPPED, "backend": backend}
    assert auto_preset("smax", {"backend": backend}) == SMAC_PRESET  # smax env told otherwise


@pytest.mark.usefixtures("no_sc2")
def test_user_sources_win_over_the_auto_preset(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(
        f"env_config: {{map_name: {MAPPED}, smax_options: {{max_steps: 50}}}}\n"
        "num_envs_per_env_runner: 8\ntraining: {num_epochs: 3, amp: bf16}\n"
    )
    settings = resolve_settings(
        {
            "env": "smac_v2",  # the env from a flag, the map from --config: both choose
            "stop_timesteps": "60000",
            "training": '{"lr": 0.0001}',
            "model_config": '{"value_norm": false}',
        },
        config_file=str(yaml_file),
        set_values=["minibatch_size=1024"],
    )
    assert settings.preset == f"smax-{MAPPED}" and settings.env == "smac_v2"
    # The user's env_config updates the preset's key by key: the user's map and smax_options.
    assert settings.env_config == {"map_name": MAPPED, "smax_options": {"max_steps": 50}}
    assert settings.stop_timesteps == 60000  # flag over the preset's 3M
    assert settings.num_envs_per_env_runner == 8  # --config over the preset's 64
    assert settings.training["num_epochs"] == 3  # --config training
    assert settings.extensions["amp"] == "bf16"  # --config training, an rllib_ext key
    assert settings.training["lr"] == 0.0001  # --training over the preset's schedule
    assert settings.training["minibatch_size"] == 1024  # --set
    assert settings.training["train_batch_size"] == 8192  # the preset's, not overridden
    assert settings.model_config["value_norm"] is False  # key by key
    assert settings.model_config["death_masking"] is True
    # An explicit --preset still beats the automatic choice, and says so.
    chosen = resolve_settings({"env": "smac_v2", "env_config": _map(MAPPED)}, preset="smax-3m")
    assert chosen.preset == "smax-3m" and chosen.preset_reason == "--preset"
    assert chosen.env_config["map_name"] == MAPPED  # the preset's map does not override


@pytest.mark.usefixtures("no_sc2")
def test_a_rejected_env_config_leaves_the_error_to_the_env_check() -> None:
    choice = choose_preset("smac_v2", {"map_nmae": MAPPED})
    assert choice.name == SMAC_PRESET and "rejected" in choice.reason
    settings = resolve_settings({"env": "smac_v2", "env_config": '{"map_nmae": "3m"}'})
    assert settings.env_config == {"map_nmae": "3m"}


def test_a_presets_env_config_does_not_reach_another_env() -> None:
    settings = resolve_settings({"env": "CartPole-v1"}, preset="smax-3m")
    assert settings.env_config == {}


@pytest.mark.usefixtures("no_sc2")
def test_the_run_prints_the_preset_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    from rllib_ext.cli.main import _configure_logging, logger

    _configure_logging()  # the console handler of 'rllib-ext train', on capsys's stderr
    try:
        log_preset(resolve_settings({"env": "smac_v2", "env_config": _map(MAPPED)}))
        log_preset(resolve_settings({"env": "smac", "env_config": _map(UNMAPPED)}))
        log_preset(resolve_settings({"env": "smax"}, preset="smax-2s3z"))
        log_preset(resolve_settings({}))  # CartPole: no preset, no line
    finally:
        for handler in [h for h in logger.handlers if getattr(h, "_rllib_ext_cli", False)]:
            logger.removeHandler(handler)
    assert capsys.readouterr().err.splitlines() == [
        f"[rllib-ext] preset: smax-{MAPPED} (SMAX backend, map {MAPPED})",
        f"[rllib-ext] preset: smax (SMAX backend, no preset for map {UNMAPPED})",
        "[rllib-ext] preset: smax-2s3z (--preset)",
    ]
    assert preset_line(TrainSettings(preset="smac")) == "preset: smac"  # built by hand


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


def test_the_jaxmarl_mappo_preset_is_jaxmarls_recipe_in_rllib_terms() -> None:
    """``smax-jaxmarl-mappo`` (issue 37's head-to-head recipe): a GRU 128 module with a
    Dense 128 head, a GRU 128 in the critic too, agent id in the critic's state, 128 battles x 128 steps per update, 4
    epochs, lr 2e-3 -> 0, entropy 0, gradient norm 0.25 (actor and critic apart), no value norm, no death masking, fp32;
    the map comes from the user and the config passes RLlib's validation."""
    from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner
    from rllib_ext.modules import MaskedRecurrentPPOTorchRLModule, masked_module_class

    settings = resolve_settings({"env_config": _map(MAPPED)}, preset="smax-jaxmarl-mappo")
    assert settings.env == "smax" and settings.env_config["map_name"] == MAPPED
    assert settings.env_config["state_mode"] == "agent_specific"
    assert settings.env_config["smax_options"]["attack_mode"] == "closest"
    model = settings.model_config
    assert masked_module_class(model) is MaskedRecurrentPPOTorchRLModule
    assert (model["recurrent_cell"], model["lstm_cell_size"]) == ("gru", 128)
    assert model["fcnet_hiddens"] == model["head_fcnet_hiddens"] == [128]
    assert model["central_critic"] and not model["value_norm"] and not model["death_masking"]
    assert model["critic_recurrent"] is True  # JaxMARL's CriticRNN
    assert model["orthogonal_init"] is True
    training = settings.training
    assert settings.num_envs_per_env_runner * 128 == training["train_batch_size"] == 16384
    assert training["lr"] == [[0, 0.002], [3000000, 0.0]]
    assert (training["num_epochs"], training["entropy_coeff"], training["grad_clip"]) == (
        4,
        0,
        0.25,
    )
    assert settings.extensions["amp"] is False  # fp32 where the map presets take bf16
    assert settings.extensions["standardize_advantages"] == "masked"  # no bootstrap rows
    assert settings.extensions["optimizers"] == "actor_critic"  # JaxMARL's two train states
    assert settings.extensions["num_minibatches"] == 4  # JaxMARL's NUM_MINIBATCHES
    config = _env_config(settings).rl_module(model_config=model).training(**training)
    config.validate()
    assert config.env_runner_cls is SMAXVectorEnvRunner
