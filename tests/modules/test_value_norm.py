"""Value normalization: the statistics, the module's two views of its value head, GAE's view."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.evaluation.postprocessing import Postprocessing

from rllib_ext.connectors.gae import CompiledGAE
from rllib_ext.connectors.value_norm import UpdateValueNorm
from rllib_ext.modules import MaskedPPOTorchRLModule
from rllib_ext.modules.value_norm import ValueNorm

N_ACTIONS, OBS_DIM, STATE_DIM = 6, 5, 7


def obs_space():
    return gym.spaces.Dict(
        {
            "observations": gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32),
            "state": gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
        }
    )


def build(*, inference_only=False, central_critic=False, **options):
    return RLModuleSpec(
        module_class=MaskedPPOTorchRLModule,
        observation_space=obs_space(),
        action_space=gym.spaces.Discrete(N_ACTIONS),
        inference_only=inference_only,
        model_config={"fcnet_hiddens": [16], "central_critic": central_critic, **options},
    ).build()


def batch(n=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        Columns.OBS: {
            "observations": torch.randn(n, OBS_DIM, generator=gen),
            "action_mask": torch.ones(n, N_ACTIONS),
            "state": torch.randn(n, STATE_DIM, generator=gen),
        }
    }


def test_identity_before_the_first_update():
    norm = ValueNorm()
    x = torch.tensor([1.5, -2.0, 30.0])
    torch.testing.assert_close(norm.normalize(x), x)
    torch.testing.assert_close(norm.denormalize(x), x)


def test_debiased_statistics_by_hand():
    norm = ValueNorm(beta=0.5)
    norm.update(torch.tensor([1.0, 3.0]))  # mean 2, mean of squares 5
    norm.update(torch.tensor([10.0]))  # mean 10, mean of squares 100
    # running_mean = 0.5 * (0.5 * 2) + 0.5 * 10 = 5.5; debiasing = 0.75 -> mean 22/3
    # running_mean_sq = 0.5 * (0.5 * 5) + 0.5 * 100 = 51.25 -> 205/3; var = 205/3 - (22/3)^2
    mean, std = norm.mean_std()
    assert mean.item() == pytest.approx(22 / 3)
    assert std.item() == pytest.approx(np.sqrt(205 / 3 - (22 / 3) ** 2))
    x = torch.tensor([0.0, 7.0, -4.0])
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)
    torch.testing.assert_close(norm.normalize(torch.tensor([22 / 3])), torch.tensor([0.0]))


def test_variance_floor_for_constant_targets():
    norm = ValueNorm(beta=0.9)
    norm.update(torch.full((10,), 4.0))
    mean, std = norm.mean_std()
    assert mean.item() == pytest.approx(4.0)
    assert std.item() == pytest.approx(0.1)  # sqrt of MAPPO's floor 1e-2


@pytest.mark.parametrize("central_critic", [False, True])
def test_compute_values_are_denormalized_and_the_loss_view_is_the_head(central_critic):
    module = build(value_norm=True, central_critic=central_critic)
    module.claim_learner_options()  # as PPOExtTorchLearner does; forward_train refuses without
    plain = build(value_norm=False, central_critic=central_critic)
    plain.load_state_dict(
        {k: v for k, v in module.state_dict().items() if not k.startswith("value_norm.")}
    )
    data = batch()
    head = plain.compute_values(data)
    torch.testing.assert_close(module.compute_values(data), head)  # identity so far
    module.value_norm.update(torch.tensor([10.0, 14.0, 6.0, 10.0]))  # mean 10, std 2*sqrt(2)
    mean, std = (t.float() for t in module.value_norm.mean_std())
    torch.testing.assert_close(module.compute_values(data), head * std + mean)
    with module.normalized_values():
        torch.testing.assert_close(module.compute_values(data), head)
        out = module.forward_train(data)
        torch.testing.assert_close(module.compute_values(data, out[Columns.EMBEDDINGS]), head)
    # Gradients reach the head through the de-normalized output.
    module.compute_values(data).sum().backward()
    assert all(p.grad is not None for p in module.vf.parameters())


def test_statistics_are_module_state_but_not_inference_state():
    module = build(value_norm=True)
    module.value_norm.update(torch.tensor([3.0, 5.0]))
    state = module.get_state()
    assert {"value_norm.running_mean", "value_norm.debiasing_term"} <= set(state)
    other = build(value_norm=True)
    other.set_state(state)
    torch.testing.assert_close(other.value_norm.mean_std(), module.value_norm.mean_std())
    runner = build(value_norm=True, inference_only=True)
    assert getattr(runner, "value_norm", None) is None
    inference_state = module.get_state(inference_only=True)
    assert not any(k.startswith("value_norm.") for k in inference_state)
    runner.set_state(inference_state)


def test_bad_options_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"value_norm'\]='yes'; allowed: True, False"):
        build(value_norm="yes")
    with pytest.raises(ValueError, match=r"value_norm_beta'\]=1.5; allowed: a float in \(0, 1\)"):
        build(value_norm=True, value_norm_beta=1.5)
    with pytest.raises(ValueError, match=r"death_masking'\]=1; allowed: True, False"):
        build(death_masking=1)
    # The feed-forward module would ignore a recurrent cell: it says so instead.
    with pytest.raises(ValueError, match=r"recurrent_cell'\]='gru'.*smac_module_spec"):
        build(recurrent_cell="gru")


@pytest.mark.parametrize("option", ["value_norm", "death_masking"])
def test_learner_only_options_with_a_learner_that_ignores_them_raise(option):
    """Only rllib_ext's learner installs the value-norm / death-mask connector pieces."""
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

    import rllib_ext
    from rllib_ext.envs import register_envs
    from rllib_ext.modules import smac_module_spec

    register_envs()
    config = (
        rllib_ext.PPOConfig()
        .environment("smax", env_config={"map_name": "3m"})
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda *a, **k: "p")
        .rl_module(rl_module_spec=smac_module_spec(policy_ids=["p"], model_config={option: True}))
    )
    config.validate()  # rllib_ext's learner: fine
    config.learners(learner_class=PPOTorchLearner)
    with pytest.raises(ValueError, match=rf"{option}=True .*learner_class=PPOTorchLearner.*Fix"):
        config.validate()


