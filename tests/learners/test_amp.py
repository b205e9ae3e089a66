"""AMP learner on CPU: loss scaling, skipped steps, clipping semantics, checkpoints."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns

import rllib_ext
from rllib_ext import compat
from rllib_ext.amp_choice import cpu_has_native_bf16, resolve_amp_dtype

pytestmark = pytest.mark.usefixtures("ray_session")

MID = DEFAULT_MODULE_ID


def _config(**training):
    return (
        rllib_ext.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .rl_module(model_config={"fcnet_hiddens": [32, 32]})
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1, **training)
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def episodes():
    algo = _config().build_algo()
    try:
        return algo.env_runner.sample(num_timesteps=256)
    finally:
        algo.stop()


def _batch(learner, episodes):
    batch = learner._learner_connector(
        rl_module=learner.module,
        batch={},
        episodes=copy.deepcopy(episodes),
        shared_data={},
        metrics=None,
    )
    return batch


def _step(learner, batch, *, inject_inf: bool = False):
    """One update through the learner's real step (RLlib's ``_uncompiled_update`` calling our
    gradient seams); returns the gradients the optimizer saw (unscaled, clipped)."""
    handles = []
    if inject_inf:
        param = next(iter(learner.module[MID].parameters()))
        handles.append(param.register_hook(lambda g: torch.full_like(g, float("inf"))))
    try:
        learner._uncompiled_update(batch)
    finally:
        for h in handles:
            h.remove()
    return {
        i: p.grad.detach().clone()
        for i, p in enumerate(learner.module[MID].parameters())
        if p.grad is not None
    }


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_covers_forward_and_loss_only(amp, episodes) -> None:
    """RLlib's update step runs under autocast; our gradient seams leave it again, so backward
    and the optimizer step run in fp32 (PyTorch's AMP guidance), as they did without AMP."""
    algo = _config(amp=amp, grad_clip=0.5).build_algo()
    try:
        learner = algo.learner_group._learner
        batch = _batch(learner, episodes)
        seen: dict[str, set[bool]] = {}

        def record(phase: str) -> None:
            seen.setdefault(phase, set()).add(torch.is_autocast_enabled("cpu"))

        linear = next(m for m in learner.module[MID].modules() if isinstance(m, torch.nn.Linear))
        handles = [
            linear.register_forward_pre_hook(lambda *_: record("forward")),
            linear.weight.register_hook(lambda g: record("backward")),
        ]
        for _, optim in learner.get_optimizers_for_module(MID):
            handles.append(optim.register_step_pre_hook(lambda *_: record("optimizer step")))
        try:
            fwd_out, _, _ = learner._uncompiled_update(batch)
        finally:
            for h in handles:
                h.remove()
        assert seen == {"forward": {True}, "backward": {False}, "optimizer step": {False}}
        want = torch.float16 if amp == "fp16" else torch.bfloat16
        assert fwd_out[MID][Columns.ACTION_DIST_INPUTS].dtype == want
        assert not torch.is_autocast_enabled("cpu")  # the region is closed after the step
    finally:
        algo.stop()


def _params(learner):
    return [p.detach().clone() for p in learner.module[MID].parameters()]


def _adam_state(learner):
    optim = next(iter(learner._named_optimizers.values()))
    return copy.deepcopy(optim.state_dict()["state"])


def test_injected_inf_gradient_skips_exactly_that_step(episodes) -> None:
    algo = _config(amp="fp16", amp_init_scale=1024.0).build_algo()
    try:
        learner = algo.learner_group._learner
        batch = _batch(learner, episodes)
        _step(learner, batch)  # a clean step first, so Adam has state to protect
        scale_before = learner.amp.scaler(MID).get_scale()
        params_before, adam_before = _params(learner), _adam_state(learner)

        _step(learner, batch, inject_inf=True)

        assert learner.amp.scaler(MID).get_scale() == scale_before * 0.5
        assert learner.amp.skipped_steps[MID] == 1
        for before, after in zip(params_before, _params(learner), strict=True):
            assert torch.equal(before, after)
        adam_after = _adam_state(learner)
        for idx, state in adam_after.items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(state[key], adam_before[idx][key]), key
                assert torch.isfinite(state[key]).all()

        _step(learner, batch)  # the next clean step updates again
        assert any(
            not torch.equal(a, b) for a, b in zip(params_before, _params(learner), strict=True)
        )
        assert learner.amp.skipped_steps[MID] == 1
    finally:
        algo.stop()


def test_grad_clip_under_fp16_matches_fp32(episodes) -> None:
    """grad_clip=0.5 clips the *unscaled* gradient: same clipped update as fp32.

    Tolerance: the fp16 forward rounds activations to ~3 decimal digits, so clipped gradients
    agree to rtol=2e-2 elementwise and cosine similarity > 0.999.
    """
    grads = {}
    weights = None
    for amp in (False, "fp16"):
        algo = _config(amp=amp, grad_clip=0.5).build_algo()
        try:
            learner = algo.learner_group._learner
            if weights is None:
                weights = copy.deepcopy(learner.module[MID].state_dict())
            learner.module[MID].load_state_dict(weights)
            grads[amp] = _step(learner, _batch(learner, episodes))
        finally:
            algo.stop()
    g32 = torch.cat([g.flatten() for g in grads[False].values()])
    g16 = torch.cat([g.flatten() for g in grads["fp16"].values()])
    assert g32.norm().item() == pytest.approx(0.5, rel=1e-4)  # the raw norm was above 0.5
    assert g16.norm().item() == pytest.approx(0.5, rel=1e-3)
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
    assert cos > 0.999
    np.testing.assert_allclose(g16.numpy(), g32.numpy(), rtol=2e-2, atol=2e-3)


def test_metrics_show_amp_in_training_results() -> None:
    algo = _config(amp="fp16").build_algo()
    try:
        res = algo.train()["learners"][MID]
        assert res["rllib_ext/amp/dtype"] == "float16"
        assert res["rllib_ext/amp/loss_scale"] >= 1024.0
        assert res["rllib_ext/amp/skipped_steps"] == 0
    finally:
        algo.stop()


def test_bf16_metrics_and_master_weights_stay_fp32() -> None:
    algo = _config(amp="bf16").build_algo()
    try:
        res = algo.train()["learners"][MID]
        assert res["rllib_ext/amp/dtype"] == "bfloat16"
        assert "rllib_ext/amp/loss_scale" not in res
        learner = algo.learner_group._learner
        assert all(p.dtype == torch.float32 for p in learner.module[MID].parameters())
    finally:
        algo.stop()


def test_checkpoint_restores_loss_scale(tmp_path) -> None:
    algo = _config(amp="fp16", amp_init_scale=256.0, amp_growth_interval=3).build_algo()
    try:
        algo.train()
        scaler = algo.learner_group._learner.amp.scaler(MID)
        scale, tracker = scaler.get_scale(), scaler.state_dict()["_growth_tracker"]
        assert scale > 256.0  # it grew, so a restore to the init scale would be visible
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        scaler = restored.learner_group._learner.amp.scaler(MID)
        assert scaler.get_scale() == scale
        assert scaler.state_dict()["_growth_tracker"] == tracker
    finally:
        restored.stop()


def test_tutorial_chapter4_config_builds_and_trains() -> None:
    cfg = (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .env_runners(num_env_runners=0)
        .training(
            fp16=True,
            fp16_loss_scaling=1024.0,
            lr=3e-4,
            clip_param=0.2,
            gamma=0.99,
            kl_coeff=0.3,
            model={"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"},
            train_batch_size_per_learner=256,
            minibatch_size=128,
            num_epochs=1,
        )
    )
    algo = cfg.build_algo()
    try:
        res = algo.train()["learners"][MID]
        assert res["rllib_ext/amp/dtype"] == "float16"
        module = algo.learner_group._learner.module[MID]
        linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
        assert linears[0].out_features == 256  # model= reached the RLModule
    finally:
        algo.stop()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"amp": "fp8"}, r"amp='fp8'.*False, 'fp16', 'bf16', 'auto'"),
        ({"amp_init_scale": 0}, r"amp_init_scale=0.*> 0"),
        ({"amp_growth_factor": 1.0}, r"amp_growth_factor=1.0.*> 1"),
        ({"amp_backoff_factor": 1.0}, r"amp_backoff_factor=1.0.*\(0, 1\)"),
        ({"amp_backoff_factor": 0}, r"amp_backoff_factor=0.*\(0, 1\)"),
        ({"amp_growth_interval": 0}, r"amp_growth_interval=0.*>= 1"),
    ],
)
def test_bad_amp_input(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        rllib_ext.PPOConfig().training(**kwargs)


def test_amp_with_torch_compile_is_refused() -> None:
    cfg = _config(amp="fp16").framework(torch_compile_learner=True)
    with pytest.raises(ValueError, match="torch_compile_learner"):
        cfg.build_algo()


def test_auto_resolves_per_device() -> None:
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_has_native_bf16() else None
    assert resolve_amp_dtype("auto", cpu) == expected
    assert resolve_amp_dtype(False, cpu) is None
    assert resolve_amp_dtype("fp16", cpu) == torch.float16


def _inject_inf_once(learner) -> None:
    param = next(iter(learner.module[MID].unwrapped().parameters()))
    fired = []

    def hook(grad):
        if fired:
            return grad
        fired.append(True)
        return torch.full_like(grad, float("inf"))

    learner._inf_hook = param.register_hook(hook)


def test_two_learners_take_the_same_overflow_decision() -> None:
    """An inf gradient on rank 0 only: DDP's all-reduce carries it to rank 1, both skip."""
    cfg = _config(amp="fp16", amp_init_scale=1024.0, amp_growth_interval=10_000).learners(
        num_learners=2
    )
    algo = cfg.build_algo()
    try:
        group = algo.learner_group
        group.foreach_learner(
            lambda learner: _inject_inf_once(learner) if learner._learner_index == 0 else None
        )
        algo.train()
        states = group.foreach_learner(
            lambda learner: (
                learner.amp.scaler(MID).get_scale(),
                learner.amp.skipped_steps[MID],
                [p.detach().sum().item() for p in learner.module[MID].parameters()],
            )
        )
        (scale0, skipped0, w0), (scale1, skipped1, w1) = [s.get() for s in states]
        assert scale0 == scale1 == 512.0
        assert skipped0 == skipped1 == 1
        assert w0 == w1
    finally:
        algo.stop()


def test_amp_inference_runs_env_runner_forward_in_bf16_and_keeps_fp32_logp() -> None:
    from rllib_ext.env_runners import AMPSingleAgentEnvRunner

    algo = _config(amp="bf16", amp_inference=True).build_algo()
    try:
        runner = algo.env_runner
        assert isinstance(runner, AMPSingleAgentEnvRunner)  # the fused single-agent runner is one
        assert runner.features.amp.dtype == torch.bfloat16
        seen = []
        linear = next(m for m in runner.module.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        episodes = runner.sample(num_timesteps=32)
        assert seen and all(dt == torch.bfloat16 for dt in seen)
        logp = np.concatenate([e.get_extra_model_outputs("action_logp") for e in episodes])
        assert logp.dtype == np.float32
        assert algo.train()["learners"][MID]["rllib_ext/amp/dtype"] == "bfloat16"
    finally:
        algo.stop()


def test_amp_inference_without_amp_is_an_error() -> None:
    with pytest.raises(ValueError, match="amp_inference=True needs"):
        rllib_ext.PPOConfig().training(amp_inference=True)
