"""PPOExtTorchLearner with the masked module's loss options, on hand-built batches.

* death masking: dead agents' rows leave the PPO loss (the rule, exact on both backends'
  mask layouts, and the loss itself);
* value norm: the value loss is computed on normalized values against normalized targets.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.evaluation.postprocessing import Postprocessing

import rllib_ext
from rllib_ext.connectors.death_mask import NO_OP_ACTIONS, DeathMask, dead_rows
from rllib_ext.connectors.gae import CompiledGAE
from rllib_ext.connectors.value_norm import UpdateValueNorm
from rllib_ext.modules import MaskedPPOTorchRLModule

OBS_DIM = 4
SMAC_ACTIONS = 6 + 3  # no-op, stop, 4 moves, 3 enemies
SMAX_ACTIONS = 5 + 3  # 4 moves, stop, 3 enemies
MID = "shared_policy"


# -- the rule ---------------------------------------------------------------------------------


def smac_mask(alive: bool, moves=(1, 1, 1, 1), targets=(0, 0, 0)) -> list[int]:
    """StarCraft2Env.get_avail_agent_actions' layout."""
    if not alive:
        return [1] + [0] * (SMAC_ACTIONS - 1)
    return [0, 1, *moves, *targets]


def smax_mask(alive: bool, targets=(0, 0, 0)) -> list[int]:
    """JaxMARL SMAX.get_avail_actions' layout."""
    if not alive:
        return [0, 0, 0, 0, 1, 0, 0, 0]
    return [1, 1, 1, 1, 1, *targets]


def test_rule_on_every_smac_and_smax_mask_of_a_living_or_dead_unit():
    import itertools

    rows, truth = [], []
    for moves in itertools.product((0, 1), repeat=4):
        for targets in itertools.product((0, 1), repeat=3):
            rows.append(smac_mask(True, moves, targets))
            truth.append(False)
    rows.append(smac_mask(False))
    truth.append(True)
    assert dead_rows(torch.tensor(rows, dtype=torch.float32)).tolist() == truth
    rows, truth = [], []
    for targets in itertools.product((0, 1), repeat=3):
        rows.append(smax_mask(True, targets))
        truth.append(False)
    rows.append(smax_mask(False))
    truth.append(True)
    assert dead_rows(torch.tensor(rows, dtype=torch.float32)).tolist() == truth
    # Zero padding ([B, T, A] of stateful modules) is not "dead".
    assert not dead_rows(torch.zeros(2, 3, SMAX_ACTIONS)).any()


def test_no_op_actions_are_the_backends_no_ops():
    from rllib_ext.envs.smac import SMACEnv
    from tests.envs.fake_sc2 import FakeStarCraft2Env

    sc2 = SMACEnv({"map_name": "3m", "backend": "smacv2", "game_factory": FakeStarCraft2Env})
    assert sc2.env_info["no_op_action"] in NO_OP_ACTIONS
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    smax = SMACEnv({"map_name": "3m", "backend": "smax"})
    assert smax.env_info["no_op_action"] in NO_OP_ACTIONS


@pytest.mark.parametrize("backend", ["smax", "smacv2"])
def test_rule_matches_the_dead_count_in_real_battles(backend):
    """Random legal play: per step, rows the rule calls dead == the env's ``dead_allies``."""
    from rllib_ext.envs.smac import SMACEnv

    env_config = {"map_name": "3m", "backend": backend, "seed": 0}
    if backend == "smax":
        pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    else:
        from tests.envs.fake_sc2 import FakeStarCraft2Env

        env_config["game_factory"] = FakeStarCraft2Env
    env = SMACEnv(env_config)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    seen_dead = 0
    for _ in range(600):
        actions = {
            agent: int(rng.choice(np.flatnonzero(o["action_mask"]))) for agent, o in obs.items()
        }
        obs, _, terminateds, truncateds, infos = env.step(actions)
        masks = torch.tensor(np.stack([o["action_mask"] for o in obs.values()]))
        dead = dead_rows(masks)
        assert int(dead.sum()) == infos["agent_0"]["dead_allies"]
        for agent, is_dead in zip(obs, dead.tolist(), strict=True):
            if is_dead:
                assert not obs[agent]["observations"].any()  # the env's dead-agent contract
        seen_dead += int(dead.sum())
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()
    assert seen_dead > 0, "no agent died: the check above never saw a dead row"


# -- the loss ---------------------------------------------------------------------------------


