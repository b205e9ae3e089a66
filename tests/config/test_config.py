"""rllib_ext.PPOConfig: flags, aliases, validation and survival through copy/dict/state."""

from __future__ import annotations

import copy
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

import rllib_ext
from rllib_ext import compat
from rllib_ext import settings as settings_mod
from rllib_ext.config_checks import check_algorithm_config, check_comm_resources
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.settings import (
    CompressionSettings,
    ExtensionSettings,
    extension_keys,
    setting_specs,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_reproduce_rllib_except_gae_impl() -> None:
    cfg = rllib_ext.PPOConfig()
    stock = StockPPOConfig()
    assert cfg.extension_settings == ExtensionSettings()
    assert cfg.learner_config_dict["gae"] == "compiled"
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
    cfg = compat.PPOConfig().training(num_sgd_iter=5, sgd_minibatch_size=500)
    assert cfg.num_epochs == 5
    assert cfg.minibatch_size == 500


def test_alias_and_new_name_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="num_sgd_iter.*num_epochs"):
        compat.PPOConfig().training(num_sgd_iter=5, num_epochs=3)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"gae": "fast"}, r"gae='fast'.*'rllib', 'compiled'.*Fix"),
        ({"standardize_advantages": "yes"}, r"standardize_advantages='yes'.*'all', 'masked'"),
        ({"gae": "rllib", "standardize_advantages": "masked"}, r"needs gae='compiled'"),
        ({"lambda_": 1.5}, r"lambda_=1.5.*\[0, 1\]"),
        ({"gamma": -0.1}, r"gamma=-0.1.*\[0, 1\]"),
        ({"gea": "vectorized"}, r"Unknown training\(\) argument 'gea'"),
        # `0 == False` in Python: it used to pass and fail at build with KeyError: 0.
        ({"amp": 0}, r"amp=0 is not supported; allowed values: False, 'fp16', 'bf16', 'auto'"),
        ({"amp": "fp8"}, r"amp='fp8' is not supported"),
        ({"amp_init_scale": math.inf}, r"amp_init_scale=inf is out of range.*finite number > 0"),
        ({"amp_init_scale": math.nan}, r"amp_init_scale=nan is out of range"),
        ({"powersgd_rank": 2.0}, r"powersgd_rank=2.0 is out of range; allowed: an integer >= 1"),
        ({"compression_error_feedback": 1}, r"compression_error_feedback=1 must be a boolean"),
    ],
)
def test_bad_training_input_raises_value_error(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        rllib_ext.PPOConfig().training(**kwargs)


def test_bad_tutorial_alias_value_raises_value_error() -> None:
    with pytest.raises(
        ValueError, match=r"fp16='false' must be a boolean.*a string is not a boolean"
    ):
        compat.PPOConfig().training(fp16="false")


def test_bad_value_does_not_half_apply() -> None:
    cfg = rllib_ext.PPOConfig()
    with pytest.raises(ValueError):
        cfg.training(gae="fast", lr=1.0)
    assert cfg.learner_config_dict["gae"] == "compiled"
    assert cfg.lr != 1.0


def test_unknown_learner_config_key_is_rejected_with_suggestion() -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1")
    cfg.learners(learner_config_dict={"gea": "vectorized"})
    with pytest.raises(ValueError, match=r"'gea' \(did you mean 'gae'\?\)"):
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
    cfg = rllib_ext.PPOConfig().training(gae="compiled")
    stock = StockPPOConfig.from_dict(cfg.to_dict())
    assert stock.learner_class is PPOExtTorchLearner
    assert stock.learner_config_dict["gae"] == "compiled"


def _readme_flag_table() -> dict[str, str]:
    """``{key: default cell}`` from the README's flag table (rows may list several keys)."""
    text = README.read_text()
    table = text[text.index("### Flags") :].split("\n\n")[1]
    defaults: dict[str, str] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        keys = re.findall(r"`(\w+)`", cells[0])
        values = [v.strip().strip("`") for v in cells[2].split(", ")]
        assert len(keys) == len(values), row
        defaults.update(zip(keys, values, strict=True))
    return defaults


def test_readme_flag_table_lists_every_key_with_its_default() -> None:
    documented = _readme_flag_table()
    for spec in setting_specs():
        assert spec.name in documented, f"README flag table lacks {spec.name!r}"
        cell = documented[spec.name]
        if isinstance(spec.default, str):
            assert cell == f'"{spec.default}"', (spec.name, cell)
        elif spec.default is None or isinstance(spec.default, bool):
            assert cell == repr(spec.default), (spec.name, cell)
        else:
            assert float(cell) == spec.default, (spec.name, cell)
    assert set(documented) == set(extension_keys())


def test_every_setting_has_a_docstring() -> None:
    for spec in setting_specs():
        assert len(spec.doc) > 20, spec.name


def test_tutorial_communication_block_maps_to_settings() -> None:
    cfg = compat.PPOConfig().training(
        communication={"type": "GLOO", "compression": True, "grad_clip": 0.5}
    )
    assert cfg.communication_type == "gloo"  # checked at validate(), chooses nothing
    assert "comm_backend" not in cfg.learner_config_dict
    assert cfg.learner_config_dict["grad_compression"] == "fp16"
    assert cfg.grad_clip == 0.5
    for clone in (cfg.copy(), compat.PPOConfig.from_dict(cfg.to_dict())):
        assert clone.communication_type == "gloo"


def test_comm_backend_is_no_flag_and_old_stored_settings_still_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rllib_ext.cli.options import EXTENSION_OPTIONS

    assert "comm_backend" not in extension_keys()
    assert not [o for o in EXTENSION_OPTIONS if "backend" in o.flag]
    # A config saved by an earlier version carries comm_backend in learner_config_dict.
    expected = ExtensionSettings.from_flat({"gae": "rllib"})
    old = {**expected.to_flat(), "comm_backend": "auto"}
    settings_mod._warned_removed.discard("comm_backend")
    with caplog.at_level(logging.WARNING, logger="rllib_ext"):
        first = ExtensionSettings.from_learner_config_dict(old)
        second = ExtensionSettings.from_learner_config_dict(old)
    assert first == second == expected
    (record,) = [r for r in caplog.records if "comm_backend" in r.getMessage()]
    assert "nccl on GPU learners, gloo on CPU" in record.getMessage()
    stored = rllib_ext.PPOConfig().environment("CartPole-v1")
    stored.learner_config_dict["comm_backend"] = "nccl"
    stored.validate()  # dropped, not checked: RLlib picks the backend
    assert check_algorithm_config(stored).settings == ExtensionSettings()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"grad_compression": "zip"}, r"grad_compression='zip'.*'powersgd', 'onebit'"),
        ({"powersgd_rank": 0}, r"powersgd_rank=0.*>= 1"),
        ({"communication": {"type": "MPI"}}, r"communication type='mpi'.*'auto', 'nccl', 'gloo'"),
        ({"communication_type": 2}, r"communication type=2.*'auto', 'nccl', 'gloo'"),
        ({"comm_backend": "nccl"}, r"comm_backend='nccl' is no longer a setting.*Fix: drop it"),
        ({"communication": {"type": "NCCL", "fast": 1}}, r"communication key\(s\): 'fast'"),
    ],
)
def test_bad_compression_input(kwargs: dict, pattern: str) -> None:
    tutorial = any(key.startswith("communication") for key in kwargs)  # the 2023 block
    with pytest.raises(ValueError, match=pattern):
        (compat.PPOConfig if tutorial else rllib_ext.PPOConfig)().training(**kwargs)


