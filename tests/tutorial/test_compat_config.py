"""The 2023 config API on rllib_ext.compat.PPOConfig (no Ray started)."""

from __future__ import annotations

import copy
import logging

import pytest
from ray.rllib.algorithms.ppo import PPO as StockPPO

from rllib_ext import compat
from rllib_ext.compat import (
    AgentIdMapping,
    learners_for_num_gpus,
    legacy_metrics_on_train_result,
    resource_request,
)
from rllib_ext.compat.resources import Machine, check_request, fit_to_machine

TUTORIAL_CH3_DICT = {
    "communication": {"type": "NCCL", "compression": True, "grad_clip": 0.5},
    "training": {"use_kl_loss": True, "kl_coeff": 0.3},
    "env": "CartPole-v1",
    "framework": "torch",
    "num_gpus": 2,
    "num_workers": 6,
    "num_cpus_per_worker": 1,
    "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
}


@pytest.fixture(autouse=True)
def _no_fitting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLLIB_EXT_FIT_RESOURCES", raising=False)


def _tutorial_ch2() -> compat.PPOConfig:
    return (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .resources(num_gpus=2, num_cpus=8)
        .rollouts(num_rollout_workers=6)
        .training(gamma=0.99, lr=0.0003)
    )


@pytest.mark.parametrize(
    "num_gpus, expected",
    [
        (0, {"num_learners": 0, "num_gpus_per_learner": 0}),
        (0.5, {"num_learners": 0, "num_gpus_per_learner": 0.5}),
        (1, {"num_learners": 0, "num_gpus_per_learner": 1}),
        (4, {"num_learners": 4, "num_gpus_per_learner": 1}),
    ],
)
def test_num_gpus_maps_to_learners(num_gpus: float, expected: dict) -> None:
    assert learners_for_num_gpus(num_gpus) == expected
    config = compat.PPOConfig().resources(num_gpus=num_gpus)
    assert (config.num_learners, config.num_gpus_per_learner) == tuple(expected.values())


@pytest.mark.parametrize("bad", [-1, 2.5, "2", True])
def test_bad_num_gpus_names_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"num_gpus={bad!r}"):
        compat.PPOConfig().resources(num_gpus=bad)


def test_tutorial_chapter2_builder_chain(caplog: pytest.LogCaptureFixture) -> None:
    config = _tutorial_ch2()
    assert (config.num_learners, config.num_gpus_per_learner) == (2, 1)
    assert config.num_env_runners == 6
    assert config.lr == 0.0003
    # main process 1 CPU, 6 env runners x 1 CPU, 2 GPU learners x 0 CPU ("auto" beside a GPU).
    assert config.resources_total == {"cpu": 7.0, "gpu": 2.0}


def test_rollouts_maps_every_old_keyword() -> None:
    config = compat.PPOConfig().rollouts(
        num_rollout_workers=3,
        num_envs_per_worker=2,
        rollout_fragment_length=50,
        batch_mode="complete_episodes",
    )
    assert config.num_env_runners == 3
    assert config.num_envs_per_env_runner == 2
    assert config.rollout_fragment_length == 50
    assert config.batch_mode == "complete_episodes"
    with pytest.raises(ValueError, match=r"\['num_banana_workers'\]"):
        compat.PPOConfig().rollouts(num_banana_workers=1)


def test_resources_per_worker_keywords_go_to_env_runners() -> None:
    config = compat.PPOConfig().resources(
        num_cpus_per_worker=2, num_gpus_per_worker=0.1, placement_strategy="SPREAD"
    )
    assert config.num_cpus_per_env_runner == 2
    assert config.num_gpus_per_env_runner == 0.1
    assert config.placement_strategy == "SPREAD"


def test_tutorial_chapter3_dict() -> None:
    config = compat.PPOConfig.from_dict(copy.deepcopy(TUTORIAL_CH3_DICT))
    assert config.env == "CartPole-v1"
    assert (config.num_learners, config.num_gpus_per_learner) == (2, 1)
    assert config.num_env_runners == 6 and config.num_cpus_per_env_runner == 1
    assert config.use_kl_loss and config.kl_coeff == 0.3 and config.grad_clip == 0.5
    assert config.communication_type == "nccl"
    assert config.extension_settings.comm.grad_compression == "fp16"
    assert config.model_config["fcnet_hiddens"] == [64, 64]
    # The `training` method is not overwritten by the dict's "training" block.
    assert callable(config.training)


def test_dict_round_trip_through_to_dict_is_stable() -> None:
    config = compat.PPOConfig.from_dict(copy.deepcopy(TUTORIAL_CH3_DICT))
    again = compat.PPOConfig().update_from_dict(config.to_dict())
    for key in ("num_learners", "num_gpus_per_learner", "num_env_runners", "kl_coeff"):
        assert getattr(again, key) == getattr(config, key), key
    assert again.extension_settings == config.extension_settings
    assert again.model_config["fcnet_hiddens"] == [64, 64]


def test_old_training_aliases_at_top_level_of_a_dict() -> None:
    config = compat.PPOConfig.from_dict({"num_sgd_iter": 7, "sgd_minibatch_size": 64})
    assert config.num_epochs == 7 and config.minibatch_size == 64


def test_num_envs_per_worker_and_conflicts() -> None:
    config = compat.PPOConfig.from_dict({"num_envs_per_worker": 4})
    assert config.num_envs_per_env_runner == 4
    with pytest.raises(ValueError, match=r"'num_workers'=2 and 'num_env_runners'=3 disagree"):
        compat.PPOConfig.from_dict({"num_workers": 2, "num_env_runners": 3})