def learner(gae="compiled", **options):
    obs_space = gym.spaces.Dict(
        {
            "observations": gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (SMAX_ACTIONS,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(SMAX_ACTIONS)
    spec = RLModuleSpec(
        module_class=MaskedPPOTorchRLModule,
        observation_space=obs_space,
        action_space=action_space,
        model_config={"fcnet_hiddens": [16], **options},
    )
    config = (
        rllib_ext.PPOConfig()
        .environment(observation_space=obs_space, action_space=action_space)
        .multi_agent(policies={MID}, policy_mapping_fn=lambda *args, **kwargs: MID)
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={MID: spec}))
        .training(entropy_coeff=0.01, vf_clip_param=1e6, gae=gae)
        .debugging(seed=0)
    )
    built = config.build_learner()
    torch.manual_seed(0)
    return built


def hand_batch(n=40, seed=0):
    """Rows as the learner connector leaves them before GAE/the loss; every 4th agent dead."""
    gen = torch.Generator().manual_seed(seed)
    dead = torch.arange(n) % 4 == 3
    masks = torch.tensor([smax_mask(not d, (1, 0, 1)) for d in dead.tolist()], dtype=torch.float32)
    logits = torch.randn(n, SMAX_ACTIONS, generator=gen)
    logits = torch.where(masks > 0, logits, torch.finfo(torch.float32).min)
    actions = torch.distributions.Categorical(logits=logits).sample()
    return dead, {
        Columns.OBS: {
            "observations": torch.randn(n, OBS_DIM, generator=gen) * (~dead)[:, None],
            "action_mask": masks,
        },
        Columns.ACTIONS: actions,
        Columns.ACTION_DIST_INPUTS: logits,
        Columns.ACTION_LOGP: torch.log_softmax(logits, -1).gather(1, actions[:, None])[:, 0],
        Postprocessing.ADVANTAGES: torch.randn(n, generator=gen),
        Postprocessing.VALUE_TARGETS: torch.randn(n, generator=gen) * 3 + 5,
        Columns.LOSS_MASK: torch.arange(n) % 10 != 9,  # a bootstrap row per chunk of 10
    }


def loss(learner, module_batch):
    masked = DeathMask()(rl_module=learner.module, episodes=[], batch={MID: dict(module_batch)})
    module_batch = masked[MID]
    fwd_out = learner.module[MID].forward_train(module_batch)
    with torch.no_grad():
        return learner.compute_loss_for_module(
            module_id=MID, config=learner.config, batch=module_batch, fwd_out=fwd_out
        )


def rows(module_batch, keep):
    out = {}
    for key, value in module_batch.items():
        out[key] = (
            {k: v[keep] for k, v in value.items()} if isinstance(value, dict) else value[keep]
        )
    return out


def scramble(module_batch, dead, seed=1):
    """Dead rows' data replaced by arbitrary values (still a legal, dead mask)."""
    gen = torch.Generator().manual_seed(seed)
    out = rows(module_batch, slice(None))
    n = int(dead.sum())
    obs = dict(out[Columns.OBS])
    obs["observations"] = obs["observations"].clone()
    obs["observations"][dead] = torch.randn(n, OBS_DIM, generator=gen) * 100
    out[Columns.OBS] = obs
    for key in (Postprocessing.ADVANTAGES, Postprocessing.VALUE_TARGETS, Columns.ACTION_LOGP):
        out[key] = out[key].clone()
        out[key][dead] = torch.randn(n, generator=gen) * 100
    out[Columns.ACTION_DIST_INPUTS] = out[Columns.ACTION_DIST_INPUTS].clone()
    out[Columns.ACTION_DIST_INPUTS][dead] = torch.randn(n, SMAX_ACTIONS, generator=gen) * 10
    return out


def test_dead_rows_do_not_change_the_loss():
    ppo = learner(death_masking=True)
    dead, module_batch = hand_batch()
    assert (dead & module_batch[Columns.LOSS_MASK]).sum() >= 5
    with_dead = loss(ppo, module_batch)
    torch.testing.assert_close(loss(ppo, scramble(module_batch, dead)), with_dead)
    torch.testing.assert_close(loss(ppo, rows(module_batch, ~dead)), with_dead)
    # The caller's mask tensor is left as it was.
    assert module_batch[Columns.LOSS_MASK].sum() == 36


def test_without_death_masking_dead_rows_count():
    ppo = learner(death_masking=False)
    dead, module_batch = hand_batch()
    assert not torch.allclose(loss(ppo, module_batch), loss(ppo, rows(module_batch, ~dead)))
    assert not torch.allclose(loss(ppo, module_batch), loss(ppo, scramble(module_batch, dead)))


def test_pipeline_order_and_off_by_default():
    pieces = [type(p) for p in learner(death_masking=True, value_norm=True)._learner_connector]
    assert pieces[-3:] == [DeathMask, CompiledGAE, UpdateValueNorm]
    pieces = [type(p) for p in learner()._learner_connector]
    assert DeathMask not in pieces and UpdateValueNorm not in pieces
    # RLlib's own GAE piece gets the same neighbours (it also reads compute_values).
    both = learner(gae="rllib", death_masking=True, value_norm=True)
    pieces = [type(p) for p in both._learner_connector]
    assert pieces[-3:] == [DeathMask, GeneralAdvantageEstimation, UpdateValueNorm]


def test_value_loss_is_on_the_normalized_scale():
    ppo = learner(value_norm=True)
    module = ppo.module[MID].unwrapped()
    module.value_norm.update(torch.tensor([0.0, 10.0]))  # mean 5, std 5
    _, module_batch = hand_batch()
    targets = module_batch[Postprocessing.VALUE_TARGETS].clone()
    fwd_out = module.forward_train(module_batch)
    ppo.compute_loss_for_module(
        module_id=MID, config=ppo.config, batch=module_batch, fwd_out=fwd_out
    )
    vf_loss = torch.as_tensor(ppo.metrics.peek((MID, "vf_loss"))).detach()
    with module.normalized_values(), torch.no_grad():
        head = module.compute_values(module_batch)
    mask = module_batch[Columns.LOSS_MASK]
    expected = ((head - (targets - 5.0) / 5.0) ** 2)[mask].mean()
    assert float(vf_loss) == pytest.approx(float(expected), rel=1e-5)
    # The minibatch keeps its targets in return units; the module its de-normalized output.
    torch.testing.assert_close(module_batch[Postprocessing.VALUE_TARGETS], targets)
    with torch.no_grad():
        torch.testing.assert_close(module.compute_values(module_batch), head * 5.0 + 5.0)