def test_nccl_without_gpus_is_an_error_at_validate() -> None:
    cfg = compat.PPOConfig().environment("CartPole-v1")
    cfg.training(communication={"type": "NCCL"})
    cfg.learners(num_learners=2, num_gpus_per_learner=0)  # set after the type: still checked
    with pytest.raises(ValueError, match=r"communication type 'nccl'.*no GPU"):
        cfg.validate()
    cfg.training(communication={"type": "gloo"})
    cfg.validate()


@pytest.mark.parametrize(
    ("communication_type", "num_gpus_per_learner", "error"),
    [
        (None, 0, None),
        (None, 1, None),
        ("auto", 0, None),
        ("auto", 1, None),
        ("gloo", 0, None),
        ("nccl", 1, None),
        ("nccl", 0, r"communication type 'nccl' but the learners have no GPU"),
        ("gloo", 1, r"communication type 'gloo' with GPU learners is not supported"),
    ],
)
def test_communication_type_must_be_what_rllib_picks(
    communication_type: str | None, num_gpus_per_learner: int, error: str | None
) -> None:
    def check() -> list[str]:
        return check_comm_resources(
            CompressionSettings(),
            num_learners=2,
            num_gpus_per_learner=num_gpus_per_learner,
            communication_type=communication_type,
        )

    if error is None:
        assert check() == []
    else:
        with pytest.raises(ValueError, match=error):
            check()


def test_compression_with_one_learner_warns_once_from_the_learner_not_validate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = rllib_ext.PPOConfig().environment("CartPole-v1").training(grad_compression="fp16")
    with caplog.at_level(logging.WARNING, logger="rllib_ext"):
        cfg.validate()
    assert "has no effect" not in caplog.text  # validate() logs nothing; the learner does
    (warning,) = check_algorithm_config(cfg).warnings
    assert "has no effect with num_learners=0" in warning


def _with_rllib_validate_changes(config: Any) -> set[str]:
    """The to_dict() keys that RLlib's own validate() changes on a config like this one."""
    stock = StockPPOConfig.from_dict(copy.deepcopy(config.to_dict()))
    stock.learner_config_dict = {}
    before = copy.deepcopy(stock.to_dict())
    stock.validate()
    after = stock.to_dict()
    return {k for k in before if before[k] != after[k]}