def test_the_learner_declares_that_it_applies_the_options():
    """The config check reads the class marker (no learner import): ours and subclasses carry it."""
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

    from rllib_ext.learners.ppo import PPOExtTorchLearner
    from rllib_ext.modules.learner_options import APPLIES_LEARNER_OPTIONS, applies_learner_options

    class Subclass(PPOExtTorchLearner):
        pass

    assert getattr(PPOExtTorchLearner, APPLIES_LEARNER_OPTIONS) is True
    assert applies_learner_options(PPOExtTorchLearner) and applies_learner_options(Subclass)
    assert not applies_learner_options(PPOTorchLearner)
    assert not applies_learner_options("PPOExtTorchLearner")  # a name is no learner class


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"value_norm": True}, "value_norm=True"),
        ({"death_masking": True}, "death_masking=True"),
        ({"value_norm": True, "death_masking": True}, "death_masking=True, value_norm=True"),
    ],
)
def test_forward_train_refuses_options_no_learner_claimed(options, named):
    """Off the rllib_ext config (RLlib's own PPOConfig + PPOTorchLearner) nothing validates the
    learner before training; the module itself refuses the train pass."""
    module = build(**options)
    module.forward_exploration(batch())  # sampling never needs the learner
    with pytest.raises(ValueError, match=rf"model_config {named} .*not a PPOExtTorchLearner.*Fix"):
        module.forward_train(batch())
    module.claim_learner_options()
    assert module.forward_train(batch())[Columns.ACTION_DIST_INPUTS].shape == (32, N_ACTIONS)
    # Without the options nothing needs claiming.
    assert build().forward_train(batch())[Columns.ACTION_DIST_INPUTS].shape == (32, N_ACTIONS)


def _constant_value_module(*, raw: float, mean: float, std: float) -> MaskedPPOTorchRLModule:
    """A module whose head outputs ``raw`` everywhere, with statistics (mean, std)."""
    module = build(value_norm=True)
    with torch.no_grad():
        for p in module.vf.parameters():
            p.zero_()
        last = [m for m in module.vf.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.bias.fill_(raw)
        norm = module.value_norm
        norm.running_mean.fill_(mean)
        norm.running_mean_sq.fill_(std**2 + mean**2)
        norm.debiasing_term.fill_(1.0)
    return module


def test_gae_sees_denormalized_values_by_hand():
    """One chunk: two real steps (the second truncated) and RLlib's bootstrap row."""
    module = _constant_value_module(raw=0.5, mean=10.0, std=2.0)  # every V = 0.5 * 2 + 10 = 11
    multi = MultiRLModule(rl_module_specs={})
    multi.add_module("p", module)
    module_batch = {
        **batch(3),
        Columns.REWARDS: torch.tensor([1.0, 2.0, 0.0]),
        Columns.TERMINATEDS: torch.tensor([False, False, False]),
        Columns.TRUNCATEDS: torch.tensor([False, True, False]),
        Columns.LOSS_MASK: torch.tensor([True, True, False]),
    }
    gae = CompiledGAE(gamma=0.9, lambda_=0.95, standardize_advantages="none")
    out = gae(rl_module=multi, episodes=[], batch={"p": module_batch})["p"]
    # t=1 truncated: target = r1 + gamma * V(bootstrap) = 2 + 0.9 * 11 = 11.9
    # t=0: delta = 1 + 0.9 * 11 - 11 = -0.1; A0 = -0.1 + 0.9 * 0.95 * 0.9 = 0.6695
    targets = out[Postprocessing.VALUE_TARGETS]
    torch.testing.assert_close(targets[:2], torch.tensor([11.6695, 11.9]))
    torch.testing.assert_close(out[Postprocessing.ADVANTAGES][:2], torch.tensor([0.6695, 0.9]))
    # The statistics then move once, from the rows in the loss only.
    before = module.value_norm.running_mean.clone()
    UpdateValueNorm()(rl_module=multi, episodes=[], batch={"p": out})
    beta = module.value_norm.beta
    expected = beta * before + (1 - beta) * (11.6695 + 11.9) / 2
    torch.testing.assert_close(module.value_norm.running_mean, expected, rtol=1e-6, atol=0)
