"""Real RLlib runs on SMAX 3m with value normalization and death masking on (slow)."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.algorithms.algorithm import Algorithm

import rllib_ext
from rllib_ext.envs import register_envs

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

MID = "shared_policy"
NORM_KEYS = ("value_norm.running_mean", "value_norm.running_mean_sq", "value_norm.debiasing_term")


def _config():
    register_envs()
    return (
        rllib_ext.PPOConfig()
        .environment("smax", env_config={"map_name": "3m", "seed": 0})
        .rl_module(
            model_config={
                "fcnet_hiddens": [32, 32],
                "central_critic": True,
                "value_norm": True,
                "death_masking": True,
            }
        )
        .env_runners(num_env_runners=1, num_envs_per_env_runner=4)
        .training(train_batch_size_per_learner=600, minibatch_size=200, num_epochs=2)
        .debugging(seed=0)
    )


def _norm_state(algo: Algorithm) -> dict[str, torch.Tensor]:
    module = algo.learner_group._learner.module[MID].unwrapped()
    return {key: value.clone() for key, value in module.state_dict().items() if key in NORM_KEYS}


def test_smax_3m_two_iterations_and_the_statistics_survive_a_checkpoint(tmp_path):
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    algo = _config().build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        learner_results = result["learners"][MID]
        # One update per training batch, from real value targets (SMAX returns are > 0).
        assert learner_results["rllib_ext/value_norm/mean"] > 0.0
        assert learner_results["rllib_ext/value_norm/std"] > 0.0
        assert 0.0 <= learner_results["rllib_ext/death_mask/dead_fraction"] < 1.0
        state = _norm_state(algo)
        beta = algo.learner_group._learner.module[MID].unwrapped().value_norm.beta
        torch.testing.assert_close(
            state["value_norm.debiasing_term"],
            torch.tensor(1 - beta**2),  # exactly two updates
            rtol=1e-5,
            atol=0,
        )
        algo.save_to_path(tmp_path)
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(tmp_path)
    try:
        for key, value in _norm_state(restored).items():
            torch.testing.assert_close(value, state[key], rtol=0, atol=0)
        # The restored learner keeps updating from there.
        restored.train()
        after = _norm_state(restored)["value_norm.debiasing_term"]
        torch.testing.assert_close(after, torch.tensor(1 - beta**3), rtol=1e-5, atol=0)
    finally:
        restored.stop()


def test_two_learners_with_compression_share_one_update_of_the_statistics():
    """Issue 16's cluster setting on CPU: one remote env runner with batched SMAX battles,
    num_learners=2 over gloo with 1-bit compressed gradients and bf16 autocast, the recipe
    options on. The value-norm moments are all-reduced (both learners hold the same buffers),
    the compression hook ran (its metrics are in the result) and the weights stay identical."""
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    config = _config().learners(num_learners=2)
    config.training(grad_compression="onebit", onebit_warmup_steps=0, amp="bf16")
    algo = config.build_algo()
    try:
        result = algo.train()
        assert (
            result["env_runners"]["rllib_ext/smax_batched_envs"] == 4
        )  # SMAXVectorEnvRunner sampled
        learner_results = result["learners"][MID]
        assert learner_results["rllib_ext/value_norm/std"] > 0.0
        assert (
            learner_results["rllib_ext/comm/bytes_sent"] > 0
            and learner_results["rllib_ext/comm/time_ms"] > 0
        )
        # 1 bit per gradient entry plus scales, against 32 bits uncompressed.
        assert learner_results["rllib_ext/comm/compression_ratio"] > 10
        states = algo.learner_group.foreach_learner(
            lambda learner: {
                key: value.clone()
                for key, value in learner.module[MID].unwrapped().state_dict().items()
            }
        )
        states = [ref.get() for ref in states]
        assert len(states) == 2
        for key in states[0]:
            torch.testing.assert_close(states[0][key], states[1][key], rtol=0, atol=0)
        assert states[0]["value_norm.debiasing_term"] > 0.0
    finally:
        algo.stop()
