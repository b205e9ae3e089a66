"""env_config validation, registration and the cheap-import promise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rllib_ext.envs import SMAC_ENV_DEFAULTS, is_smac_env, register_envs
from rllib_ext.envs.smac import SMACEnv, SMACEnvSettings


def test_defaults():
    settings = SMACEnvSettings.from_env_config(None)
    assert settings.backend == "auto" and settings.reward_mode == "copy"
    assert settings.include_state is True
    assert settings.state_mode == "global"


def test_unknown_key_names_the_closest_and_the_allowed():
    with pytest.raises(ValueError, match=r"'map_nme' \(did you mean 'map_name'\?\)") as err:
        SMACEnvSettings.from_env_config({"map_nme": "3m"})
    assert "sc2_options" in str(err.value)  # where StarCraft2Env arguments go


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"backend": "sc2"}, r"backend='sc2' is not supported; allowed values: 'auto', 'smacv2'"),
        ({"reward_mode": "sum"}, r"reward_mode='sum'.*'copy', 'split'"),
        ({"prefer_sc2": "smax"}, r"prefer_sc2='smax'"),
        ({"map_name": ""}, r"map_name=''"),
        ({"seed": 1.5}, r"seed=1.5"),
        ({"include_state": 1}, r"include_state=1"),
        ({"obs_agent_id": "yes"}, r"obs_agent_id='yes'; allowed: True, False"),
        ({"max_restarts": -1}, r"max_restarts=-1"),
        ({"state_mode": "local"}, r"state_mode='local'.*'global', 'agent_specific'"),
        (
            {"state_mode": "agent_specific", "include_state": False},
            r"state_mode='agent_specific' needs include_state=True",
        ),
        ({"sc2_options": {"continuing_episode": False}}, r"continuing_episode=True"),
        ({"sc2_options": {"map_name": "8m"}}, r"sc2_options may not set \['map_name'\]"),
        ({"smax_options": {"scenario": None}}, r"smax_options may not set \['scenario'\]"),
        ({"backend": "smac", "capability_config": {}}, r"capability_config is a SMACv2"),
        ({"game_factory": "no.such.module:Env"}, r"game_factory='no.such.module:Env'"),
    ],
)
def test_bad_values_raise_value_errors(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        SMACEnvSettings.from_env_config(config)


def test_unknown_backend_via_env():
    with pytest.raises(ValueError, match="allowed values: 'auto', 'smacv2', 'smac', 'smax'"):
        SMACEnv({"backend": "starcraft"})


def test_game_factory_path_resolves():
    settings = SMACEnvSettings(game_factory="tests.envs.fake_sc2:FakeStarCraft2Env")
    assert settings.game_factory.endswith("FakeStarCraft2Env")


def test_register_envs_and_names():
    register_envs()
    register_envs()  # idempotent
    from ray.tune.registry import ENV_CREATOR, _global_registry

    for name in SMAC_ENV_DEFAULTS:
        assert _global_registry.contains(ENV_CREATOR, name)
    assert is_smac_env("smac_v2") and is_smac_env("smax") and is_smac_env("smac")
    assert is_smac_env(SMACEnv) and is_smac_env("rllib_ext.envs.smac.SMACEnv")
    assert not is_smac_env("CartPole-v1") and not is_smac_env(object)


def test_registered_creator_applies_its_default_backend():
    from ray.rllib.env.env_context import EnvContext
    from ray.tune.registry import ENV_CREATOR, _global_registry

    register_envs()
    creator = _global_registry.get(ENV_CREATOR, "smac_v2")
    context = EnvContext(
        {"map_name": "3m", "game_factory": "tests.envs.fake_sc2:FakeStarCraft2Env"},
        worker_index=2,
        vector_index=1,
    )
    env = creator(context)
    # game_factory given and backend "auto": the preferred StarCraft II package of "smac_v2".
    assert env.env_info["backend"] == "smacv2"
    env = _global_registry.get(ENV_CREATOR, "smac")(dict(context))
    assert env.env_info["backend"] == "smac"


def test_import_and_register_load_no_backend():
    # ray.rllib itself may import jax when it is installed; we must add no backend module.
    code = (
        "import sys, ray.rllib; before = set(sys.modules);"
        "import rllib_ext.envs, rllib_ext.envs.smac, rllib_ext.modules;"
        "rllib_ext.envs.register_envs();"
        "new = set(sys.modules) - before;"
        "bad = sorted(m for m in new if m.split('.')[0] in "
        "('jax', 'jaxlib', 'jaxmarl', 'smac', 'smacv2', 'pysc2'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
