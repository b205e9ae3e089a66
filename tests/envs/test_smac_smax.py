"""SMACEnv on the SMAX backend (JaxMARL): conformance, termination, masks, an oracle check.

Step rate is measured, not asserted: ``python benchmarks/smax_learning.py throughput``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("jaxmarl", reason='SMAX backend needs jaxmarl: pip install "rllib-ext[smax]"')

from pettingzoo.test import parallel_api_test  # noqa: E402
from ray.rllib.utils.pre_checks.env import check_multiagent_environments  # noqa: E402

from rllib_ext.envs.smac import SMACEnv, parallel_env  # noqa: E402
from rllib_ext.testing import BackendSpy, check_masked_multiagent_env, sample_legal  # noqa: E402

MAPS = ["3m", "2s3z", "3s5z_vs_3s6z"]


def smax_env(map_name="3m", **config):
    return SMACEnv({"map_name": map_name, "backend": "smax", **config})


def legal_actions(obs, rng):
    return {agent: int(sample_legal(o["action_mask"], rng)) for agent, o in obs.items()}


@pytest.mark.parametrize(
    ("config", "with_id", "unchanged", "size_key"),
    [
        ({"state_mode": "agent_specific"}, "state", "observations", "state_shape"),
        ({"obs_agent_id": True}, "observations", "state", "obs_shape"),
    ],
)
def test_one_hot_agent_id_is_appended_to_one_entry(config, with_id, unchanged, size_key):
    """``state_mode="agent_specific"`` extends ``"state"``, ``obs_agent_id`` extends
    ``"observations"``: the game's entry followed by agent i's one-hot id, the rest unchanged."""
    plain = smax_env("3m", seed=2)
    specific = smax_env("3m", seed=2, **config)
    space = specific.observation_spaces["agent_0"][with_id]
    assert space.shape == (plain.env_info[size_key] + 3,)
    rng = np.random.default_rng(0)
    obs, _ = plain.reset()
    obs_specific, _ = specific.reset()
    for _ in range(60):
        for i, agent in enumerate(plain.possible_agents):
            assert specific.observation_spaces[agent].contains(obs_specific[agent])
            row = obs_specific[agent][with_id]
            np.testing.assert_array_equal(row[:-3], obs[agent][with_id])
            np.testing.assert_array_equal(row[-3:], np.eye(3, dtype=np.float32)[i])
            np.testing.assert_array_equal(obs_specific[agent][unchanged], obs[agent][unchanged])
        actions = legal_actions(obs, rng)
        obs, _, terminateds, truncateds, _ = plain.step(actions)
        obs_specific = specific.step(actions)[0]
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = plain.reset()
            obs_specific, _ = specific.reset()


def test_pettingzoo_parallel_api_with_agent_ids():
    env = parallel_env(
        map_name="3m", backend="smax", seed=0, state_mode="agent_specific", obs_agent_id=True
    )
    parallel_api_test(env, num_cycles=100)
    obs, _ = env.reset(seed=1)
    np.testing.assert_array_equal(obs["agent_1"]["state"][:-3], env.state())
    np.testing.assert_array_equal(obs["agent_1"]["state"][-3:], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(obs["agent_1"]["observations"][-3:], [0.0, 1.0, 0.0])


def test_sizes_for_3s5z_vs_3s6z():
    info = smax_env("3s5z_vs_3s6z").env_info
    # REFERENCE_NOTES §B: 14 actions, obs 218, world state 204; stop (4) is the no-op.
    assert (info["n_agents"], info["n_enemies"], info["n_actions"]) == (8, 9, 14)
    assert (info["obs_shape"], info["state_shape"], info["no_op_action"]) == (218, 204, 4)


@pytest.mark.parametrize("map_name", MAPS)
def test_pettingzoo_parallel_api(map_name):
    env = parallel_env(map_name=map_name, backend="smax", seed=0)
    parallel_api_test(env, num_cycles=300)


@pytest.mark.parametrize("map_name", ["3m", "3s5z_vs_3s6z"])
def test_rllib_env_checker_and_mask_conformance(map_name):
    env = smax_env(map_name, seed=0)
    check_multiagent_environments(env)
    report = check_masked_multiagent_env(env, num_steps=400, seed=0)
    assert report.illegal_action_rejected and report.episodes >= 1


def test_random_masked_policy_never_sends_illegal_actions():
    env = smax_env("2s3z", seed=1)
    spy = BackendSpy.install(env, record=False)
    rng = np.random.default_rng(0)
    obs, _ = env.reset()
    for _ in range(3000):
        obs, _, terminateds, truncateds, _ = env.step(legal_actions(obs, rng))
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()
    assert spy.steps == 3000


def test_dead_agents_keep_only_stop_and_zero_obs():
    env = smax_env("3m", seed=2)
    rng = np.random.default_rng(1)
    obs, _ = env.reset()
    saw_dead = False
    for _ in range(2000):
        obs, _, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
        assert set(obs) == set(env.possible_agents)
        for agent_obs in obs.values():
            mask = agent_obs["action_mask"]
            if mask[:4].sum() == 0:  # no move legal <=> dead in SMAX
                saw_dead = True
                assert mask.tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
                assert not agent_obs["observations"].any()
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()
    assert saw_dead


def test_time_limit_is_truncated_with_the_true_final_observation():
    env = smax_env("3m", seed=0, smax_options={"max_steps": 3})
    assert env.env_info["episode_limit"] == 4  # SMAX checks the limit before counting a step
    obs, _ = env.reset()
    stop = dict.fromkeys(obs, 4)
    for _ in range(3):
        _, _, terminateds, truncateds, _ = env.step(stop)
        assert not truncateds["__all__"] and not terminateds["__all__"]
    final_obs, _, terminateds, truncateds, infos = env.step(stop)
    assert truncateds["__all__"] and all(truncateds.values())
    assert not any(terminateds.values())
    assert infos["agent_0"]["episode_limit"] and not infos["agent_0"]["battle_won"]
    # JaxMARL's env.step would have replaced it by the next episode's first observation.
    next_obs, _ = env.reset()
    assert not np.array_equal(final_obs["agent_0"]["state"], next_obs["agent_0"]["state"])


def test_decided_battles_are_terminated_and_win_matches_info():
    env = smax_env("3m", seed=3)
    rng = np.random.default_rng(3)
    obs, _ = env.reset()
    outcomes = []
    while len(outcomes) < 15:
        obs, rewards, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
        if terminateds["__all__"] or truncateds["__all__"]:
            assert terminateds["__all__"] != truncateds["__all__"]
            outcomes.append((terminateds["__all__"], infos["agent_0"]))
            obs, _ = env.reset()
    for terminated, info in outcomes:
        if terminated:
            assert info["dead_allies"] == 3 or info["dead_enemies"] == 3
            assert info["battle_won"] == (info["dead_enemies"] == 3 and info["dead_allies"] < 3)
        else:
            assert info["episode_limit"] and not info["battle_won"]
    assert any(t for t, _ in outcomes)


def test_matches_jaxmarl_step_env_oracle():
    """Same keys, same actions: the wrapper's arrays equal JaxMARL's own step_env outputs."""
    import jax
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario

    env = smax_env("2s3z")
    oracle = HeuristicEnemySMAX(scenario=map_name_to_scenario("2s3z"))
    seed = 5
    obs, _ = env.reset(seed=seed)
    key = jax.random.PRNGKey(seed)
    key, reset_key = jax.random.split(key)
    o_obs, o_state = oracle.reset(reset_key)
    rng = np.random.default_rng(0)
    for _ in range(25):
        for i, agent in enumerate(oracle.agents):
            np.testing.assert_allclose(obs[f"agent_{i}"]["observations"], o_obs[agent], atol=1e-6)
        o_avail = oracle.get_avail_actions(o_state)
        np.testing.assert_array_equal(obs["agent_1"]["action_mask"], o_avail[oracle.agents[1]])
        np.testing.assert_allclose(obs["agent_0"]["state"], o_obs["world_state"], atol=1e-6)
        actions = legal_actions(obs, rng)
        obs, rewards, terminateds, truncateds, _ = env.step(actions)
        key, step_key = jax.random.split(key)
        o_actions = {agent: actions[f"agent_{i}"] for i, agent in enumerate(oracle.agents)}
        o_obs, o_state, o_rewards, o_dones, _ = oracle.step_env(step_key, o_state, o_actions)
        assert rewards["agent_0"] == pytest.approx(float(o_rewards[oracle.agents[0]]), abs=1e-6)
        if terminateds["__all__"] or truncateds["__all__"]:
            assert bool(o_dones["__all__"])
            break


def test_seeding_is_reproducible_and_per_env_copy():
    def rollout(env, seed):
        rng = np.random.default_rng(0)
        obs, _ = env.reset(seed=seed)
        states = []
        for _ in range(10):
            obs, *_ = env.step(legal_actions(obs, rng))
            states.append(obs["agent_0"]["state"].copy())
        return np.stack(states)

    np.testing.assert_array_equal(rollout(smax_env(), 3), rollout(smax_env(), 3))
    assert not np.array_equal(rollout(smax_env(), 3), rollout(smax_env(), 4))


def test_split_reward_mode():
    copy_env, split_env = smax_env(reward_mode="copy"), smax_env(reward_mode="split")
    rng = np.random.default_rng(0)
    obs, _ = copy_env.reset(seed=9)
    split_env.reset(seed=9)
    for _ in range(30):
        actions = legal_actions(obs, rng)
        obs, r_copy, te, tr, _ = copy_env.step(actions)
        _, r_split, *_ = split_env.step(actions)
        assert sum(r_split.values()) == pytest.approx(r_copy["agent_0"], rel=1e-6)
        if te["__all__"] or tr["__all__"]:
            break


def test_unknown_map_lists_smax_maps():
    with pytest.raises(
        ValueError, match=r"map_name='MMM2' is not a SMAX scenario\. SMAX maps: .*3m"
    ):
        smax_env("MMM2")


def test_unknown_smax_option_lists_allowed():
    with pytest.raises(ValueError, match=r"\['max_step'\].*allowed: .*max_steps"):
        smax_env(smax_options={"max_step": 10})


def test_auto_falls_back_to_smax_and_logs(caplog):
    with caplog.at_level(logging.INFO, logger="rllib_ext.envs.smac"):
        env = SMACEnv({"map_name": "3m", "backend": "auto"})
    assert env.env_info["backend"] == "smax"
    assert "backend='auto' for map '3m' -> 'smax'" in caplog.text
