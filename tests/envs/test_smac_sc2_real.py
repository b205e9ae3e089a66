"""The real game: runs only where StarCraft II and oxwhirl's smacv2 / smac are installed.

Marked ``sc2`` (deselected by default; ``pytest -m sc2``). Each test skips with the reason when
the package, ``$SC2PATH`` or the map is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from rllib_ext.envs.smac import SMACEnv, parallel_env
from rllib_ext.envs.smac.sc2 import availability, install_steps
from rllib_ext.testing import BackendSpy, check_masked_multiagent_env

pytestmark = pytest.mark.sc2


def _require(package: str, map_name: str) -> None:
    ok, why = availability(package, map_name)
    if not ok:
        pytest.skip(
            f"StarCraft II {package}/{map_name} not available ({why}). {install_steps(package)}"
        )


@pytest.mark.parametrize(("package", "map_name"), [("smacv2", "3m"), ("smac", "3m")])
def test_real_game_conformance(package, map_name):
    _require(package, map_name)
    env = SMACEnv({"map_name": map_name, "backend": package, "seed": 0})
    try:
        spy = BackendSpy.install(env, record=False)
        report = check_masked_multiagent_env(env, num_steps=300, seed=0)
        assert report.illegal_action_rejected and spy.steps >= 300
        assert env.backend.restarts == 0
    finally:
        env.close()


def test_real_game_time_limit_is_truncated():
    _require("smacv2", "3m")
    env = SMACEnv({"map_name": "3m", "backend": "smacv2", "seed": 0})
    try:
        obs, _ = env.reset()
        stop = 1  # stop: always legal for a live agent, never ends the battle by itself
        for _ in range(env.env_info["episode_limit"]):
            actions = {a: stop if o["action_mask"][stop] else 0 for a, o in obs.items()}
            obs, _, terminateds, truncateds, infos = env.step(actions)
            if terminateds["__all__"] or truncateds["__all__"]:
                break
        assert terminateds["__all__"] != truncateds["__all__"]
        if truncateds["__all__"]:
            assert infos["agent_0"]["episode_limit"]
    finally:
        env.close()


def test_real_game_pettingzoo_view():
    from pettingzoo.test import parallel_api_test

    _require("smacv2", "3m")
    env = parallel_env(map_name="3m", backend="smacv2", seed=0)
    try:
        parallel_api_test(env, num_cycles=200)
    finally:
        env.close()


def test_smacv2_procedural_capability_config():
    _require("smacv2", "10gen_protoss")
    capability = {
        "n_units": 5,
        "n_enemies": 5,
        "team_gen": {
            "dist_type": "weighted_teams",
            "unit_types": ["stalker", "zealot", "colossus"],
            "weights": [0.45, 0.45, 0.1],
            "observe": True,
        },
        "start_positions": {
            "dist_type": "surrounded_and_reflect",
            "p": 0.5,
            "map_x": 32,
            "map_y": 32,
        },
    }
    # As smacv2/examples/configs/sc2_gen_protoss.yaml.
    env = SMACEnv(
        {
            "map_name": "10gen_protoss",
            "backend": "smacv2",
            "capability_config": capability,
            "sc2_options": {"use_unit_ranges": True, "min_attack_range": 2, "obs_own_pos": True},
        }
    )
    try:
        obs, _ = env.reset()
        assert len(obs) == 5
        rng = np.random.default_rng(0)
        for _ in range(20):
            actions = {a: int(rng.choice(np.flatnonzero(o["action_mask"]))) for a, o in obs.items()}
            obs, _, terminateds, truncateds, _ = env.step(actions)
            if terminateds["__all__"] or truncateds["__all__"]:
                obs, _ = env.reset()
    finally:
        env.close()