def test_horizon_is_refused_with_the_fix() -> None:
    assert compat.PPOConfig.from_dict({"horizon": None}).num_env_runners == 2
    with pytest.raises(ValueError, match=r"horizon=2000.*TimeLimit.*max_episode_steps=2000"):
        compat.PPOConfig.from_dict({"horizon": 2000})


def test_one_argument_policy_mapping_fn_is_adapted() -> None:
    config = compat.PPOConfig().multi_agent(
        policies={"shared_policy"}, policy_mapping_fn=lambda agent_id: "shared_policy"
    )
    assert isinstance(config.policy_mapping_fn, AgentIdMapping)
    assert config.policy_mapping_fn("ally_0", None) == "shared_policy"

    def two_args(agent_id, episode, **kwargs):
        return "shared_policy"

    config = compat.PPOConfig().multi_agent(policies={"p"}, policy_mapping_fn=two_args)
    assert config.policy_mapping_fn is two_args


def test_config_carries_the_old_metric_callback_for_stock_ppo() -> None:
    config = compat.PPOConfig()
    assert config.callbacks_on_train_result is legacy_metrics_on_train_result
    assert config.to_dict()["callbacks_on_train_result"] is legacy_metrics_on_train_result


@pytest.mark.parametrize(
    "setup",
    [
        lambda c: c.env_runners(num_env_runners=3),
        lambda c: c.learners(num_learners=2, num_gpus_per_learner=0),
        lambda c: c.learners(num_learners=0, num_gpus_per_learner=1),
        lambda c: c.learners(num_learners=3, num_gpus_per_learner=1).env_runners(
            num_env_runners=2, num_gpus_per_env_runner=0.5, num_cpus_per_env_runner=2
        ),
    ],
)
def test_resource_request_matches_rllibs_placement_group(setup) -> None:
    config = setup(compat.PPOConfig().environment("CartPole-v1"))
    bundles = StockPPO.default_resource_request(config.to_dict()).bundles
    assert config.resources_total == {
        "cpu": sum(b.get("CPU", 0) for b in bundles),
        "gpu": sum(b.get("GPU", 0) for b in bundles),
    }


def test_check_names_what_was_asked_what_exists_and_the_flag() -> None:
    config = _tutorial_ch2()
    laptop = Machine(cpu=2, gpu=0, where="this machine")
    with pytest.raises(ValueError) as err:
        check_request(config, include_main=True, have=laptop)
    message = str(err.value)
    assert "\n" not in message
    assert "asks for 7 CPUs and 2 GPUs" in message
    assert "this machine has 2 CPUs and 0 GPUs" in message
    assert "RLLIB_EXT_FIT_RESOURCES=1" in message
    check_request(config, include_main=True, have=Machine(cpu=7, gpu=2, where="x"))


def test_check_without_main_process_counts_a_local_learners_gpu() -> None:
    config = compat.PPOConfig().env_runners(num_env_runners=0).resources(num_gpus=1)
    with pytest.raises(ValueError, match="0 CPUs and 1 GPUs"):
        check_request(config, include_main=False, have=Machine(cpu=2, gpu=0, where="m"))


@pytest.mark.parametrize(
    "have, learners, runners",
    [
        (Machine(cpu=2, gpu=0, where="m"), (0, 0), 0),  # 1 remote runner -> main process
        (Machine(cpu=4, gpu=0, where="m"), (0, 0), 3),
        (Machine(cpu=16, gpu=1, where="m"), (0, 1), 6),
        (Machine(cpu=16, gpu=8, where="m"), (2, 1), 6),
    ],
)
def test_fit_scales_down_only(have: Machine, learners: tuple, runners: int) -> None:
    config = _tutorial_ch2()
    fit_to_machine(config, have=have)
    assert (config.num_learners, config.num_gpus_per_learner) == learners
    assert config.num_env_runners == runners
    check_request(config, include_main=True, have=have)
    assert fit_to_machine(config, have=have) == {}  # idempotent


def test_fit_cuts_cpu_learners_and_nccl(caplog: pytest.LogCaptureFixture) -> None:
    config = compat.PPOConfig.from_dict(copy.deepcopy(TUTORIAL_CH3_DICT))
    with caplog.at_level(logging.WARNING, logger="rllib_ext"):
        changes = fit_to_machine(config, have=Machine(cpu=3, gpu=0, where="a test cluster"))
    assert changes["communication_type"] == ("nccl", "gloo")
    assert config.communication_type == "gloo"
    assert (config.num_learners, config.num_env_runners) == (0, 2)
    assert fit_to_machine(config, have=Machine(cpu=2, gpu=0, where="m")) == {
        "num_env_runners": (2, 0)
    }
    assert "a test cluster (3 CPUs, 0 GPUs)" in caplog.text
    config.validate()  # nccl with CPU learners would be refused


def test_fit_env_var_applies_when_resources_are_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLIB_EXT_FIT_RESOURCES", "1")
    config = _tutorial_ch2()
    request = resource_request(config)
    assert request.gpu() == 0 or config.num_gpus_per_learner <= 1
    check_request(config, include_main=True)  # fits what this process sees


def test_fit_env_var_refits_a_communication_type_set_in_a_builder_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLLIB_EXT_FIT_RESOURCES", "1")
    config = compat.PPOConfig().environment("CartPole-v1")
    config.training(communication={"type": "NCCL"})  # CPU learners (the default): RLlib runs gloo
    assert config.communication_type == "gloo"
    config.validate()
