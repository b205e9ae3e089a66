"""``rllib_ext.PPOConfig`` sets up shared masked policy + SMAC metrics for SMAC envs.

The setup happens when the flags are set (``.environment()``, ``.callbacks()``...);
``validate()`` only checks.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import gymnasium as gym
import pytest
from ray.rllib.callbacks.callbacks import RLlibCallback

import rllib_ext
from rllib_ext.envs.smac import SMACEnv, SMACMetricsCallback
from rllib_ext.modules import MaskedPPOTorchRLModule, smac_module_spec
from rllib_ext.smac_config import SHARED_POLICY_ID, shared_policy_mapping

_OBS = gym.spaces.Dict(
    {
        "observations": gym.spaces.Box(-1.0, 1.0, (6,)),
        "action_mask": gym.spaces.Box(0.0, 1.0, (5,)),
        "state": gym.spaces.Box(-1.0, 1.0, (9,)),
    }
)


def module_specs(config: Any) -> dict[str, Any]:
    """The per-policy RLModule specs RLlib will build from ``config``."""
    spaces = {pid: (_OBS, gym.spaces.Discrete(5)) for pid in config.policies}
    return config.get_multi_rl_module_spec(spaces=spaces).rl_module_specs


def test_import_is_light_and_using_the_config_registers_the_smac_env_names() -> None:
    code = (
        "import sys, rllib_ext\n"
        "print(sorted(m for m in ('ray', 'torch', 'jax') if m in sys.modules))\n"
        "rllib_ext.PPOConfig\n"
        "from ray.tune.registry import ENV_CREATOR, _global_registry\n"
        "print([_global_registry.contains(ENV_CREATOR, n) for n in ('smac_v2', 'smac', 'smax')])\n"
        "print('jaxmarl' in sys.modules or 'rllib_ext.envs.smac.smax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # No Ray/torch at import; the names registered on first use; still no backend imported.
    assert out.stdout.split("\n")[:3] == ["[]", "[True, True, True]", "False"]


@pytest.mark.parametrize("env", ["smac_v2", "smac", "smax", SMACEnv])
def test_smac_env_gets_shared_masked_policy_and_metrics_callback(env: object) -> None:
    config = rllib_ext.PPOConfig().environment(env, env_config={"map_name": "3m"})
    assert set(config.policies) == {SHARED_POLICY_ID}
    assert config.policy_mapping_fn("agent_3", None) == SHARED_POLICY_ID
    specs = module_specs(config)
    assert specs[SHARED_POLICY_ID].module_class is MaskedPPOTorchRLModule
    assert specs[SHARED_POLICY_ID].model_config.get("central_critic", False) is False
    assert config.callbacks_class is SMACMetricsCallback
    config.environment(env_config={"map_name": "8m"})  # idempotent: nothing added twice
    config.validate()
    assert config.callbacks_class is SMACMetricsCallback


def test_central_critic_comes_from_model_config() -> None:
    config = (
        rllib_ext.PPOConfig()
        .environment("smac_v2", env_config={"map_name": "3m"})
        .rl_module(model_config={"central_critic": True, "fcnet_hiddens": [64]})
    )
    spec = module_specs(config)[SHARED_POLICY_ID]
    assert spec.model_config["central_critic"] is True
    assert spec.model_config["fcnet_hiddens"] == [64]


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
    assert set(module_specs(config)) == {"team_a", "team_b"}
    assert module_specs(config)["team_a"].model_config["central_critic"] is True  # the user's
    assert config.callbacks_class == [_MyCallback, SMACMetricsCallback]


def test_other_envs_are_untouched() -> None:
    config = rllib_ext.PPOConfig().environment("CartPole-v1")
    config.validate()
    assert not config.is_multi_agent
    assert config.get_default_rl_module_spec().module_class is not MaskedPPOTorchRLModule
    assert config.callbacks_class is RLlibCallback
