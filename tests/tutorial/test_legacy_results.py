"""Old result names and stop rules through real RLlib/Tune runs (CartPole, tiny batches).

* ``episode_reward_mean`` equals ``env_runners/episode_return_mean`` in every result, and a
  Tune stop rule on the old name fires on the iteration where the new name crosses;
* a stock ``"PPO"`` built from ``rllib_ext.compat.PPOConfig().to_dict()`` reports the old names too;
* the tutorial's follow-up (``analysis.best_checkpoint``, ``PPO(config=config)``,
  ``restore``, ``evaluate``) works;
* a request the cluster cannot grant fails in one line instead of waiting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllib_ext import compat, tune

pytestmark = pytest.mark.slow

THRESHOLD = 40.0
"""A return CartPole's random policy (about 22) does not reach but PPO does in a few iterations."""


def _small_config() -> compat.PPOConfig:
    return (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=500, minibatch_size=100, num_epochs=4, lr=1e-3)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .debugging(seed=0)
    )


def _results(root: Path) -> list[dict]:
    (path,) = root.rglob("result.json")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_stop_rule_on_the_old_name_fires_where_the_new_name_crosses(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(tune.MAX_ITERATIONS_ENV, raising=False)
    analysis = tune.run(
        "PPO",
        config=_small_config(),
        stop={"episode_reward_mean": THRESHOLD, "training_iteration": 40},
        checkpoint_at_end=True,
        local_dir=str(tmp_path),
        verbose=0,
    )
    results = _results(tmp_path)
    new = [r["env_runners"]["episode_return_mean"] for r in results]
    assert [r["episode_reward_mean"] for r in results] == new
    crossed = next(i for i, x in enumerate(new) if x >= THRESHOLD)  # StopIteration: not reached
    assert len(results) == crossed + 1

    # The tutorial's follow-up (chapter 5, in its comments).
    best_checkpoint = analysis.best_checkpoint
    trainer = compat.PPO(config=_small_config())
    try:
        trainer.restore(best_checkpoint)
        assert trainer.training_iteration == len(results)
        eval_results = trainer.evaluate()
        assert eval_results["env_runners"]["episode_return_mean"] > 0
    finally:
        trainer.stop()


def test_stock_ppo_from_our_config_dict_reports_old_names(ray_session) -> None:
    from ray.rllib.algorithms.ppo import PPO as StockPPO

    algo = StockPPO(config=_small_config().to_dict())
    try:
        for _ in range(2):
            result = algo.train()
            assert result["episode_reward_mean"] == result["env_runners"]["episode_return_mean"]
            assert result["timesteps_total"] == result["num_env_steps_sampled_lifetime"]
    finally:
        algo.stop()


def test_missing_hardware_fails_in_one_line_not_a_hang(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLLIB_EXT_FIT_RESOURCES", raising=False)
    config = _small_config().resources(num_gpus=2).rollouts(num_rollout_workers=24)
    with pytest.raises(ValueError, match=r"asks for 24 CPUs and 2 GPUs.*RLLIB_EXT_FIT_RESOURCES=1"):
        config.validate()
    with pytest.raises(Exception, match=r"RLLIB_EXT_FIT_RESOURCES=1") as err:
        tune.run("PPO", config=config, storage_path=str(tmp_path), verbose=0)
    assert "this Ray cluster has 4 CPUs and 0 GPUs" in str(err.value)
