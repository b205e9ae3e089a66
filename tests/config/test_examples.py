"""The tutorial examples build valid configs (no Ray started)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import gymnasium as gym
import pytest

from rllib_ext.modules import MaskedPPOTorchRLModule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _smac_obs_space() -> gym.spaces.Dict:
    box = gym.spaces.Box(-1.0, 1.0, (6,))
    return gym.spaces.Dict(
        {"observations": box, "action_mask": gym.spaces.Box(0.0, 1.0, (5,)), "state": box}
    )


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("compression", ["fp16", "powersgd", "onebit"])
def test_compressed_allreduce_maps_the_tutorial_communication_block(compression: str) -> None:
    example = _load("compressed_allreduce")
    args = argparse.Namespace(
        backend="AUTO", num_gpus_per_learner=0, num_env_runners=0, seed=0, compression=compression
    )
    config = example.build_config(args)
    config.validate()
    comm = config.extension_settings.comm
    assert comm.grad_compression == compression  # communication.compression=True -> fp16
    assert config.communication_type == "auto"
    assert config.grad_clip == 0.5 and config.use_kl_loss and config.kl_coeff == 0.3
    assert config.num_learners == 2


def test_smac_example_relies_on_the_automatic_smac_setup() -> None:
    example = _load("smac_3s5z_vs_3s6z")
    args = argparse.Namespace(
        num_gpus_per_learner=0,
        train_batch_size=400,
        minibatch_size=200,
        lr=5e-4,
        map_name="3m",
        backend="smax",
        seed=0,
        central_critic=True,
        num_env_runners=0,
        num_learners=0,
    )
    config = example.build_config(args)
    config.validate()
    spaces = {"shared_policy": (_smac_obs_space(), gym.spaces.Discrete(5))}
    spec = config.get_multi_rl_module_spec(spaces=spaces).rl_module_specs["shared_policy"]
    assert spec.module_class is MaskedPPOTorchRLModule
    assert spec.model_config["central_critic"] is True
    assert config.num_epochs == 5 and config.kl_coeff == 0.5 and config.lambda_ == 0.95
