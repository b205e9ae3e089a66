"""Real RLlib runs: shared masked policy on SMAX 3m and on the StarCraft II path (stand-in)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

import rllib_ext
from rllib_ext.envs import register_envs
from rllib_ext.envs.smac import SMAC_METRIC_KEYS, SMACEnv, SMACMetricsCallback
from rllib_ext.envs.smac.callbacks import SC2_RESTARTS, WIN_RATE
from rllib_ext.modules import MaskedPPOTorchRLModule, smac_module_spec
from rllib_ext.testing import BackendSpy
from tests.envs.fake_sc2 import FakeFaults, FakeStarCraft2Env

pytestmark = pytest.mark.usefixtures("ray_session")


def _config(env, env_config, *, central_critic=False):
    register_envs()
    return (
        rllib_ext.PPOConfig()
        .environment(env, env_config=env_config)
        .multi_agent(
            policies={"shared_policy"},
            policy_mapping_fn=lambda agent_id, *args, **kwargs: "shared_policy",
        )
        .rl_module(
            rl_module_spec=smac_module_spec(central_critic=central_critic),
            model_config={"fcnet_hiddens": [32, 32]},
        )
        .callbacks(SMACMetricsCallback)
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=300, minibatch_size=100, num_epochs=2)
        .debugging(seed=0)
    )


def _drive(module, env, steps, seed=0):
    """Samples actions from the module's exploration distribution for ``steps`` env steps."""
    obs, _ = env.reset(seed=seed)
    agents = env.possible_agents
    dist_cls = module.get_exploration_action_dist_cls()
    for _ in range(steps):
        batch = {
            Columns.OBS: {
                key: torch.as_tensor(np.stack([obs[a][key] for a in agents]))
                for key in obs[agents[0]]
            }
        }
        with torch.no_grad():
            logits = module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS]
        actions = dist_cls.from_logits(logits).sample().numpy()
        obs, _, terminateds, truncateds, _ = env.step(
            dict(zip(agents, actions.tolist(), strict=True))
        )
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()


def test_smax_3m_shared_masked_policy_reports_win_rate_and_obeys_masks():
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    algo = _config("smax", {"map_name": "3m", "seed": 0}).build_algo()
    try:
        result = algo.train()
        env_runners = result["env_runners"]
        assert WIN_RATE in env_runners and 0.0 <= env_runners[WIN_RATE] <= 1.0
        assert set(SMAC_METRIC_KEYS) - {SC2_RESTARTS, WIN_RATE} <= set(env_runners)
        assert "shared_policy" in result["learners"]
        module = algo.get_module("shared_policy")
        assert isinstance(module, MaskedPPOTorchRLModule)
        # The partly trained policy drives the game: the spy fails on any illegal action.
        env = SMACEnv({"map_name": "3m", "backend": "smax"})
        spy = BackendSpy.install(env, record=False)
        _drive(module, env, 2000)
        assert spy.steps == 2000
    finally:
        algo.stop()


def test_sc2_path_with_central_critic_counts_restarts():
    faults = FakeFaults(crash_at_steps={40}, raise_at_steps={150})
    env_config = {
        "map_name": "3m",
        "backend": "smacv2",
        "game_factory": partial(FakeStarCraft2Env, faults=faults),
    }
    algo = _config("smac_v2", env_config, central_critic=True).build_algo()
    try:
        result = algo.train()
        env_runners = result["env_runners"]
        assert set(SMAC_METRIC_KEYS) <= set(env_runners)
        assert env_runners[SC2_RESTARTS] >= 1
        module = algo.get_module("shared_policy")
        assert module.central_critic
    finally:
        algo.stop()


def test_stock_ppo_config_refuses_learner_only_options_at_the_first_update():
    """RLlib's own PPOConfig (nothing of rllib_ext validates it) with the masked module and
    death_masking on: RLlib's PPOTorchLearner would train as if it were off; the first update
    raises instead, naming the option and the fix."""
    pytest.importorskip("jaxmarl", reason='needs jaxmarl: pip install "rllib-ext[smax]"')
    from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig

    register_envs()
    config = (
        StockPPOConfig()
        .environment("smax", env_config={"map_name": "3m", "seed": 0})
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda agent_id, *a, **kw: "p")
        .rl_module(
            rl_module_spec=smac_module_spec(
                policy_ids=["p"], model_config={"fcnet_hiddens": [16], "death_masking": True}
            )
        )
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        with pytest.raises(ValueError, match=r"death_masking=True .*PPOExtTorchLearner.*Fix"):
            algo.train()
    finally:
        algo.stop()
