"""``rllib_ext.PPOConfig`` sets up shared masked policy + SMAC metrics for SMAC envs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ray.rllib.callbacks.callbacks import RLlibCallback

import rllib_ext
from rllib_ext.config import SHARED_POLICY_ID, shared_policy_mapping
from rllib_ext.envs.smac import SMACEnv, SMACMetricsCallback
from rllib_ext.modules import MaskedPPOTorchRLModule, smac_module_spec


def test_import_registers_the_smac_env_names() -> None:
    code = (
        "import rllib_ext\n"
        "from ray.tune.registry import ENV_CREATOR, _global_registry\n"
        "print([_global_registry.contains(ENV_CREATOR, n) for n in ('smac_v2', 'smac', 'smax')])\n"
        "import sys; print('jaxmarl' in sys.modules or 'rllib_ext.envs.smac.smax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[True,", "True,", "True]", "False"]  # no backend imported


@pytest.mark.parametrize("env", ["smac_v2", "smac", "smax", SMACEnv])
def test_smac_env_gets_shared_masked_policy_and_metrics_callback(env: object) -> None:
    config = rllib_ext.PPOConfig().environment(env, env_config={"map_name": "3m"})
    config.validate()
    assert set(config.policies) == {SHARED_POLICY_ID}
    assert config.policy_mapping_fn("agent_3", None) == SHARED_POLICY_ID
    specs = config._rl_module_spec.rl_module_specs
    assert specs[SHARED_POLICY_ID].module_class is MaskedPPOTorchRLModule
    assert specs[SHARED_POLICY_ID].model_config["central_critic"] is False
    assert config.callbacks_class is SMACMetricsCallback
    config.validate()  # idempotent: nothing added twice
    assert config.callbacks_class is SMACMetricsCallback


def test_central_critic_comes_from_model_config() -> None:
    config = (
        rllib_ext.PPOConfig()
        .environment("smac_v2", env_config={"map_name": "3m"})
        .rl_module(model_config={"central_critic": True, "fcnet_hiddens": [64]})
    )
    config.validate()
    spec = config._rl_module_spec.rl_module_specs[SHARED_POLICY_ID]
    assert spec.model_config["central_critic"] is True


class _MyCallback(RLlibCallback):
    pass


def test_explicit_user_choices_are_kept() -> None:
    spec = smac_module_spec(policy_ids=("team_a", "team_b"), central_critic=True)
    config = (
        rllib_ext.PPOConfig()
        .environment("smax", env_config={"map_name": "3m"})
        .multi_agent(
            policies={"team_a", "team_b"},
            policy_mapping_fn=lambda agent_id, *a, **kw: "team_a",
        )
        .rl_module(rl_module_spec=spec)
        .callbacks(_MyCallback)
    )
    config.validate()
    assert set(config.policies) == {"team_a", "team_b"}
    assert config.policy_mapping_fn is not shared_policy_mapping
    assert config._rl_module_spec is spec
    assert config.callbacks_class == [_MyCallback, SMACMetricsCallback]


def test_other_envs_are_untouched() -> None:
    config = rllib_ext.PPOConfig().environment("CartPole-v1")
    config.validate()
    assert not config.is_multi_agent
    assert config._rl_module_spec is None
    assert config.callbacks_class is RLlibCallback
