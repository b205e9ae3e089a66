"""Issue 40, case 10: rllib_ext never takes over an env name the user registered.

``smac``, ``smac_v2`` and ``smax`` are registered only where free; SMAC handling (shared policy,
metrics callback, masked module, batched SMAX runner) keys on rllib_ext's env, not on the name.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import gymnasium as gym
import pytest
from ray.tune.registry import register_env

import rllib_ext
from rllib_ext import _rllib_private as private
from rllib_ext.envs import is_smac_env, make_smac_env, register_envs
from rllib_ext.envs.smac import SMACEnv, SMACMetricsCallback
from rllib_ext.fused_sampling import FusedSingleAgentEnvRunner
from rllib_ext.modules import MaskedPPOTorchRLModule
from tests.conformance._configs import tiny


def users_env(env_config: dict) -> gym.Env:
    """A user's own env registered as "smax": CartPole."""
    return gym.make("CartPole-v1")


def _classes(callbacks: Any) -> list[type]:
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


@pytest.fixture
def user_smax():
    register_env("smax", users_env)
    yield
    register_env("smax", functools.partial(make_smac_env, "smax"))  # ours again for other tests


def test_register_envs_keeps_the_users_env(user_smax) -> None:
    register_envs()
    assert private.registered_env_creator("smax") is users_env
    assert not is_smac_env("smax")
    assert is_smac_env("smac") and is_smac_env(SMACEnv)


def test_users_smax_stays_a_plain_user_env(user_smax, ray_session) -> None:
    config = tiny(rllib_ext.PPOConfig(), env="smax")
    assert not config.is_multi_agent
    assert not any(issubclass(c, SMACMetricsCallback) for c in _classes(config.callbacks_class))
    assert config.get_default_rl_module_spec().module_class is not MaskedPPOTorchRLModule
    assert config.env_runner_cls is FusedSingleAgentEnvRunner  # single-agent, like CartPole
    algo = config.build_algo()
    try:
        algo.train()
        assert algo.env_runner.env.single_observation_space.shape == (4,)  # the user's CartPole
        assert not any(
            isinstance(c, SMACMetricsCallback) for c in private.runner_callbacks(algo.env_runner)
        )
    finally:
        algo.stop()


def test_import_after_the_users_registration_keeps_it() -> None:
    code = (
        "from ray.tune.registry import register_env\n"
        "from tests.conformance.test_env_names import users_env\n"
        "register_env('smax', users_env)\n"
        "import rllib_ext\n"
        "rllib_ext.PPOConfig  # registers the free names\n"
        "from rllib_ext import _rllib_private as private\n"
        "assert private.registered_env_creator('smax') is users_env\n"
        "assert private.registered_env_creator('smac') is not None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
