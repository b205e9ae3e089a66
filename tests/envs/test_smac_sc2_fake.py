"""The StarCraft II code path (backend smacv2 / smac) against the labelled SMAC-API stand-in.

``tests.envs.fake_sc2`` is not the game; tests of the real game are in
``test_smac_sc2_real.py`` (marked ``sc2``).
"""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test
from ray.rllib.utils.pre_checks.env import check_multiagent_environments

from rllib_ext.envs.smac import SMACEnv, parallel_env
from rllib_ext.envs.smac import sc2 as sc2_module
from rllib_ext.testing import BackendSpy, check_masked_multiagent_env, sample_legal
from tests.envs.fake_sc2 import FakeCapabilityEnvWrapper, FakeFaults, FakeStarCraft2Env

FAKE = "tests.envs.fake_sc2:FakeStarCraft2Env"


def make_env(map_name="3m", backend="smacv2", factory=FAKE, **config):
    return SMACEnv({"map_name": map_name, "backend": backend, "game_factory": factory, **config})


def legal_actions(obs, rng):
    return {agent: int(sample_legal(o["action_mask"], rng)) for agent, o in obs.items()}


def run_until_done(env, rng, obs=None, max_steps=10_000):
    obs = obs if obs is not None else env.reset()[0]
    for _ in range(max_steps):
        obs, rewards, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
        if terminateds["__all__"] or truncateds["__all__"]:
            return obs, rewards, terminateds, truncateds, infos
    raise AssertionError("episode did not end")


def test_sizes_match_smac_for_3s5z_vs_3s6z():
    env = make_env("3s5z_vs_3s6z")
    info = env.env_info
    assert (info["n_agents"], info["n_actions"]) == (8, 15)
    assert (info["obs_shape"], info["state_shape"]) == (136, 230)  # REFERENCE_NOTES §A
    obs, infos = env.reset(seed=0)
    assert sorted(obs) == [f"agent_{i}" for i in range(8)] and set(infos) == set(obs)
    space = env.get_observation_space("agent_0")
    assert space["observations"].shape == (136,) and space["state"].shape == (230,)
    assert space["action_mask"].shape == (15,)
    assert all(space.contains(o) for o in obs.values())
    assert env.get_action_space("agent_3").n == 15


def test_include_state_false_drops_state():
    env = make_env(include_state=False)
    obs, _ = env.reset()
    assert set(obs["agent_0"]) == {"observations", "action_mask"}


def test_game_gets_continuing_episode_and_seed():
    env = make_env(seed=7, sc2_options={"difficulty": "7"})
    game = env.backend._game
    assert game.continuing_episode is True
    assert game._seed is not None  # derived from seed=7
    assert game.other_smac_kwargs == {"difficulty": "7"}


def test_rllib_env_checker_and_mask_conformance():
    env = make_env("2s3z", seed=0)
    check_multiagent_environments(env)
    spy = BackendSpy.install(env)
    report = check_masked_multiagent_env(env, num_steps=1500, seed=1)
    assert report.illegal_action_rejected and report.episodes > 5
    assert spy.steps >= 1500


def test_action_space_sample_is_legal():
    env = make_env("3m", seed=0)
    obs, _ = env.reset()
    for _ in range(200):
        actions = {agent: env.get_action_space(agent).sample() for agent in obs}
        for agent, action in actions.items():
            assert obs[agent]["action_mask"][action] == 1
        obs, _, terminateds, truncateds, _ = env.step(actions)
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()


def test_dead_agents_stay_with_only_the_no_op():
    env = make_env("3m", seed=3)
    rng = np.random.default_rng(0)
    obs, _ = env.reset()
    saw_dead = False
    for _ in range(5000):
        obs, rewards, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
        assert set(obs) == set(env.possible_agents) == set(rewards)
        for agent_obs in obs.values():
            mask = agent_obs["action_mask"]
            if mask[0] == 1:  # no-op legal <=> dead
                saw_dead = True
                assert mask.sum() == 1 and not agent_obs["observations"].any()
        if terminateds["__all__"] or truncateds["__all__"]:
            obs, _ = env.reset()
    assert saw_dead


