"""``optimizers="actor_critic"``: a policy and a critic optimizer per module, clipped apart.

The split covers every parameter once (critic = the module's ``critic_attributes()`` or else its
non-inference attributes); without
clipping it is the same update as RLlib's one Adam (Adam is element-wise); with ``grad_clip``
each group's pre-clip norm is its own part of the module's norm; the results carry both
optimizers' norms and learning rates; a module that names no critic is refused at build, and
a checkpoint of the other layout at restore.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rllib_ext import PPOConfig
from rllib_ext.learners.optimizer_groups import optimizer_groups
from tests.learners.test_lean_update import _config, _episodes, _flat, _learner, _update
from tests.modules.test_masked_recurrent import build as build_recurrent

MID = "default_policy"


def _names(module, params):
    by_id = {id(p): name for name, p in module.named_parameters()}
    return sorted(by_id[id(p)] for p in params)


@pytest.mark.parametrize("shared", [False, True], ids=["separate-towers", "vf-share-layers"])
def test_default_ppo_module_split_covers_every_parameter_once(shared):
    config = _config(PPOConfig, "CartPole-v1", optimizers="actor_critic").rl_module(
        model_config={"fcnet_hiddens": [32, 32], "vf_share_layers": shared}
    )
    learner = _learner(config)
    module = learner.module[MID]
    groups = dict(
        (name, _names(module, optim.param_groups[0]["params"]))
        for name, optim in learner.get_optimizers_for_module(MID)
    )
    assert sorted(groups) == ["critic", "policy"]
    critic_prefixes = ("vf.",) if shared else ("vf.", "encoder.critic_encoder.")
    assert groups["critic"] and all(n.startswith(critic_prefixes) for n in groups["critic"])
    assert not any(n.startswith(critic_prefixes) for n in groups["policy"])
    assert sorted(groups["critic"] + groups["policy"]) == sorted(
        n for n, p in module.named_parameters() if p.requires_grad
    )


@pytest.mark.parametrize("critic_recurrent", [False, True])
def test_recurrent_central_critic_split(critic_recurrent):
    """A recurrent critic's encoder and cell stay on env runners (not non-inference attributes)
    and still step with the critic's optimizer (the module's ``critic_attributes()``)."""
    module = build_recurrent(
        central_critic=True, head_fcnet_hiddens=[8], critic_recurrent=critic_recurrent
    )
    groups = dict(optimizer_groups(MID, module, list(module.parameters()), "actor_critic"))
    critic = _names(module, groups["critic"])
    expected = {"central_critic_encoder", "vf_head", "vf", *(["critic_rnn"] * critic_recurrent)}
    assert {n.split(".")[0] for n in critic} == expected
    assert {n.split(".")[0] for n in _names(module, groups["policy"])} == {
        "encoder",
        "rnn",
        "pi_head",
        "pi",
    }


def test_a_wrapped_module_is_split_as_the_module_itself():
    """RLlib's DDP wrapper hides the module's attributes; the split reads the module under it."""
    module = build_recurrent(central_critic=True, critic_recurrent=True)

    class Wrapper(torch.nn.Module):  # what RLlib's TorchDDPRLModule offers: unwrapped()
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def unwrapped(self):
            return self.inner

    plain = optimizer_groups(MID, module, list(module.parameters()), "actor_critic")
    wrapped = optimizer_groups(MID, Wrapper(module), list(module.parameters()), "actor_critic")
    assert [(name, [id(p) for p in group]) for name, group in wrapped] == [
        (name, [id(p) for p in group]) for name, group in plain
    ]


def test_module_layout_is_rllibs_one_optimizer():
    module = build_recurrent(central_critic=True)
    params = list(module.parameters())
    ((name, group),) = optimizer_groups(MID, module, params, "module")
    assert name == "default_optimizer" and group == params


def test_module_without_a_named_critic_is_refused():
    plain = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"'p0'.*InferenceOnlyAPI.*optimizers='module'"):
        optimizer_groups("p0", plain, list(plain.parameters()), "actor_critic")


def _pair(**training):
    """A CartPole learner with ``optimizers="actor_critic"``, one with RLlib's single optimizer
    from the same weights, and those weights."""
    split = _learner(_config(PPOConfig, "CartPole-v1", optimizers="actor_critic", **training))
    weights = split.module[MID].get_state()
    one = _learner(_config(PPOConfig, "CartPole-v1", optimizers="module", **training), weights)
    return split, one, weights


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "rllib-step"])
def test_without_clipping_the_split_is_the_same_update(lean):
    """Adam is element-wise: two Adams with one lr over a partition of the parameters make the
    same update as one Adam over all of them, so only the clipping can tell them apart."""
    episodes = _episodes("CartPole-v1")
    split, one, weights = _pair(lean_update=lean, grad_clip=None)
    for _ in range(2):
        ours = dict(_flat(_update(split, episodes)))
        _update(one, episodes)
    assert f"{MID}/policy_learning_rate" in ours and f"{MID}/critic_learning_rate" in ours
    moved = 0.0
    for name, value in one.module[MID].state_dict().items():
        torch.testing.assert_close(
            split.module[MID].state_dict()[name], value, rtol=1e-5, atol=1e-6
        )
        moved = max(moved, float((value - weights[name]).abs().max()))
    assert moved > 1e-3


def test_each_group_is_clipped_by_its_own_norm():
    """One minibatch, same weights and episodes: the policy's and critic's pre-clip norms are the
    two parts of the module's norm, and clipping them apart gives other weights."""
    episodes = _episodes("CartPole-v1")
    split, one, _ = _pair(grad_clip=0.01, minibatch_size=400, num_epochs=1)

    def one_step(lrn):
        return dict(
            _flat(
                lrn.update(
                    episodes=copy.deepcopy(episodes),
                    timesteps={"num_env_steps_sampled_lifetime": 400},
                    num_epochs=1,
                    minibatch_size=400,
                    shuffle_batch_per_epoch=False,
                )
            )
        )

    ours, theirs = one_step(split), one_step(one)
    policy = float(ours[f"{MID}/gradients_policy_global_norm"])
    critic = float(ours[f"{MID}/gradients_critic_global_norm"])
    total = float(theirs[f"{MID}/gradients_default_optimizer_global_norm"])
    assert policy > 0.01 and critic > 0.01  # both groups were clipped
    assert math.hypot(policy, critic) == pytest.approx(total, rel=1e-4)
    # Adam's first step is scale-free, so compare after a second minibatch step.
    one_step(split), one_step(one)
    differs = max(
        float((split.module[MID].state_dict()[n] - v).abs().max())
        for n, v in one.module[MID].state_dict().items()
    )
    assert differs > 1e-6


