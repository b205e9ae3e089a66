"""MaskedPPOTorchRLModule: masking, the central critic, inference-only builds, the spec."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_ext.modules import MaskedPPOTorchRLModule, smac_module_spec

N_ACTIONS, OBS_DIM, STATE_DIM = 6, 5, 7


def obs_space(with_state=True):
    spaces = {
        "observations": gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
        "action_mask": gym.spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32),
    }
    if with_state:
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
    return gym.spaces.Dict(spaces)


def build(central_critic=False, inference_only=False, with_state=True, **model_config):
    return RLModuleSpec(
        module_class=MaskedPPOTorchRLModule,
        observation_space=obs_space(with_state),
        action_space=gym.spaces.Discrete(N_ACTIONS),
        inference_only=inference_only,
        model_config={"fcnet_hiddens": [16, 16], "central_critic": central_critic, **model_config},
    ).build()


def batch(n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, N_ACTIONS, generator=gen) < 0.4).float()
    mask[torch.arange(n), torch.randint(0, N_ACTIONS, (n,), generator=gen)] = 1.0
    return {
        Columns.OBS: {
            "observations": torch.randn(n, OBS_DIM, generator=gen),
            "action_mask": mask,
            "state": torch.randn(n, STATE_DIM, generator=gen),
        }
    }


@pytest.mark.parametrize("central_critic", [False, True])
def test_masked_actions_are_never_sampled(central_critic):
    module = build(central_critic)
    data = batch(512)
    mask = data[Columns.OBS]["action_mask"]
    for forward in (module.forward_exploration, module.forward_inference, module.forward_train):
        logits = forward(data)[Columns.ACTION_DIST_INPUTS]
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        dist = module.get_exploration_action_dist_cls().from_logits(logits)
        actions = torch.stack([dist.sample() for _ in range(20)])
        assert mask.gather(1, actions.T).all(), "a masked action was sampled"
        probs = torch.softmax(logits, -1)
        assert torch.all(probs[mask == 0] == 0)
        assert torch.isfinite(dist.entropy()).all()


def test_forward_and_values_do_not_mutate_the_batch():
    module = build(central_critic=False)
    data = batch()
    module.forward_train(data)
    module.compute_values(data)
    assert set(data[Columns.OBS]) == {"observations", "action_mask", "state"}


def test_without_central_critic_values_read_observations_only():
    module = build(central_critic=False)
    data = batch()
    values = module.compute_values(data)
    other = batch()
    other[Columns.OBS]["state"] = torch.randn(64, STATE_DIM)
    torch.testing.assert_close(module.compute_values(other), values)


def test_central_critic_values_read_the_state_only():
    module = build(central_critic=True)
    assert module.central_critic
    data = batch()
    values = module.compute_values(data)
    assert values.shape == (64,)
    same_state = batch(seed=1)
    same_state[Columns.OBS]["state"] = data[Columns.OBS]["state"]
    torch.testing.assert_close(module.compute_values(same_state), values)
    other_state = batch()
    other_state[Columns.OBS]["state"] = torch.randn(64, STATE_DIM)
    assert not torch.allclose(module.compute_values(other_state), values)
    # PPO's loss path: compute_values(batch, embeddings=forward_train(batch)[EMBEDDINGS]).
    out = module.forward_train(data)
    torch.testing.assert_close(module.compute_values(data, out[Columns.EMBEDDINGS]), values)
    # The observation-based critic encoder is not built (it would never be trained).
    assert not hasattr(module.encoder, "critic_encoder")


def test_inference_only_module_drops_the_critics_and_loads_learner_weights():
    learner_module = build(central_critic=True)
    runner_module = build(central_critic=True, inference_only=True)
    assert not hasattr(runner_module, "central_critic_encoder")
    runner_module.set_state(learner_module.get_state(inference_only=True))
    data = batch()
    torch.testing.assert_close(
        runner_module.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
        learner_module.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
    )


def test_acting_runs_only_the_policy_tower_with_forward_trains_logits():
    """Separate towers (vf_share_layers=False): exploration and inference skip the critic's
    tower, and their logits are forward_train's (which runs both)."""
    module = build(central_critic=False, vf_share_layers=False)
    critic_calls = []
    hook = module.encoder.critic_encoder.register_forward_hook(lambda *args: critic_calls.append(1))
    data = batch()
    acting = [
        module.forward_exploration(data)[Columns.ACTION_DIST_INPUTS],
        module.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
    ]
    assert critic_calls == []
    train_logits = module.forward_train(data)[Columns.ACTION_DIST_INPUTS]
    assert critic_calls == [1]
    hook.remove()
    for logits in acting:
        torch.testing.assert_close(logits, train_logits)


def test_bad_spaces_and_options_raise():
    with pytest.raises(ValueError, match=r"needs a 'state' entry.*include_state"):
        build(central_critic=True, with_state=False)
    with pytest.raises(ValueError, match="observation_space="):
        RLModuleSpec(
            module_class=MaskedPPOTorchRLModule,
            observation_space=gym.spaces.Box(-1, 1, (3,)),
            action_space=gym.spaces.Discrete(2),
        ).build()
    with pytest.raises(ValueError, match=r"central_critic'\]='yes'"):
        RLModuleSpec(
            module_class=MaskedPPOTorchRLModule,
            observation_space=obs_space(),
            action_space=gym.spaces.Discrete(N_ACTIONS),
            model_config={"central_critic": "yes"},
        ).build()
    module = build()
    with pytest.raises(ValueError, match="needs dict observations"):
        module.forward_inference({Columns.OBS: torch.zeros(2, OBS_DIM)})


def test_fp16_autocast_keeps_masked_logits_finite():
    module = build()
    data = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = module.forward_train(data)[Columns.ACTION_DIST_INPUTS]
    assert logits.dtype == torch.float32
    dist = module.get_train_action_dist_cls().from_logits(logits)
    assert torch.isfinite(dist.entropy()).all()


def test_smac_module_spec():
    spec = smac_module_spec(central_critic=True, model_config={"fcnet_hiddens": [32]})
    assert isinstance(spec, MultiRLModuleSpec)
    module_spec = spec.rl_module_specs["shared_policy"]
    assert module_spec.module_class is MaskedPPOTorchRLModule
    assert module_spec.model_config == {"fcnet_hiddens": [32], "central_critic": True}
    assert set(smac_module_spec(policy_ids=["a", "b"]).rl_module_specs) == {"a", "b"}
    with pytest.raises(ValueError, match="policy_ids is empty"):
        smac_module_spec(policy_ids=[])