@pytest.mark.parametrize(
    "make",
    [
        lambda: rllib_ext.PPOConfig().environment("CartPole-v1"),
        lambda: rllib_ext.PPOConfig().environment("smax", env_config={"map_name": "3m"}),
        lambda: (
            rllib_ext.PPOConfig()
            .environment("CartPole-v1")
            .training(amp="bf16", amp_inference=True, grad_compression="fp16")
        ),
    ],
    ids=["cartpole", "smax", "amp_inference"],
)
def test_validate_changes_nothing_rllib_itself_does_not(make: Any) -> None:
    cfg = make()
    rllib_changes = _with_rllib_validate_changes(cfg)
    before = copy.deepcopy(cfg.to_dict())
    cfg.validate()
    after = cfg.to_dict()
    changed = {k for k in before if before[k] != after[k]}
    assert changed <= rllib_changes, changed


def test_amp_inference_picks_the_env_runner_when_the_flag_is_set() -> None:
    from rllib_ext.env_runners import AMPMultiAgentEnvRunner, AMPSingleAgentEnvRunner
    from rllib_ext.fused_sampling import FusedSingleAgentEnvRunner

    cfg = rllib_ext.PPOConfig().training(amp="bf16", amp_inference=True)
    assert cfg.env_runner_cls is FusedSingleAgentEnvRunner  # an AMP runner too
    cfg.training(fused_sampling=False)
    assert cfg.env_runner_cls is AMPSingleAgentEnvRunner
    cfg.environment("smax", env_config={"map_name": "3m"})  # multi-agent now
    assert cfg.env_runner_cls is AMPMultiAgentEnvRunner

    class MyRunner(AMPSingleAgentEnvRunner):
        pass

    mine = rllib_ext.PPOConfig().env_runners(env_runner_cls=MyRunner)
    mine.training(amp="bf16", amp_inference=True)
    assert mine.env_runner_cls is MyRunner  # the user's class is kept


def test_amp_inference_needs_a_runner_holding_the_amp_feature() -> None:
    """A runner class gets ``amp_inference`` by deriving from rllib_ext's runner of its RLlib
    base (which holds the feature); one without it is refused in one line naming the fix."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rllib_ext.env_runners import AMPSingleAgentEnvRunner, supports_amp_inference

    class OptedIn(AMPSingleAgentEnvRunner):
        pass

    class Plain(SingleAgentEnvRunner):
        pass

    assert supports_amp_inference(OptedIn, multi_agent=False)
    assert not supports_amp_inference(OptedIn, multi_agent=True)
    ok = rllib_ext.PPOConfig().env_runners(env_runner_cls=OptedIn)
    ok.training(amp="bf16", amp_inference=True).validate()
    assert ok.env_runner_cls is OptedIn
    bad = rllib_ext.PPOConfig().env_runners(env_runner_cls=Plain)
    bad.training(amp="bf16", amp_inference=True)
    assert bad.env_runner_cls is Plain  # the user's class is kept, and refused:
    with pytest.raises(ValueError) as info:
        bad.validate()
    message = str(info.value)
    assert "\n" not in message and "got Plain" in message and "AMPSingleAgentEnvRunner" in message
    assert "amp_inference=False" in message


# --------------------------------------------------------------------------------------------
# Both routes (rllib_ext.PPOConfig.validate() and the stock config's learner) fail the same.

_BAD_COMBINATIONS = {
    "amp_with_compiled_learner": ({"amp": "fp16"}, {"torch_compile_learner": True}),
    "nccl_without_gpus": ({}, {"num_learners": 2, "communication_type": "nccl"}),
    "masked_with_rllib_gae": ({"gae": "rllib", "standardize_advantages": "masked"}, {}),
    "lambda_out_of_range": ({}, {"lambda_": 1.5}),
    "misspelled_key": ({"grad_compresion": "fp16"}, {}),  # own keys pass, near-misses fail
    "amp_zero": ({"amp": 0}, {}),
}


def _config_with(config: Any, flags: dict[str, Any], rest: dict[str, Any]) -> Any:
    config.environment("CartPole-v1").learners(
        learner_config_dict={**config.learner_config_dict, **flags}
    )
    if "torch_compile_learner" in rest:
        config.framework(torch_compile_learner=True)
    if "num_learners" in rest:
        config.learners(num_learners=rest["num_learners"])
    if "lambda_" in rest:
        config.update_from_dict({"lambda": rest["lambda_"]})  # the dict route: no early check
    if "communication_type" in rest:
        # As a config dict carries it (to_dict() of a compat.PPOConfig, e.g. through Tune).
        config.update_from_dict({"communication_type": rest["communication_type"]})
    return config


@pytest.mark.parametrize("case", sorted(_BAD_COMBINATIONS))
def test_both_config_routes_raise_the_same_error(case: str) -> None:
    flags, rest = _BAD_COMBINATIONS[case]
    ours_cls = compat.PPOConfig if "communication_type" in rest else rllib_ext.PPOConfig
    ours = _config_with(ours_cls(), flags, rest)
    with pytest.raises(ValueError) as from_validate:
        ours.validate()

    stock = _config_with(StockPPOConfig(), flags, rest).learners(learner_class=PPOExtTorchLearner)
    learner = PPOExtTorchLearner(config=stock)
    with pytest.raises(ValueError) as from_learner:
        learner.build()  # the check runs before any module is built
    assert str(from_validate.value) == str(from_learner.value)