def test_bad_value_names_the_choices():
    with pytest.raises(ValueError, match=r"optimizers.*'module'.*'actor_critic'"):
        PPOConfig().training(optimizers="per_layer")


@pytest.mark.parametrize(
    ("saved", "restored"), [("module", "actor_critic"), ("actor_critic", "module")]
)
def test_restoring_the_other_layout_is_refused_and_the_same_layout_restores(saved, restored):
    """RLlib would register a saved optimizer name this learner lacks as one more optimizer (each
    parameter stepped twice); the learner refuses it, naming both layouts, before any change."""
    source = _learner(_config(PPOConfig, "CartPole-v1", optimizers=saved))
    state = source.get_state(components="optimizer")
    target = _learner(_config(PPOConfig, "CartPole-v1", optimizers=restored))
    before = [name for name, _ in target.get_optimizers_for_module(MID)]
    with pytest.raises(ValueError, match=rf"optimizers={restored!r}.*Fix: restore with"):
        target.set_state(state)
    assert [name for name, _ in target.get_optimizers_for_module(MID)] == before
    twin = _learner(_config(PPOConfig, "CartPole-v1", optimizers=saved))
    twin.set_state(state)
    assert [name for name, _ in twin.get_optimizers_for_module(MID)] == [
        name for name, _ in source.get_optimizers_for_module(MID)
    ]
