"""The front door: ``rllib_ext.PPOConfig`` is RLlib's config plus our flags; 2023 is ``rllib_ext.compat``.

Each 2023 call on ``rllib_ext.PPOConfig`` is checked against stock RLlib's ``PPOConfig`` doing the
same call: the same result or the same exception type, except where stock stores a value that its
new API stack never reads; that fails here in one line naming ``rllib_ext.compat`` and the new name.
No Ray is started.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ray.rllib.algorithms.algorithm_config import DEPRECATED_VALUE
from ray.rllib.algorithms.ppo import PPO as StockPPO
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

import rllib_ext
from rllib_ext import compat
from rllib_ext.cli.ppo_config import build_algo_config
from rllib_ext.cli.runconfig import resolve_settings
from rllib_ext.compat.training_kwargs import TRAINING_ALIASES
from rllib_ext.config import LEGACY_DICT_KEYS, LEGACY_TRAINING_KEYS


def _outcome(call: Any, config: Any) -> Any:
    try:
        return call(config)
    except Exception as exc:  # noqa: BLE001 (the exception is the outcome compared)
        return type(exc)


# 2023 calls whose outcome on rllib_ext.PPOConfig is exactly stock RLlib's.
_AS_STOCK = {
    "training_num_sgd_iter": lambda c: c.training(num_sgd_iter=5).num_epochs,
    "resources_num_cpus": lambda c: c.resources(num_cpus=8),
    "resources_num_gpus_0": lambda c: c.resources(num_gpus=0).num_gpus,
    "resources_num_gpus_per_worker": lambda c: (
        c.resources(num_gpus_per_worker=1).num_gpus_per_env_runner
    ),
    "resources_num_cpus_per_worker": lambda c: (
        c.resources(num_cpus_per_worker=2).num_cpus_per_env_runner
    ),
    "dict_num_workers": lambda c: c.update_from_dict({"num_workers": 3}).num_env_runners,
    "dict_num_envs_per_worker": lambda c: c.update_from_dict({"num_envs_per_worker": 2}),
    "dict_num_cpus_per_worker": lambda c: c.update_from_dict({"num_cpus_per_worker": 2}),
    "dict_num_gpus_per_worker": lambda c: c.update_from_dict({"num_gpus_per_worker": 1}),
    "training_model": lambda c: dict(c.training(model={"fcnet_hiddens": [8]}).model_config),
    "one_arg_policy_mapping_fn": lambda c: c.multi_agent(
        policies={"p"}, policy_mapping_fn=lambda aid: "p"
    ).policy_mapping_fn("a", None),  # as RLlib calls it: (agent_id, episode)
    "resources_total": lambda c: c.resources_total,
    "communication_type": lambda c: c.communication_type,
    "old_result_names_callback": lambda c: c.callbacks_on_train_result,
}


@pytest.mark.parametrize("case", sorted(_AS_STOCK))
def test_2023_call_behaves_as_on_stock_rllib(case: str) -> None:
    ours, stock = (
        _outcome(_AS_STOCK[case], rllib_ext.PPOConfig()),
        _outcome(_AS_STOCK[case], StockPPOConfig()),
    )
    if isinstance(stock, (StockPPOConfig, rllib_ext.PPOConfig)):
        assert isinstance(ours, rllib_ext.PPOConfig)
    else:
        assert ours == stock, (ours, stock)


def test_the_stock_outcomes_compared_are_the_2023_ones() -> None:
    # So the table above compares what it says: RLlib's own refusals and mappings.
    stock = {case: _outcome(call, StockPPOConfig()) for case, call in _AS_STOCK.items()}
    assert stock["resources_num_cpus"] is TypeError
    assert stock["training_num_sgd_iter"] == 5 and stock["dict_num_workers"] == 3
    assert stock["dict_num_cpus_per_worker"] is ValueError
    assert stock["one_arg_policy_mapping_fn"] is TypeError  # RLlib calls fn(agent_id, episode)
    assert stock["resources_total"] is AttributeError
    assert stock["training_model"] == {"vf_share_layers": False}  # stored, not read


def test_rollouts_fails_every_time_where_rllib_fails_once_then_returns_none() -> None:
    stock = [_outcome(lambda c: c.rollouts(num_rollout_workers=2), StockPPOConfig()) for _ in "ab"]
    assert stock[-1] is None and set(stock) <= {ValueError, None}  # RLlib raises once per process
    for _ in "ab":
        with pytest.raises(ValueError) as info:
            rllib_ext.PPOConfig().rollouts(num_rollout_workers=2)
        message = str(info.value)
        assert "\n" not in message and ".rollouts(num_rollout_workers=2)" in message
        assert "rllib_ext.compat.PPOConfig" in message and ".env_runners(" in message
    assert compat.PPOConfig().rollouts(num_rollout_workers=2).num_env_runners == 2


@pytest.mark.parametrize("key", sorted(LEGACY_TRAINING_KEYS))
def test_2023_training_keyword_is_a_type_error_as_in_rllib_naming_the_fix(key: str) -> None:
    value = {"communication": {"type": "NCCL"}}.get(key, True)
    with pytest.raises(TypeError, match=key):
        StockPPOConfig().training(**{key: value})
    with pytest.raises(TypeError) as info:
        rllib_ext.PPOConfig().training(**{key: value})
    message = str(info.value)
    assert "\n" not in message and f"training({key}=" in message
    assert "use rllib_ext.compat.PPOConfig for the 2023 API" in message
    assert LEGACY_TRAINING_KEYS[key] in message


def test_every_tutorial_training_alias_is_rllibs_or_refused() -> None:
    # A new alias in rllib_ext.compat needs a decision on rllib_ext.PPOConfig too.
    for key in TRAINING_ALIASES:
        assert key in LEGACY_TRAINING_KEYS or key == "num_sgd_iter", key


_UNREAD_DICT_VALUES = {
    "training": {"kl_coeff": 0.3},
    "communication": {"type": "NCCL", "compression": True},
    "communication_type": "nccl",
    "num_sgd_iter": 5,
    "sgd_minibatch_size": 64,
    "fp16": True,
    "fp16_loss_scaling": 1024.0,
    "horizon": 200,
    "num_gpus": 2,
}


@pytest.mark.parametrize("key", sorted(LEGACY_DICT_KEYS))
def test_2023_dict_key_that_rllib_stores_unread_fails_in_one_line(key: str) -> None:
    value = _UNREAD_DICT_VALUES[key]
    stock = StockPPOConfig().update_from_dict({key: value})
    default = StockPPOConfig()
    # Stock accepts it and runs as if it were absent.
    for setting in ("num_epochs", "minibatch_size", "kl_coeff", "num_learners", "grad_clip"):
        assert getattr(stock, setting) == getattr(default, setting), setting
    assert not callable(stock.training) or key != "training"  # the block hides .training()

    ours = rllib_ext.PPOConfig()
    before = ours.to_dict()
    with pytest.raises(ValueError) as info:
        ours.update_from_dict({key: value, "lr": 0.5})
    message = str(info.value)
    assert "\n" not in message and f'"{key}"' in message and repr(value) in message
    assert "use rllib_ext.compat.PPOConfig for the 2023 API" in message
    assert LEGACY_DICT_KEYS[key] in message
    assert ours.to_dict() == before  # refused before anything applies


def test_resources_num_gpus_is_refused_where_rllib_ignores_it() -> None:
    stock = StockPPOConfig().resources(num_gpus=2)
    assert (stock.num_learners, stock.num_gpus_per_learner) == (0, 0)  # no GPU is used
    with pytest.raises(ValueError, match=r"\.resources\(num_gpus=2\).*rllib_ext\.compat.*learners"):
        rllib_ext.PPOConfig().resources(num_gpus=2)
    old_stack = rllib_ext.PPOConfig().api_stack(
        enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
    )
    assert old_stack.resources(num_gpus=2).num_gpus == 2  # RLlib's old stack reads it


@pytest.mark.parametrize("source", ["stock", "ours", "compat"])
def test_round_trip_dicts_pass_the_refusal(source: str) -> None:
    config = {
        "stock": StockPPOConfig,
        "ours": rllib_ext.PPOConfig,
        "compat": compat.PPOConfig,
    }[source]().training(lr=0.001)
    as_dict = config.to_dict()
    assert as_dict.get("sgd_minibatch_size", DEPRECATED_VALUE) == DEPRECATED_VALUE
    assert rllib_ext.PPOConfig.from_dict(as_dict).lr == 0.001


def test_training_model_is_stored_unread_as_in_rllib_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ray.util import debug

    debug._logged.discard("rllib_ext_model")
    with caplog.at_level(logging.WARNING, logger="rllib_ext.config"):
        ours = rllib_ext.PPOConfig().training(model={"fcnet_hiddens": [8]})
    stock = StockPPOConfig().training(model={"fcnet_hiddens": [8]})
    assert ours.model["fcnet_hiddens"] == stock.model["fcnet_hiddens"] == [8]
    assert dict(ours.model_config) == dict(stock.model_config)
    (record,) = [r for r in caplog.records if "model=" in r.getMessage()]
    assert "rl_module(model_config=...)" in record.getMessage()
    mapped = compat.PPOConfig().training(model={"fcnet_hiddens": [8]})
    assert mapped.model_config["fcnet_hiddens"] == [8]


def test_classes_compose_our_flags_below_the_2023_layer() -> None:
    from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
    from rllib_ext.compat.config import LegacyAPIMixin

    assert not issubclass(rllib_ext.PPOConfig, LegacyAPIMixin)
    assert not issubclass(rllib_ext.PPO, LegacyAlgorithmMixin)
    assert issubclass(rllib_ext.PPO, StockPPO)
    assert issubclass(compat.PPOConfig, rllib_ext.PPOConfig)
    assert issubclass(compat.PPO, rllib_ext.PPO) and issubclass(compat.PPO, LegacyAlgorithmMixin)
    assert type(compat.PPO.get_default_config()) is compat.PPOConfig
    assert type(rllib_ext.PPO.get_default_config()) is rllib_ext.PPOConfig
    assert compat.PPOConfig().algo_class is compat.PPO
    assert rllib_ext.PPOConfig().algo_class is rllib_ext.PPO
    # Our flags and the 2023 names side by side on the compat class.
    both = compat.PPOConfig().training(gae="rllib", num_sgd_iter=4, fp16=True)
    assert (both.learner_config_dict["gae"], both.num_epochs) == ("rllib", 4)
    assert both.learner_config_dict["amp"] == "fp16"


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ('{"fp16": false, "num_sgd_iter": 3}', "rllib_ext.config"),  # resolved by the CLI
        ('{"communication": {"type": "gloo"}}', "rllib_ext.compat.ppo"),
        ('{"model": {"fcnet_hiddens": [16]}}', "rllib_ext.compat.ppo"),
    ],
)
def test_cli_builds_the_2023_layer_only_where_its_keys_are_used(
    training: str, expected: str
) -> None:
    config = build_algo_config(resolve_settings({"env": "CartPole-v1", "training": training}))
    assert type(config).__module__ == expected
    if "communication" in training:
        assert config.communication_type == "gloo"
    if "model" in training:
        assert config.model_config["fcnet_hiddens"] == [16]


@pytest.mark.parametrize(
    ("trainable", "metric"),
    [
        ("PPO", "episode_reward_mean"),  # the tutorial's string: rllib_ext.compat.PPO
        (rllib_ext.PPO, "env_runners/episode_return_mean"),  # reports RLlib's names only
    ],
)
def test_tune_run_defaults_the_metric_its_trainable_reports(
    trainable: Any, metric: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from rllib_ext import tune

    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(tune, "_tune", SimpleNamespace(run=lambda t, **kw: calls.append((t, kw))))
    monkeypatch.delenv(tune.MAX_ITERATIONS_ENV, raising=False)
    tune.run(trainable, config={"env": "CartPole-v1"})
    ((ran, kwargs),) = calls
    assert ran is (compat.PPO if trainable == "PPO" else trainable)
    assert (kwargs["metric"], kwargs["mode"]) == (metric, "max")


def test_update_from_dict_takes_a_config_as_rllibs_resource_request_passes_it() -> None:
    """``Algorithm.default_resource_request(config)`` (what ``tune.with_resources`` users call, e.g.
    RLlib's ``ray_tune/custom_experiment.py``) hands the config object itself to
    ``update_from_dict``: its bound methods (``.training``) are not 2023 dict keys."""
    import rllib_ext

    config = rllib_ext.PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
    copy = rllib_ext.PPOConfig().update_from_dict(config)
    assert copy.env == "CartPole-v1" and copy.num_env_runners == 0
    assert copy.learner_config_dict == config.learner_config_dict
    assert rllib_ext.PPO.default_resource_request(config) is not None
