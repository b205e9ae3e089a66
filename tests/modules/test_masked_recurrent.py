"""MaskedRecurrentPPOTorchRLModule: masking, state shapes, recurrence, spec, a real SMAX run."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_ext.modules import (
    MaskedPPOTorchRLModule,
    MaskedRecurrentPPOTorchRLModule,
    masked_module_class,
    smac_module_spec,
)

N_ACTIONS, OBS_DIM, STATE_DIM, CELL = 6, 5, 7, 12
CASES = [("gru", False), ("gru", True), ("lstm", False), ("lstm", True)]


def obs_space(with_state=True):
    spaces = {
        "observations": gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
        "action_mask": gym.spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32),
    }
    if with_state:
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
    return gym.spaces.Dict(spaces)


def build(cell="gru", central_critic=False, inference_only=False, with_state=True, **extra):
    return RLModuleSpec(
        module_class=MaskedRecurrentPPOTorchRLModule,
        observation_space=obs_space(with_state),
        action_space=gym.spaces.Discrete(N_ACTIONS),
        inference_only=inference_only,
        model_config={
            "fcnet_hiddens": [16],
            "lstm_cell_size": CELL,
            "max_seq_len": 4,
            "recurrent_cell": cell,
            "central_critic": central_critic,
            **extra,
        },
    ).build()


def batch(module, b=32, t=5, seed=0):
    """A ``[B, T]`` batch with random masks (one legal action at least) and random state in."""
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, N_ACTIONS, generator=gen) < 0.4).float()
    legal = torch.randint(0, N_ACTIONS, (b, t, 1), generator=gen)
    mask.scatter_(-1, legal, 1.0)
    state_in = {
        k: torch.randn(b, *v.shape, generator=gen) for k, v in module.get_initial_state().items()
    }
    return {
        Columns.OBS: {
            "observations": torch.randn(b, t, OBS_DIM, generator=gen),
            "action_mask": mask,
            "state": torch.randn(b, t, STATE_DIM, generator=gen),
        },
        Columns.STATE_IN: state_in,
    }


@pytest.mark.parametrize(("cell", "central_critic"), CASES)
def test_masked_actions_are_never_sampled_and_shapes_are_right(cell, central_critic):
    module = build(cell, central_critic)
    initial = module.get_initial_state()
    assert module.is_stateful()
    assert set(initial) == ({"h"} if cell == "gru" else {"h", "c"})
    assert all(
        v.shape == (CELL,) and v.dtype == np.float32 and not v.any() for v in initial.values()
    )
    data = batch(module, b=64, t=5)
    mask = data[Columns.OBS]["action_mask"]
    for forward in (module.forward_exploration, module.forward_inference, module.forward_train):
        out = forward(data)
        logits = out[Columns.ACTION_DIST_INPUTS]
        assert logits.shape == (64, 5, N_ACTIONS)
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        assert {k: v.shape for k, v in out[Columns.STATE_OUT].items()} == {
            k: (64, CELL) for k in initial
        }
        dist = module.get_exploration_action_dist_cls().from_logits(logits)
        actions = torch.stack([dist.sample() for _ in range(50)])  # [50, B, T]
        chosen = torch.gather(mask.expand(50, -1, -1, -1), -1, actions.unsqueeze(-1))
        assert (chosen == 1.0).all()
        greedy = logits.argmax(-1, keepdim=True)
        assert (torch.gather(mask, -1, greedy) == 1.0).all()
    values = module.compute_values(data)
    assert values.shape == (64, 5)
    train_out = module.forward_train(data)
    embedded = module.compute_values(data, embeddings=train_out[Columns.EMBEDDINGS])
    torch.testing.assert_close(embedded, values)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_one_sequence_equals_stepping_with_the_carried_state(cell):
    """What the learner computes over T steps equals what an env runner computes step by step
    (T=1, STATE_OUT fed back as STATE_IN); the state really carries information."""
    module = build(cell)
    data = batch(module, b=8, t=6, seed=3)
    whole = module.forward_inference(data)
    state = data[Columns.STATE_IN]
    for t in range(6):
        step = {
            Columns.OBS: {k: v[:, t : t + 1] for k, v in data[Columns.OBS].items()},
            Columns.STATE_IN: state,
        }
        out = module.forward_inference(step)
        torch.testing.assert_close(
            out[Columns.ACTION_DIST_INPUTS][:, 0], whole[Columns.ACTION_DIST_INPUTS][:, t]
        )
        state = out[Columns.STATE_OUT]
    for key, value in state.items():
        torch.testing.assert_close(value, whole[Columns.STATE_OUT][key])
    fresh = dict(data, **{Columns.STATE_IN: {k: torch.zeros_like(v) for k, v in state.items()}})
    assert not torch.allclose(
        module.forward_inference(fresh)[Columns.ACTION_DIST_INPUTS],
        whole[Columns.ACTION_DIST_INPUTS],
    )


def test_central_critic_values_read_the_state_only_and_runners_drop_the_critic():
    module = build(central_critic=True)
    data = batch(module, b=16, t=3)
    values = module.compute_values(data)
    changed = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    changed[Columns.OBS]["observations"] = torch.randn(16, 3, OBS_DIM)
    changed[Columns.STATE_IN] = {"h": torch.randn(16, CELL)}
    torch.testing.assert_close(module.compute_values(changed), values)
    changed[Columns.OBS]["state"] = torch.randn(16, 3, STATE_DIM)
    assert not torch.allclose(module.compute_values(changed), values)

    runner = build(central_critic=True, inference_only=True)
    assert not hasattr(runner, "central_critic_encoder") and not hasattr(runner, "vf")
    runner.set_state(module.get_state(inference_only=True))
    torch.testing.assert_close(
        runner.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
        module.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
    )


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_recurrent_critic_state_is_stepped_by_runners_and_carried_into_training(cell):
    """``critic_recurrent``: env runners keep the critic's encoder and cell (not its head) and
    record its state; values over a sequence split in two, the second half started from the
    state the first recorded, equal the values over the whole sequence; the values read the
    critic's state and the global state, never the agent's observation or the policy's state."""
    module = build(cell, central_critic=True, critic_recurrent=True, head_fcnet_hiddens=[8])
    prefixed = ["h"] if cell == "gru" else ["h", "c"]
    assert set(module.get_initial_state()) == {*prefixed, *("critic_" + k for k in prefixed)}
    assert module.get_non_inference_attributes() == ["vf_head", "vf", "value_norm"]
    runner = build(
        cell,
        central_critic=True,
        critic_recurrent=True,
        head_fcnet_hiddens=[8],
        inference_only=True,
    )
    assert hasattr(runner, "critic_rnn") and hasattr(runner, "central_critic_encoder")
    assert not hasattr(runner, "vf_head") and not hasattr(runner, "vf")
    runner.set_state(module.get_state(inference_only=True))

    data = batch(module, b=8, t=6, seed=5)
    whole = module.forward_train(data)
    values = module.compute_values(data, embeddings=whole[Columns.EMBEDDINGS])
    torch.testing.assert_close(module.compute_values(data), values)
    state = data[Columns.STATE_IN]
    for t in range(3):  # the env runner's steps, T=1
        step = {
            Columns.OBS: {k: v[:, t : t + 1] for k, v in data[Columns.OBS].items()},
            Columns.STATE_IN: state,
        }
        state = runner.forward_exploration(step)[Columns.STATE_OUT]
    second = {
        Columns.OBS: {k: v[:, 3:] for k, v in data[Columns.OBS].items()},
        Columns.STATE_IN: state,
    }
    torch.testing.assert_close(module.compute_values(second), values[:, 3:])
    for key, value in module.forward_train(second)[Columns.STATE_OUT].items():
        torch.testing.assert_close(value, whole[Columns.STATE_OUT][key])

    changed = {Columns.OBS: dict(data[Columns.OBS]), Columns.STATE_IN: dict(state)}
    changed[Columns.OBS]["observations"] = torch.randn(8, 6, OBS_DIM)
    changed[Columns.STATE_IN] = dict(data[Columns.STATE_IN])
    for key in prefixed:
        changed[Columns.STATE_IN][key] = torch.randn(8, CELL)
    torch.testing.assert_close(module.compute_values(changed), values)
    for key in prefixed:  # each of the critic's state tensors enters the values
        moved = dict(changed, **{Columns.STATE_IN: dict(changed[Columns.STATE_IN])})
        moved[Columns.STATE_IN]["critic_" + key] = torch.zeros(8, CELL)
        assert not torch.allclose(module.compute_values(moved), values)
    with pytest.raises(
        ValueError, match=r"no critic state .*\['c', 'h'\]|no critic state .*\['h'\]"
    ):
        module.compute_values(
            {
                Columns.OBS: data[Columns.OBS],
                Columns.STATE_IN: {
                    k: v for k, v in data[Columns.STATE_IN].items() if not k.startswith("critic_")
                },
            }
        )