def test_battle_end_is_terminated_and_time_limit_truncated():
    rng = np.random.default_rng(0)
    # Agents that keep moving west outrun the enemy: the episode hits the time limit.
    env = make_env("3m", seed=0)
    obs, _ = env.reset()
    steps = 0
    while steps < 60:
        obs, _, terminateds, truncateds, infos = env.step(dict.fromkeys(obs, 5))
        steps += 1
    assert truncateds["__all__"] and all(truncateds.values())
    assert not any(terminateds.values())
    assert infos["agent_0"]["episode_limit"] is True and steps == env.env_info["episode_limit"]
    # Random legal play decides battles before the limit.
    env = make_env("3m", seed=1)
    results = [run_until_done(env, rng) for _ in range(20)]
    decided = [r for r in results if r[2]["__all__"]]
    assert decided, "no battle was decided"
    for _, _, _, truncateds, infos in decided:
        assert not truncateds["__all__"] and infos["agent_0"]["episode_limit"] is False
        info = infos["agent_0"]
        assert info["battle_won"] == (info["dead_enemies"] == 3)


def test_step_after_episode_end_raises():
    env = make_env()
    with pytest.raises(ValueError, match="reset"):
        env.step({})
    run_until_done(env, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"finished episode.*reset\(\)"):
        env.step(dict.fromkeys(env.possible_agents, 0))


def test_split_rewards_sum_to_team_reward():
    rng = np.random.default_rng(0)
    copy_env = make_env("3m", seed=5, reward_mode="copy")
    split_env = make_env("3m", seed=5, reward_mode="split")
    obs_c, _ = copy_env.reset(seed=11)
    split_env.reset(seed=11)
    for _ in range(40):
        actions = legal_actions(obs_c, rng)
        obs_c, r_c, te, tr, _ = copy_env.step(actions)
        _, r_s, _, _, _ = split_env.step(actions)
        assert sum(r_s.values()) == pytest.approx(r_c["agent_0"])
        if te["__all__"] or tr["__all__"]:
            break


def test_bad_actions_raise_clear_value_errors():
    env = make_env("3m", seed=0)
    obs, _ = env.reset()
    good = legal_actions(obs, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"Action 99 for agent_1 is out of range; allowed"):
        env.step({**good, "agent_1": 99})
    with pytest.raises(ValueError, match=r"Action 0 for agent_0 is masked.*legal actions now"):
        env.step({**good, "agent_0": 0})  # no-op is illegal for a live agent
    with pytest.raises(ValueError, match=r"No action for 'agent_2'"):
        env.step({k: v for k, v in good.items() if k != "agent_2"})
    with pytest.raises(ValueError, match=r"Unknown agent id\(s\) \['agent_9'\]"):
        env.step({**good, "agent_9": 1})
    with pytest.raises(ValueError, match="one integer per agent"):
        env.step({**good, "agent_0": 1.5})
    # Nothing reached the game: the episode continues normally.
    env.step(good)


def test_protocol_error_return_truncates_and_counts_restart(caplog):
    faults = FakeFaults(crash_at_steps={4})
    env = make_env("3m", seed=0, factory=partial(FakeStarCraft2Env, faults=faults))
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            obs, *_ = env.step(legal_actions(obs, rng))
        last_obs = obs
        obs, rewards, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
    assert truncateds["__all__"] and not terminateds["__all__"]
    assert infos["agent_0"]["sc2_crashed"] is True and infos["agent_0"]["sc2_restarts"] == 1
    assert infos["agent_0"]["episode_limit"] is False
    assert rewards["agent_0"] == 0.0
    np.testing.assert_array_equal(
        obs["agent_0"]["observations"], last_obs["agent_0"]["observations"]
    )
    assert env.backend.restarts == 1 and env.backend._game.force_restarts == 1
    assert "(0, True, {})" in caplog.text
    obs, _ = env.reset()  # the relaunched game plays on
    run_until_done(env, rng, obs)


def test_exception_in_step_truncates_and_restarts_the_game():
    faults = FakeFaults(raise_at_steps={2})
    env = make_env("3m", seed=0, factory=partial(FakeStarCraft2Env, faults=faults))
    obs, _ = env.reset()
    first_game = env.backend._game
    rng = np.random.default_rng(0)
    obs, *_ = env.step(legal_actions(obs, rng))
    obs, _, terminateds, truncateds, infos = env.step(legal_actions(obs, rng))
    assert truncateds["__all__"] and infos["agent_0"]["sc2_crashed"]
    assert first_game.closed and env.backend._game is not first_game
    obs, _ = env.reset()
    assert env.backend._game.launches == 1
    *_, infos = run_until_done(env, rng, obs)
    assert infos["agent_0"]["sc2_restarts"] == 0  # reported once, with the crashed episode


