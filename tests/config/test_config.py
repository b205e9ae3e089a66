"""rllib_ext.PPOConfig: flags, aliases, validation and survival through copy/dict/state."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

import rllib_ext
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.settings import ExtensionSettings, extension_keys


def test_defaults_reproduce_rllib_except_gae_impl() -> None:
    cfg = rllib_ext.PPOConfig()
    stock = StockPPOConfig()
    assert cfg.extension_settings == ExtensionSettings()
    assert cfg.learner_config_dict["gae"] == "vectorized"
    assert cfg.learner_config_dict["standardize_advantages"] == "all"
    for key in ("lr", "lambda_", "num_epochs", "minibatch_size", "clip_param", "kl_coeff"):
        assert getattr(cfg, key) == getattr(stock, key), key
    assert cfg.learner_class is PPOExtTorchLearner
    assert cfg.algo_class is rllib_ext.PPO


def test_training_sets_flags_and_rllib_args() -> None:
    cfg = rllib_ext.PPOConfig().training(
        gae="rllib", lr=3e-4, lambda_=0.95, standardize_advantages="all"
    )
    assert cfg.learner_config_dict["gae"] == "rllib"
    assert cfg.lr == 3e-4 and cfg.lambda_ == 0.95


def test_tutorial_aliases_map_to_current_names() -> None:
    cfg = rllib_ext.PPOConfig().training(num_sgd_iter=5, sgd_minibatch_size=500)
    assert cfg.num_epochs == 5
    assert cfg.minibatch_size == 500


def test_alias_and_new_name_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="num_sgd_iter.*num_epochs"):
        rllib_ext.PPOConfig().training(num_sgd_iter=5, num_epochs=3)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"gae": "fast"}, r"gae='fast'.*'rllib', 'vectorized'.*Fix"),
        ({"standardize_advantages": "yes"}, r"standardize_advantages='yes'.*'all', 'masked'"),
        ({"gae": "rllib", "standardize_advantages": "masked"}, r"needs gae='vectorized'"),
        ({"lambda_": 1.5}, r"lambda_=1.5.*\[0, 1\]"),
        ({"gamma": -0.1}, r"gamma=-0.1.*\[0, 1\]"),
        ({"gea": "vectorized"}, r"Unknown training\(\) argument 'gea'"),
    ],
)
def test_bad_training_input_raises_value_error(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        rllib_ext.PPOConfig().training(**kwargs)


def test_bad_value_does_not_half_apply() -> None:
    cfg = rllib_ext.PPOConfig()
    with pytest.raises(ValueError):
        cfg.training(gae="fast", lr=1.0)
    assert cfg.learner_config_dict["gae"] == "vectorized"
    assert cfg.lr != 1.0


def test_unknown_learner_config_key_is_rejected_with_suggestion() -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1")
    cfg.learners(learner_config_dict={"gea": "vectorized"})
    with pytest.raises(ValueError, match=r"'gea'.*Did you mean 'gae'"):
        cfg.validate()


def test_user_prefixed_learner_config_keys_are_left_alone() -> None:
    settings = ExtensionSettings.from_learner_config_dict({"user_alpha": 1, "_private": 2})
    assert settings == ExtensionSettings()


def test_copy_to_dict_from_dict_and_state_keep_subclass_and_flags() -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1").training(gae="rllib", num_sgd_iter=7)
    for clone in (
        cfg.copy(),
        rllib_ext.PPOConfig.from_dict(cfg.to_dict()),
        rllib_ext.PPOConfig.from_state(cfg.get_state()),
    ):
        assert isinstance(clone, rllib_ext.PPOConfig)
        assert clone.learner_config_dict["gae"] == "rllib"
        assert clone.num_epochs == 7
        assert clone.learner_class is PPOExtTorchLearner


def test_stock_config_from_our_dict_keeps_learner_class() -> None:
    # What Tune does with a config subclass and the plain "PPO" trainable.
    cfg = rllib_ext.PPOConfig().training(gae="vectorized")
    stock = StockPPOConfig.from_dict(cfg.to_dict())
    assert stock.learner_class is PPOExtTorchLearner
    assert stock.learner_config_dict["gae"] == "vectorized"


def test_extension_keys_are_documented_on_settings() -> None:
    assert {"gae", "standardize_advantages", "amp", "grad_compression"} <= set(extension_keys())


def test_tutorial_communication_block_maps_to_settings() -> None:
    cfg = rllib_ext.PPOConfig().training(
        communication={"type": "GLOO", "compression": True, "grad_clip": 0.5}
    )
    assert cfg.learner_config_dict["comm_backend"] == "gloo"
    assert cfg.learner_config_dict["grad_compression"] == "fp16"
    assert cfg.grad_clip == 0.5


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"grad_compression": "zip"}, r"grad_compression='zip'.*'powersgd', 'onebit'"),
        ({"powersgd_rank": 0}, r"powersgd_rank=0.*>= 1"),
        ({"comm_backend": "mpi"}, r"comm_backend='mpi'.*'auto', 'nccl', 'gloo'"),
        ({"communication": {"type": "NCCL", "fast": 1}}, r"communication keys \['fast'\]"),
    ],
)
def test_bad_compression_input(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        rllib_ext.PPOConfig().training(**kwargs)


def test_nccl_without_gpus_is_an_error_at_validate() -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1").training(comm_backend="nccl")
    cfg.learners(num_learners=2, num_gpus_per_learner=0)
    with pytest.raises(ValueError, match=r"comm_backend='nccl'.*no GPU"):
        cfg.validate()


def test_compression_with_one_learner_warns(caplog) -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1").training(grad_compression="fp16")
    with caplog.at_level("WARNING", logger="rllib_ext.config"):
        cfg.validate()
    assert "has no effect with num_learners=0" in caplog.text