@pytest.mark.parametrize("saved", [False, True])
def test_weights_of_the_other_critic_recurrent_are_refused(saved):
    """torch's non-strict load would skip a saved critic cell (or leave a new one untrained)
    in silence; the module refuses with the setting to use. Runner syncs still load."""
    source = build(central_critic=True, critic_recurrent=saved, head_fcnet_hiddens=[8])
    target = build(central_critic=True, critic_recurrent=not saved, head_fcnet_hiddens=[8])
    with pytest.raises(ValueError, match=rf"saved with .*critic_recurrent'\]={saved}.*Fix"):
        target.set_state(source.get_state())
    same = build(central_critic=True, critic_recurrent=saved, head_fcnet_hiddens=[8])
    same.set_state(source.get_state())
    runner = build(
        central_critic=True, critic_recurrent=saved, head_fcnet_hiddens=[8], inference_only=True
    )
    runner.set_state(source.get_state(inference_only=True))
    for key, value in runner.state_dict().items():
        torch.testing.assert_close(value, same.state_dict()[key])


@pytest.mark.parametrize("central_critic", [False, True])
def test_head_fcnet_hiddens_adds_a_layer_to_each_head_and_runners_drop_the_value_head(
    central_critic,
):
    """RLlib's ``head_fcnet_hiddens``: GRU -> Dense -> logits and (encoder or GRU) -> Dense ->
    value (JaxMARL's MAPPO layout); without it the parameter names are those of older
    checkpoints (``pi.*``, ``vf.*``)."""
    plain = build(central_critic=central_critic)
    assert {"pi.weight", "vf.weight"} <= set(plain.state_dict())
    assert not [k for k in plain.state_dict() if "_head" in k]

    module = build(
        central_critic=central_critic, head_fcnet_hiddens=[9], head_fcnet_activation="tanh"
    )
    heads = {k: tuple(v.shape) for k, v in module.state_dict().items() if "_head" in k}
    value_in = 16 if central_critic else CELL  # the critic's encoder or the GRU
    assert heads == {
        "pi_head.0.weight": (9, CELL),
        "pi_head.0.bias": (9,),
        "vf_head.0.weight": (9, value_in),
        "vf_head.0.bias": (9,),
    }
    assert isinstance(module.pi_head[1], torch.nn.Tanh)
    assert tuple(module.pi.weight.shape) == (N_ACTIONS, 9)
    data = batch(module, b=8, t=3)
    out = module.forward_train(data)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (8, 3, N_ACTIONS)
    assert module.compute_values(data, embeddings=out[Columns.EMBEDDINGS]).shape == (8, 3)
    with torch.no_grad():  # the value reads the head: changing it changes the values
        before = module.compute_values(data)
        module.vf_head[0].bias.add_(1.0)
        assert not torch.allclose(module.compute_values(data), before)

    runner = build(
        central_critic=central_critic,
        inference_only=True,
        head_fcnet_hiddens=[9],
        head_fcnet_activation="tanh",
    )
    assert not hasattr(runner, "vf_head") and hasattr(runner, "pi_head")
    runner.set_state(module.get_state(inference_only=True))
    torch.testing.assert_close(
        runner.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
        module.forward_inference(data)[Columns.ACTION_DIST_INPUTS],
    )


