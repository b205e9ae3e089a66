"""``compile_update=True`` against the eager update step.

:func:`ppo_loss` equals RLlib's ``compute_loss_for_module`` on a masked minibatch (loss and
logged statistics); a whole update with the compiled forward and loss lands on the eager
update's weights, Adam state and result metrics within fp32 rounding, over discrete and
continuous actions, clip modes, KL, schedules and shared layers; where the compiled step cannot
run, RLlib's eager step does, with one warning and ``rllib_ext/compiled_update`` 0.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.columns import Columns

from rllib_ext import _rllib_private as private
from rllib_ext.learners.compiled_loss import COMPILED_UPDATE_KEY, EagerUpdate, ppo_loss
from tests.learners.test_lean_update import (
    _TIMED,
    PPOConfig,
    _config,
    _episodes,
    _flat,
    _learner,
    _update,
)

_MODULE = "default_policy"


def _train_batch(learner, episodes) -> dict:
    """The module's train batch as RLlib's update gets it (the learner connector's output)."""
    batch = private.learner_connector(learner)(
        rl_module=learner.module,
        batch={},
        episodes=copy.deepcopy(episodes),
        shared_data={},
        metrics=learner.metrics,
    )
    return {key: torch.as_tensor(np.asarray(value)) for key, value in batch[_MODULE].items()}


@pytest.mark.parametrize(
    ("env", "training"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"use_kl_loss": True, "kl_coeff": 0.3, "entropy_coeff": 0.02}),
        ("Pendulum-v1", {"use_critic": False}),
    ],
    ids=["discrete", "kl-entropy", "continuous-no-critic"],
)
def test_ppo_loss_equals_rllibs_loss_on_a_masked_minibatch(env, training):
    learner = _learner(_config(PPOConfig, env, **training))
    batch = _train_batch(learner, _episodes(env))
    mask = batch[Columns.LOSS_MASK]
    assert mask.dtype == torch.bool and not bool(mask.all())  # the masking is exercised
    module = learner.module[_MODULE].unwrapped()
    config = learner.config.get_config_for_module(_MODULE)
    theirs = learner.compute_loss_for_module(
        module_id=_MODULE, config=config, batch=batch, fwd_out=module.forward_train(batch)
    )
    logged = learner.metrics.peek(_MODULE)
    ours, stats = ppo_loss(
        module,
        config,
        batch,
        torch.as_tensor(learner.entropy_coeff_schedulers_per_module[_MODULE].get_current_value()),
        torch.as_tensor(learner.curr_kl_coeffs_per_module[_MODULE]),
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert set(stats) <= set(logged)
    for key, value in stats.items():
        assert float(value.detach()) == pytest.approx(
            float(torch.as_tensor(logged[key]).detach()), rel=1e-5, abs=1e-6
        ), key


@pytest.mark.parametrize(
    ("env", "training", "module"),
    [
        ("CartPole-v1", {}, {}),
        (
            "CartPole-v1",
            {
                "grad_clip_by": "norm",
                "use_kl_loss": True,
                "kl_coeff": 0.3,
                "lr": [[0, 1e-3], [800, 1e-4]],
                "entropy_coeff": [[0, 0.05], [800, 0.0]],
            },
            {},
        ),
        ("Pendulum-v1", {"entropy_coeff": 0.01}, {"vf_share_layers": True}),
    ],
    ids=["discrete", "kl-norm-clip-schedules", "continuous-shared-layers"],
)
def test_compiled_update_equals_the_eager_update(env, training, module):
    """Two updates (the second after the schedules and the KL coefficient moved): the same
    weights, Adam moments and result metrics as the eager step, and no recompile."""

    def config(compiled: bool):
        return _config(PPOConfig, env, compile_update=compiled, **training).rl_module(
            model_config={"fcnet_hiddens": [32, 32], **module}
        )

    episodes = _episodes(env)
    compiled = _learner(config(True))
    weights = compiled.module[_MODULE].get_state()
    eager = _learner(config(False), weights)
    torch._dynamo.reset()  # test-only: count this learner's graphs alone
    torch._dynamo.utils.counters.clear()
    graphs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerUpdate)
        for _ in range(2):
            ours = dict(_flat(_update(compiled, episodes)))
            theirs = dict(_flat(_update(eager, episodes)))
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert ours.pop(f"{ALL_MODULES}/{COMPILED_UPDATE_KEY}") == 1.0
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        if any(t in key for t in _TIMED) or isinstance(value, str):
            continue
        assert float(ours[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-5, nan_ok=True), key
    moved = 0.0
    for name, value in eager.module[_MODULE].state_dict().items():
        torch.testing.assert_close(
            compiled.module[_MODULE].state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name
        )
        moved = max(moved, float((value - weights[name]).abs().max()))
    assert moved > 1e-3
    (_, ours_optim), *_ = compiled.get_optimizers_for_module(_MODULE)
    (_, their_optim), *_ = eager.get_optimizers_for_module(_MODULE)
    for p_ours, p_theirs in zip(
        ours_optim.param_groups[0]["params"], their_optim.param_groups[0]["params"], strict=True
    ):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                ours_optim.state[p_ours][key],
                their_optim.state[p_theirs][key],
                rtol=1e-4,
                atol=1e-6,
            )
    # One graph for every minibatch of both updates: the second update's new lr, entropy and
    # KL coefficients are inputs, not constants.
    assert graphs == [1, 1], graphs


def test_outside_its_scope_the_eager_step_runs_with_one_warning():
    config = _config(PPOConfig, "CartPole-v1", compile_update=True, amp="bf16")
    with pytest.warns(EagerUpdate, match=r"amp='bf16'"):
        learner = _learner(config)
    episodes = _episodes("CartPole-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerUpdate)  # not again per update
        results = dict(_flat(_update(learner, episodes)))
    assert results[f"{ALL_MODULES}/{COMPILED_UPDATE_KEY}"] == 0.0


def test_a_failed_compile_hands_the_minibatch_to_the_eager_step():
    """A trace that fails (here: a stand-in raising as dynamo does) runs nothing: the update
    equals the eager one, warns once and reports 0."""
    episodes = _episodes("CartPole-v1")
    learner = _learner(_config(PPOConfig, "CartPole-v1", compile_update=True))
    weights = learner.module[_MODULE].get_state()
    eager = _learner(_config(PPOConfig, "CartPole-v1"), weights)

    def fails(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("a stand-in for an untraceable module")

    learner.compiled_loss._compiled = fails
    with pytest.warns(EagerUpdate, match="torch.compile failed .*Unsupported"):
        results = dict(_flat(_update(learner, episodes)))
    _update(eager, episodes)
    assert results[f"{ALL_MODULES}/{COMPILED_UPDATE_KEY}"] == 0.0
    for name, value in eager.module[_MODULE].state_dict().items():
        torch.testing.assert_close(learner.module[_MODULE].state_dict()[name], value)


def test_a_minibatch_it_cannot_take_runs_eagerly_with_a_warning():
    learner = _learner(_config(PPOConfig, "CartPole-v1", compile_update=True))
    float_mask = {_MODULE: {Columns.LOSS_MASK: torch.ones(4)}}
    with pytest.warns(EagerUpdate, match="loss mask is torch.float32, not torch.bool"):
        assert learner.compiled_loss.losses(float_mask) is None
    assert learner.metrics.peek((ALL_MODULES, COMPILED_UPDATE_KEY)) == 0.0
    two_modules = {"a": {}, "b": {}}
    with pytest.warns(EagerUpdate, match="a minibatch for 2 modules"):
        assert learner.compiled_loss.losses(two_modules) is None
