"""Issue 40, case 8: a custom learner's own ``learner_config_dict`` keys pass through rllib_ext.

RLlib documents ``.learners(learner_config_dict={...})`` (or the older ``.training(...)`` form)
for a custom learner's own settings; two of its example scripts use it
(``learners/ppo_with_custom_loss_fn.py``: ``regularizer_coeff``,
``learners/separate_vf_lr_and_optimizer.py``: ``lr_vf``). A near-miss of one of rllib_ext's keys
still fails in one line with the key it probably means.
"""

from __future__ import annotations

import pytest
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.examples.learners.classes.custom_ppo_loss_fn_learner import (
    PPOTorchLearnerWithWeightRegularizerLoss,
)
from ray.rllib.examples.learners.classes.separate_vf_lr_and_optimizer_learner import (
    PPOTorchLearnerWithSeparateVfOptimizer,
)

import rllib_ext
from rllib_ext._validation import near_miss
from rllib_ext.settings import ExtensionSettings, extension_keys
from tests.conformance._configs import on_learner, tiny


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("regularizer_coeff", None),  # RLlib's examples' keys are no misspellings of ours
        ("lr_vf", None),
        ("forward_loss_weight", None),
        ("intrinsic_reward_coeff", None),
        ("gamma", None),
        ("grad_compresion", "grad_compression"),  # a letter missing
        ("gea", "gae"),  # two letters swapped
        ("Lean-Update", "lean_update"),  # case and dash
    ],
)
def test_near_miss(key: str, expected: str | None) -> None:
    assert near_miss(key, extension_keys()) == expected


def test_user_keys_pass_through_the_settings_untouched() -> None:
    lcd = {"regularizer_coeff": 0.1, "lr_vf": 5e-4, "gae": "rllib"}
    settings = ExtensionSettings.from_learner_config_dict(lcd)
    assert settings.gae.gae == "rllib"
    assert lcd == {"regularizer_coeff": 0.1, "lr_vf": 5e-4, "gae": "rllib"}


def test_near_miss_of_our_key_fails_in_one_line_with_the_suggestion() -> None:
    config = tiny(rllib_ext.PPOConfig()).learners(learner_config_dict={"grad_compresion": "fp16"})
    with pytest.raises(
        ValueError, match=r"'grad_compresion' \(did you mean 'grad_compression'\?\)"
    ) as err:
        config.validate()
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_rllib_example_custom_loss_learner_trains_with_its_key(ray_session) -> None:
    # learners/ppo_with_custom_loss_fn.py, with rllib_ext's config in place of RLlib's.
    config = tiny(rllib_ext.PPOConfig()).training(
        learner_class=PPOTorchLearnerWithWeightRegularizerLoss,
        learner_config_dict={"regularizer_coeff": 0.02},
    )
    config.rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
    algo = config.build_algo()
    try:
        result = algo.train()  # the loss reads config.learner_config_dict["regularizer_coeff"]
        assert (
            on_learner(algo, lambda lrn: lrn.config.learner_config_dict["regularizer_coeff"])
            == 0.02
        )
        assert result["training_iteration"] == 1
    finally:
        algo.stop()


def test_user_key_reaches_our_learner_next_to_our_settings(ray_session) -> None:
    # learners/separate_vf_lr_and_optimizer.py's key, read by a subclass of rllib_ext's learner.
    class SeparateVfLearner(PPOTorchLearnerWithSeparateVfOptimizer, rllib_ext.PPOExtTorchLearner):
        pass

    config = tiny(rllib_ext.PPOConfig()).learners(
        learner_class=SeparateVfLearner, learner_config_dict={"lr_vf": 5e-4}
    )
    config.training(gae="rllib").rl_module(model_config=DefaultModelConfig(vf_share_layers=False))
    algo = config.build_algo()
    try:
        lrs, gae = on_learner(
            algo,
            lambda lrn: (
                sorted(
                    o.param_groups[0]["lr"]
                    for _, o in lrn.get_optimizers_for_module("default_policy")
                ),
                lrn.ext_settings.gae.gae,
            ),
        )
        assert lrs == pytest.approx(sorted([5e-4, config.lr]))
        assert gae == "rllib"
    finally:
        algo.stop()