def test_value_norm_denormalizes_values_and_stays_on_the_learner():
    module = build(value_norm=True, death_masking=True)
    assert module.death_masking and module.value_norm is not None
    data = batch(module, b=8, t=3)
    before = module.compute_values(data)
    module.value_norm.update(torch.tensor([10.0, 30.0]))
    mean, std = module.value_norm.mean_std()
    torch.testing.assert_close(module.compute_values(data), before * float(std) + float(mean))
    with module.normalized_values():
        torch.testing.assert_close(module.compute_values(data), before)
    runner = build(value_norm=True, inference_only=True)
    assert not hasattr(runner, "value_norm") or runner.value_norm is None


def test_bad_model_config_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"recurrent_cell'\]='rnn'.*'gru', 'lstm'"):
        build("rnn")
    with pytest.raises(ValueError, match="drop use_lstm"):
        build(use_lstm=True)
    with pytest.raises(ValueError, match="needs a 'state' entry"):
        build(central_critic=True, with_state=False)
    with pytest.raises(ValueError, match=r"value_norm'\]='yes'"):
        build(value_norm="yes")
    with pytest.raises(ValueError, match=r"max_seq_len'\]=0"):
        build(max_seq_len=0)
    with pytest.raises(ValueError, match=r"critic_recurrent'\]=True needs .*central_critic"):
        build(critic_recurrent=True)
    with pytest.raises(ValueError, match=r"critic_recurrent'\]=1; allowed values: True, False"):
        build(central_critic=True, critic_recurrent=1)
    with pytest.raises(ValueError, match=r"critic_recurrent'\]=True is an option of the recur"):
        RLModuleSpec(
            module_class=MaskedPPOTorchRLModule,
            observation_space=obs_space(),
            action_space=gym.spaces.Discrete(N_ACTIONS),
            model_config={"central_critic": True, "critic_recurrent": True},
        ).build()
    with pytest.raises(ValueError, match="observation_space"):
        RLModuleSpec(
            module_class=MaskedRecurrentPPOTorchRLModule,
            observation_space=gym.spaces.Box(-1, 1, (3,)),
            action_space=gym.spaces.Discrete(2),
        ).build()


