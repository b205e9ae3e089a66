"""The lean learner update (``lean_update=True``) against RLlib's own update step.

Same weights, same episodes, same minibatch order: after a full update (several epochs of
minibatches, gradient clipping by global norm) the parameters and Adam's moments equal those of
RLlib's single-tensor Adam with per-tensor checks, within fp32 rounding; the lean pieces are the
ones that ran (fused Adam), and non-finite gradients take RLlib's path (warning and all).
"""

from __future__ import annotations

import copy
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

from rllib_ext import PPOConfig
from rllib_ext.fused_sampling import FusedSingleAgentEnvRunner
from rllib_ext.learners import lean


def _config(config_cls, env: str, **training):
    return (
        config_cls()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
        .rl_module(model_config={"fcnet_hiddens": [32, 32]})
        .training(
            **{
                "train_batch_size": 400,
                "minibatch_size": 64,
                "num_epochs": 3,
                "grad_clip": 0.5,
                "lr": 1e-3,
                # One thread in each of our learners: `auto` follows the machine's load per
                # update, so two learners could report different `cpu_threads`.
                **({"cpu_threads": 1} if config_cls is PPOConfig else {}),
                **training,
            }
        )
        .debugging(seed=1)
    )


def _episodes(env: str):
    config = _config(PPOConfig, env)
    runner = FusedSingleAgentEnvRunner(config=config)
    torch.manual_seed(0)
    return runner.sample(num_timesteps=400, explore=True)


def _update(learner, episodes) -> dict:
    np.random.seed(0)  # the minibatch iterator's shuffle (the same order in both learners)
    return learner.update(
        episodes=copy.deepcopy(episodes),  # the learner connector extends episodes in place
        timesteps={"num_env_steps_sampled_lifetime": 400},
        num_epochs=3,
        minibatch_size=64,
        shuffle_batch_per_epoch=True,
    )


def _learner(config, weights=None):
    learner = config.build_learner(env=gym.make(config.env))
    if weights is not None:
        learner.module["default_policy"].set_state(weights)
    return learner


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_lean_update_equals_rllibs_update_within_fp32(env):
    episodes = _episodes(env)
    lean_learner = _learner(_config(PPOConfig, env))
    weights = lean_learner.module["default_policy"].get_state()  # actor and critic
    reference = _learner(_config(PPOConfig, env, lean_update=False), weights)
    stock = _learner(_config(StockPPOConfig, env, lambda_=1.0), weights)
    (_, lean_optim), *_ = lean_learner.get_optimizers_for_module("default_policy")
    (_, ref_optim), *_ = reference.get_optimizers_for_module("default_policy")
    assert lean_optim.defaults["fused"] and not ref_optim.defaults["fused"]
    assert not ref_optim.defaults["foreach"]  # RLlib's single-tensor Adam
    for learner in (lean_learner, reference, stock):
        _update(learner, episodes)
    ours = lean_learner.module["default_policy"].state_dict()
    theirs = reference.module["default_policy"].state_dict()
    moved = 0.0
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((value - weights[name]).abs().max()))
    assert moved > 1e-3  # the update changed the weights (so equality says something)
    for p_ours, p_theirs in zip(
        lean_optim.param_groups[0]["params"], ref_optim.param_groups[0]["params"], strict=True
    ):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(
                lean_optim.state[p_ours][key], ref_optim.state[p_theirs][key], rtol=1e-5, atol=1e-7
            )
    # RLlib's own learner (its GAE, batching and step) lands on the same weights too.
    for name, value in stock.module["default_policy"].state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-5, msg=name)


def _flat(results, prefix=()):
    for key, value in results.items():
        if isinstance(value, dict):
            yield from _flat(value, (*prefix, key))
        else:
            # A Stats object (what Learner.update returns) or a plain value.
            plain = value.peek() if hasattr(value, "peek") else value
            yield "/".join(map(str, (*prefix, key))), plain


_OURS_ONLY = ("rllib_ext/indexed_minibatches",)
_TIMED = ("throughput", "_time", "time_ms", "timer")