def test_failed_resets_are_retried_then_reported():
    faults = FakeFaults(fail_resets=2)
    env = make_env("3m", factory=partial(FakeStarCraft2Env, faults=faults))
    env.reset()
    assert env.backend.restarts == 2
    *_, infos = run_until_done(env, np.random.default_rng(0))
    assert infos["agent_0"]["sc2_restarts"] == 2

    faults = FakeFaults(fail_resets=10)
    env = make_env("3m", factory=partial(FakeStarCraft2Env, faults=faults), max_restarts=2)
    with pytest.raises(RuntimeError, match=r"failed to reset 3 times in a row.*max_restarts"):
        env.reset()


def test_programming_errors_are_not_treated_as_crashes():
    env = make_env("3m")
    env.reset()
    # Bypass the wrapper's check: SMAC's own assert must surface, not become a "crash".
    with pytest.raises(AssertionError, match="cannot perform action"):
        env.backend.step(np.zeros(3, dtype=np.int64))


def test_smacv2_capability_wrapper_none_reset_is_handled():
    factory = partial(FakeCapabilityEnvWrapper, cannot_reset_times=1)
    env = make_env(
        "10gen_protoss", factory=factory, capability_config={"n_units": 5, "n_enemies": 6}
    )
    assert FakeCapabilityEnvWrapper(capability_config={}, map_name="3m").reset() is not None
    assert env.env_info["n_agents"] == 5 and env.env_info["n_actions"] == 12
    obs, _ = env.reset()
    assert len(obs) == 5
    assert env.backend._game.reset_calls == 1
    run_until_done(env, np.random.default_rng(0), obs)


def test_capability_config_is_not_mutated():
    capability = {"n_units": 5, "n_enemies": 5, "team_gen": {"dist_type": "weighted_teams"}}
    make_env("10gen_protoss", factory=FakeCapabilityEnvWrapper, capability_config=capability)
    assert capability == {"n_units": 5, "n_enemies": 5, "team_gen": {"dist_type": "weighted_teams"}}


def test_reset_seed_before_launch_rebuilds_game_and_is_reproducible():
    rng_actions = np.random.default_rng(0)
    env_a, env_b = make_env("3m"), make_env("3m")
    obs_a, _ = env_a.reset(seed=123)
    obs_b, _ = env_b.reset(seed=123)
    for _ in range(20):
        actions = legal_actions(obs_a, rng_actions)
        obs_a, r_a, te, tr, _ = env_a.step(actions)
        obs_b, r_b, *_ = env_b.step(actions)
        assert r_a == r_b
        np.testing.assert_array_equal(obs_a["agent_0"]["state"], obs_b["agent_0"]["state"])
        if te["__all__"] or tr["__all__"]:
            break


def test_pettingzoo_parallel_api_on_the_sc2_path():
    env = parallel_env(map_name="3s5z_vs_3s6z", backend="smacv2", game_factory=FAKE)
    parallel_api_test(env, num_cycles=400)
    obs, _ = env.reset(seed=0)
    assert obs["agent_0"]["action_mask"].dtype == np.int8
    assert env.state().shape == env.state_space.shape == (230,)


def test_not_installed_errors_name_the_steps(monkeypatch, tmp_path):
    monkeypatch.setattr(sc2_module, "package_installed", lambda package: False)
    with pytest.raises(ImportError, match=r"git\+https://github.com/oxwhirl/smacv2.git") as err:
        SMACEnv({"backend": "smacv2", "map_name": "3m"})
    message = str(err.value)
    assert "SC2PATH" in message and "SMAC_Maps" in message and "backend='smax'" in message

    monkeypatch.setattr(sc2_module, "package_installed", lambda package: True)
    monkeypatch.setenv("SC2PATH", str(tmp_path / "nowhere"))
    with pytest.raises(sc2_module.StarCraftIINotFoundError, match=r"not installed at .*nowhere"):
        SMACEnv({"backend": "smac", "map_name": "3m"})
    ok, why = sc2_module.availability("smac", "3m")
    assert not ok and "SC2PATH" in why


def test_sc2_path_default(monkeypatch):
    monkeypatch.delenv("SC2PATH", raising=False)
    assert sc2_module.sc2_path().name in ("StarCraftII", "StarCraft II")