def test_spec_and_class_selection():
    assert masked_module_class({}) is MaskedPPOTorchRLModule
    assert masked_module_class({"recurrent_cell": None}) is MaskedPPOTorchRLModule
    assert masked_module_class({"recurrent_cell": "lstm"}) is MaskedRecurrentPPOTorchRLModule
    with pytest.raises(ValueError, match=r"allowed values: None, 'gru', 'lstm'"):
        masked_module_class({"recurrent_cell": "GRU"})
    spec = smac_module_spec(central_critic=True, recurrent_cell="gru")
    module_spec = spec.rl_module_specs["shared_policy"]
    assert module_spec.module_class is MaskedRecurrentPPOTorchRLModule
    assert module_spec.model_config == {"central_critic": True, "recurrent_cell": "gru"}


def _smax_3m_config(*, num_env_runners: int, model: dict, training: dict):
    """rllib_ext's PPO on SMAX 3m, a small GRU module with the central critic, two battles per
    env runner, 128-step train batches; ``model`` / ``training`` add to it."""
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    import rllib_ext

    return (
        rllib_ext.PPOConfig()
        .environment(
            "smax", env_config={"map_name": "3m", "seed": 0, "state_mode": "agent_specific"}
        )
        .rl_module(
            model_config={
                "recurrent_cell": "gru",
                "central_critic": True,
                "fcnet_hiddens": [32],
                "lstm_cell_size": 16,
                "max_seq_len": 8,
                **model,
            }
        )
        .env_runners(
            num_env_runners=num_env_runners, num_envs_per_env_runner=2, rollout_fragment_length=64
        )
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=2, **training)
        .debugging(seed=0)
    )


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_recurrent_module_trains_on_smax_3m_with_one_env_runner():
    """build_algo() + train() x2, recurrent masked module chosen through model_config, one
    remote env runner with two batched SMAX battles (the fused path carries the GRU state)."""
    config = _smax_3m_config(
        num_env_runners=1, model={"value_norm": True, "death_masking": True}, training={}
    )
    algo = config.build_algo()
    try:
        module = algo.get_module("shared_policy")
        assert isinstance(module, MaskedRecurrentPPOTorchRLModule) and module.central_critic
        before = {k: v.detach().clone() for k, v in module.state_dict().items()}
        for _ in range(2):
            result = algo.train()
        after = algo.get_module("shared_policy").state_dict()
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert runners["num_env_steps_sampled_lifetime"] >= 256
    assert runners["rllib_ext/smax_batched_envs"] == 2
    assert (
        runners["rllib_ext/smax_fused_sampling"] == 1.0
    )  # the GRU state carried on the fused path
    learner = result["learners"]["shared_policy"]
    assert np.isfinite(learner["policy_loss"]) and np.isfinite(learner["vf_loss"])
    # The recipe options act on the recurrent module too.
    assert (
        learner["rllib_ext/value_norm/std"] > 0
        and 0.0 <= learner["rllib_ext/death_mask/dead_fraction"] < 1.0
    )
    assert not torch.equal(before["rnn.weight_hh_l0"], after["rnn.weight_hh_l0"])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_recurrent_critic_state_is_recorded_by_the_fused_sampler_and_trained_on_smax_3m():
    """build_algo() + train(), ``critic_recurrent`` with ``optimizers="actor_critic"``: the fused
    SMAX sampler records the critic's state in every step's ``STATE_OUT``, the learner pipeline
    starts each training sequence from a recorded state (or the initial zeros), and the critic's
    cell trains with the critic's optimizer."""
    from rllib_ext import _rllib_private as private

    config = _smax_3m_config(
        num_env_runners=0,
        model={"critic_recurrent": True},
        training={"grad_clip": 0.5, "optimizers": "actor_critic"},
    )
    algo = config.build_algo()
    try:
        module = algo.get_module("shared_policy")
        assert module.critic_recurrent
        before = module.critic_rnn.weight_hh_l0.detach().clone()
        result = algo.train()
        after = algo.get_module("shared_policy").critic_rnn.weight_hh_l0.detach().clone()
        runner = algo.env_runner
        episodes = runner.sample(num_timesteps=96, random_actions=False)
        learner = algo.learner_group._learner
        recorded = torch.from_numpy(  # every state the sampler recorded, lookback included
            np.concatenate(
                [
                    sa.extra_model_outputs[Columns.STATE_OUT].data["critic_h"]
                    for episode in episodes
                    for sa in episode.agent_episodes.values()
                ]
            )
        )
        batch = private.learner_connector(learner)(
            rl_module=learner.module, batch={}, episodes=episodes, metrics=None
        )
    finally:
        algo.stop()
    assert result["env_runners"]["rllib_ext/smax_fused_sampling"] == 1.0
    stats = result["learners"]["shared_policy"]
    assert np.isfinite(stats["vf_loss"]) and stats["gradients_critic_global_norm"] > 0
    assert not torch.equal(before, after)
    assert recorded.abs().sum() > 0
    starts = torch.as_tensor(batch["shared_policy"][Columns.STATE_IN]["critic_h"])
    assert starts.shape[1] == 16 and starts.abs().sum() > 0
    for row in starts:  # each sequence starts from zeros or from a state the sampler recorded
        if row.abs().sum() > 0:
            assert torch.isclose(recorded, row).all(-1).any()


