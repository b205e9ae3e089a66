"""Real RLlib runs (build_algo + train) proving the extension is active on every route."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig
from ray.rllib.connectors.learner import GeneralAdvantageEstimation

import rllib_ext
from rllib_ext.connectors.gae import CompiledGAE
from rllib_ext.learners.ppo import PPOExtTorchLearner

pytestmark = pytest.mark.usefixtures("ray_session")


def _small(cfg):
    return (
        cfg.environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
        .debugging(seed=0)
    )


def _pipeline_classes(algo: Algorithm) -> list[type]:
    learner = algo.learner_group._learner
    return [type(piece) for piece in learner._learner_connector.connectors]


def _gae_metrics(result: dict) -> dict:
    return {
        k: v
        for k, v in result["learners"]["default_policy"].items()
        if k.startswith("rllib_ext/gae/")
    }


def test_compiled_gae_is_active_and_visible_in_results() -> None:
    algo = _small(rllib_ext.PPOConfig()).build_algo()
    try:
        classes = _pipeline_classes(algo)
        assert CompiledGAE in classes
        assert GeneralAdvantageEstimation not in classes
        result = algo.train()
        metrics = _gae_metrics(result)
        assert metrics["rllib_ext/gae/compiled"] == 1.0
        assert metrics["rllib_ext/gae/compiled"] == 1.0  # the numba kernel ran inside the learner
        assert metrics["rllib_ext/gae/time_ms"] > 0.0
        assert result["learners"]["default_policy"]["vf_loss"] > 0.0
        # The fused episodes-to-batch piece ran (not RLlib's fallback pieces).
        assert result["learners"]["default_policy"]["rllib_ext/batching/vectorized"] == 1.0
    finally:
        algo.stop()


def test_gae_rllib_keeps_rllibs_connector() -> None:
    algo = _small(rllib_ext.PPOConfig()).training(gae="rllib").build_algo()
    try:
        classes = _pipeline_classes(algo)
        assert GeneralAdvantageEstimation in classes and CompiledGAE not in classes
        assert _gae_metrics(algo.train()) == {}
    finally:
        algo.stop()


def test_stock_config_route_activates_the_same_learner() -> None:
    cfg = _small(StockPPOConfig()).learners(
        learner_class=PPOExtTorchLearner, learner_config_dict={"gae": "compiled"}
    )
    algo = cfg.build_algo()
    try:
        assert isinstance(algo.learner_group._learner, PPOExtTorchLearner)
        assert _gae_metrics(algo.train())["rllib_ext/gae/compiled"] == 1.0
    finally:
        algo.stop()


def test_stock_config_route_rejects_bad_value() -> None:
    cfg = _small(StockPPOConfig()).learners(
        learner_class=PPOExtTorchLearner, learner_config_dict={"gae": "fast"}
    )
    with pytest.raises(ValueError, match=r"gae='fast'.*allowed values"):
        cfg.build_algo()


def test_checkpoint_restores_config_subclass_and_flags(tmp_path) -> None:
    algo = _small(rllib_ext.PPOConfig()).training(standardize_advantages="masked").build_algo()
    try:
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        assert isinstance(restored, rllib_ext.PPO)
        assert isinstance(restored.config, rllib_ext.PPOConfig)
        assert restored.config.learner_config_dict["standardize_advantages"] == "masked"
        learner = restored.learner_group._learner
        assert isinstance(learner, PPOExtTorchLearner)
        gae = next(p for p in learner._learner_connector.connectors if isinstance(p, CompiledGAE))
        assert gae.standardize_advantages == "masked"
        result = restored.train()
        assert result["training_iteration"] == 2
        assert _gae_metrics(result)["rllib_ext/gae/compiled"] == 1.0
    finally:
        restored.stop()


def test_tune_with_rllib_ext_trainable_keeps_extension(tmp_path) -> None:
    from ray import tune

    cfg = _small(rllib_ext.PPOConfig())
    tuner = tune.Tuner(
        rllib_ext.PPO,
        param_space=cfg,
        run_config=tune.RunConfig(
            stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0
        ),
    )
    result = tuner.fit().get_best_result(metric="training_iteration", mode="max")
    assert result.error is None
    assert result.metrics["learners"]["default_policy"]["rllib_ext/gae/compiled"] == 1.0


def test_multi_agent_two_modules_both_get_compiled_gae() -> None:
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    cfg = (
        rllib_ext.PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
    )
    algo = cfg.build_algo()
    try:
        result = algo.train()
        for mid in ("p0", "p1"):
            assert result["learners"][mid]["rllib_ext/gae/compiled"] == 1.0
    finally:
        algo.stop()