@pytest.mark.parametrize(
    ("env", "training", "module"),
    [
        ("CartPole-v1", {}, {}),
        ("CartPole-v1", {"grad_clip_by": "norm", "use_kl_loss": True, "kl_coeff": 0.3}, {}),
        ("CartPole-v1", {"lr": [[0, 1e-3], [800, 1e-4]], "grad_clip_by": "value"}, {}),
        ("Pendulum-v1", {"entropy_coeff": 0.01}, {"vf_share_layers": True}),
    ],
    ids=["discrete", "kl-norm-clip", "lr-schedule-value-clip", "continuous-shared-layers"],
)
def test_lean_loop_equals_rllibs_update_rows_weights_and_metrics(env, training, module):
    """lean_update=True (indexed minibatches, metrics handed over once per update, fused Adam)
    against lean_update=False (RLlib's iterator, per-minibatch logging, RLlib's Adam): the same
    weights, Adam state and result metrics after two updates."""

    def config(lean: bool):
        return _config(PPOConfig, env, lean_update=lean, **training).rl_module(
            model_config={"fcnet_hiddens": [32, 32], **module}
        )

    episodes = _episodes(env)
    lean_learner = _learner(config(True))
    weights = lean_learner.module["default_policy"].get_state()
    reference = _learner(config(False), weights)
    for _ in range(2):
        ours = dict(_flat(_update(lean_learner, episodes)))
        theirs = dict(_flat(_update(reference, episodes)))
    assert ours.pop("__all_modules__/rllib_ext/indexed_minibatches") == 1.0
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        if any(t in key for t in _TIMED):
            continue
        if isinstance(value, str):
            assert ours[key] == value, key
        else:
            assert float(ours[key]) == pytest.approx(
                float(value), rel=1e-4, abs=1e-6, nan_ok=True
            ), key
    for name, value in reference.module["default_policy"].state_dict().items():
        torch.testing.assert_close(
            lean_learner.module["default_policy"].state_dict()[name], value, rtol=1e-5, atol=1e-6
        )


def test_clip_gradients_matches_rllibs_formula():
    from ray.rllib.utils.torch_utils import clip_gradients as rllib_clip

    torch.manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        grads = {i: torch.randn(shape) * scale for i, shape in enumerate([(5, 7), (7,), (3,)])}
        ours = {k: v.clone() for k, v in grads.items()}
        theirs = {k: v.clone() for k, v in grads.items()}
        norm = lean.clip_gradients(ours, grad_clip=0.5, grad_clip_by="global_norm")
        ref_norm = rllib_clip(theirs, grad_clip=0.5, grad_clip_by="global_norm")
        torch.testing.assert_close(norm, ref_norm)
        for k in grads:
            torch.testing.assert_close(ours[k], theirs[k])
    by_value = {0: torch.tensor([-2.0, 0.1, 3.0])}
    assert lean.clip_gradients(by_value, grad_clip=1.0, grad_clip_by="value") is None
    assert by_value[0].tolist() == pytest.approx([-1.0, 0.1, 1.0])


def test_all_finite_sees_every_non_finite_element():
    good = [torch.ones(3, 4), torch.zeros(5), None]
    assert lean.all_finite(good)
    for bad in (float("nan"), float("inf"), -float("inf")):
        grads = [torch.ones(3, 4), torch.zeros(5)]
        grads[1][2] = bad
        assert not lean.all_finite(grads)
    assert lean.all_finite([])


def test_non_finite_gradients_take_rllibs_path(caplog):
    """A nan gradient: RLlib's apply_gradients runs (its warning, nan_to_num)."""
    learner = _learner(_config(PPOConfig, "CartPole-v1"))
    params = list(learner.module["default_policy"].parameters())
    grads = {learner.get_param_ref(p): torch.zeros_like(p) for p in params}
    first = next(iter(grads))
    grads[first][...] = float("nan")
    with caplog.at_level(logging.WARNING):
        learner.apply_gradients(grads)
    assert any("nan/inf" in r.getMessage() for r in caplog.records)
    assert all(torch.isfinite(p.grad).all() for p in params)  # RLlib's nan_to_num
