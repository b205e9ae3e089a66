"""Issue 40, case 7: checkpoints cross between stock RLlib and rllib_ext.

* A stock checkpoint restored into rllib_ext keeps rllib_ext's settings: the lean update's
  fused Adam survives the stock optimizer state (torch's ``load_state_dict`` copies the saved
  param-group flags, which turned the lean step into RLlib's single-tensor loop).
* An rllib_ext checkpoint restored into stock RLlib reports no rllib_ext metrics
  (``rllib_ext/gae/*``, ``rllib_ext/batching/*``, ``env_runners/rllib_ext/fused_sampling``): ours are saved under our own state
  key, by the learner and by ``rllib_ext.PPO`` (the algorithm's logger holds them too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

import rllib_ext
from rllib_ext import _rllib_private as private
from rllib_ext.learners.checkpoint_state import is_our_metric
from tests.conformance._configs import on_learner, tiny

MODULE = "default_policy"


def _trained_checkpoint(config: Any, path: Path) -> Path:
    algo = tiny(config).build_algo()
    try:
        algo.train()
        algo.save_to_path(str(path))
    finally:
        algo.stop()
    return path


@pytest.fixture(scope="module")
def checkpoints(ray_session, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "stock": _trained_checkpoint(StockPPOConfig(), root / "stock"),
        "ours": _trained_checkpoint(rllib_ext.PPOConfig(), root / "ours"),
    }


def _adam_flags(learner: Any) -> list[Any]:
    return [o.param_groups[0]["fused"] for _, o in learner.get_optimizers_for_module(MODULE)]


def _our_learner_metrics(learner: Any) -> list[str]:
    return sorted(
        k for k in private.metrics_state_stats(learner.metrics.get_state()) if is_our_metric(k)
    )


def _our_result_keys(result: dict[str, Any]) -> list[str]:
    learner = result["learners"][MODULE]
    return sorted(k for k in learner if k.startswith("rllib_ext/"))


def test_our_metrics_are_recognised_under_our_prefix_and_under_their_old_names() -> None:
    ours = ["default_policy--rllib_ext/gae/time_ms", "learners--p0--rllib_ext/amp/dtype"]
    ours += ["env_runners--rllib_ext/win_rate", "learners--__all_modules__--rllib_ext/profile"]
    # Older rllib_ext checkpoints: the same metrics before they moved under rllib_ext/.
    ours += ["default_policy--gae/time_ms", "learners--p0--batching/vectorized"]
    ours += ["env_runners--fused_sampling", "env_runners--smax_fused_groups"]
    assert all(is_our_metric(key) for key in ours)
    rllibs = ["default_policy--policy_loss", "env_runners--episode_return_mean"]
    rllibs += ["learners--p0--gaelic", "env_runners--win_rate", "learners--__all_modules__--gae"]
    assert not any(is_our_metric(key) for key in rllibs)


def test_stock_checkpoint_into_rllib_ext_keeps_the_lean_update(checkpoints) -> None:
    algo = tiny(rllib_ext.PPOConfig()).build_algo()
    try:
        assert on_learner(algo, _adam_flags) == [True]
        algo.restore_from_path(str(checkpoints["stock"]))
        assert on_learner(algo, _adam_flags) == [True]  # was None: RLlib's plain Adam
        result = algo.train()
        assert on_learner(algo, _adam_flags) == [True]
        assert _our_result_keys(result)  # our pieces run, and say so
    finally:
        algo.stop()


def test_rllib_ext_checkpoint_into_stock_reports_no_rllib_ext_metrics(checkpoints) -> None:
    algo = tiny(StockPPOConfig()).build_algo()
    try:
        algo.restore_from_path(str(checkpoints["ours"]))
        assert _our_learner_metrics_of(algo) == []
        result = algo.train()
        assert _our_result_keys(result) == []
        assert "rllib_ext/fused_sampling" not in result["env_runners"]
    finally:
        algo.stop()


def test_rllib_ext_checkpoint_into_rllib_ext_keeps_our_metrics(checkpoints) -> None:
    algo = tiny(rllib_ext.PPOConfig()).build_algo()
    try:
        algo.restore_from_path(str(checkpoints["ours"]))
        assert _our_learner_metrics_of(algo)  # put back from our own state key
        algo_stats = private.metrics_state_stats(algo.metrics.get_state())
        assert "env_runners--rllib_ext/fused_sampling" in algo_stats
        assert on_learner(algo, _adam_flags) == [True]
    finally:
        algo.stop()


def _our_learner_metrics_of(algo: Any) -> list[str]:
    return on_learner(algo, _our_learner_metrics)