def test_forward_train_refuses_learner_only_options_until_claimed():
    """Only PPOExtTorchLearner applies value_norm / death_masking; it claims the module."""
    module = build(value_norm=True, death_masking=True)
    data = batch(module, b=4, t=3)
    module.forward_exploration(data)
    with pytest.raises(ValueError, match=r"death_masking=True, value_norm=True .*Fix"):
        module.forward_train(data)
    module.claim_learner_options()
    assert module.forward_train(data)[Columns.ACTION_DIST_INPUTS].shape == (4, 3, N_ACTIONS)


def test_orthogonal_init_is_jaxmarls_initialization():
    """``orthogonal_init=True``: orthogonal kernels with JaxMARL's gains (sqrt 2 encoders, 2
    head layers, 0.01 logits, 1 value), zero biases, flax's GRU init; off: torch's default."""
    module = build(central_critic=True, head_fcnet_hiddens=[9], orthogonal_init=True)

    def gain(weight):  # an orthogonal matrix times g has all singular values equal to g
        sv = torch.linalg.svdvals(weight.detach())
        assert torch.allclose(sv, sv[0].expand_as(sv), rtol=1e-4), sv
        return float(sv[0])

    assert gain(module.encoder[0].weight) == pytest.approx(2**0.5, rel=1e-4)
    assert gain(module.central_critic_encoder[0].weight) == pytest.approx(2**0.5, rel=1e-4)
    assert gain(module.pi_head[0].weight) == pytest.approx(2.0, rel=1e-4)
    assert gain(module.vf_head[0].weight) == pytest.approx(2.0, rel=1e-4)
    assert gain(module.pi.weight) == pytest.approx(0.01, rel=1e-4)
    assert gain(module.vf.weight) == pytest.approx(1.0, rel=1e-4)
    for block in module.rnn.weight_hh_l0.split(CELL):  # r, z, n gates
        assert gain(block) == pytest.approx(1.0, rel=1e-4)
    biases = [p for n, p in module.named_parameters() if "bias" in n and "value_norm" not in n]
    assert biases and all(float(b.detach().abs().max()) == 0.0 for b in biases)
    # Near-uniform initial policy over the legal actions (logits ~0.01 scale).
    logits = module.forward_train(batch(module, b=8, t=3))[Columns.ACTION_DIST_INPUTS]
    legal = logits[logits > -1e30]
    assert float(legal.abs().max()) < 0.1

    plain = build(central_critic=True, head_fcnet_hiddens=[9])
    assert float(plain.pi.bias.abs().max()) > 0.0  # torch's default init

    with pytest.raises(ValueError, match="orthogonal_init"):
        build(orthogonal_init="yes")
    with pytest.raises(ValueError, match="recurrent module"):
        MaskedPPOTorchRLModule(
            observation_space=obs_space(),
            action_space=gym.spaces.Discrete(N_ACTIONS),
            model_config={"orthogonal_init": True},
        )
