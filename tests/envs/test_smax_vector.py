"""SMAXVectorEnv (N SMAX battles in one jitted, vmapped call) against single SMACEnv copies."""

from __future__ import annotations

import time
import warnings
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("jaxmarl", reason='SMAX backend needs jaxmarl: pip install "rllib-ext[smax]"')

from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402
from ray.rllib.env.env_context import EnvContext  # noqa: E402
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner  # noqa: E402

from rllib_ext.env_runners import AMPMultiAgentEnvRunner  # noqa: E402
from rllib_ext.envs.smac import SMACEnv  # noqa: E402
from rllib_ext.envs.smac.env_runner import (  # noqa: E402
    SMAXVectorEnvRunner,
    smax_env_config,
)
from rllib_ext.envs.smac.vector import SMAXVectorEnv  # noqa: E402


def _legal(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.argmax(rng.random(mask.shape) * (mask > 0), axis=-1)


def _assert_obs_equal(single: dict, vector: dict, where: str) -> None:
    assert single.keys() == vector.keys(), where
    for agent, components in single.items():
        assert components.keys() == vector[agent].keys(), where
        for name, value in components.items():
            other = vector[agent][name]
            assert other.dtype == value.dtype and other.shape == value.shape, (where, name)
            if name == "action_mask":
                np.testing.assert_array_equal(other, value, err_msg=f"{where} {agent} {name}")
            else:
                # XLA rounds some vmapped float32 kernels differently in the last bits (3m is
                # bit-identical; 3s5z_vs_3s6z positions differ by 1e-8 at the first step and
                # the drift grows to ~1e-6 over 60 steps); everything discrete (masks, flags,
                # death counts, wins) must match exactly.
                np.testing.assert_allclose(
                    other, value, rtol=1e-4, atol=1e-4, err_msg=f"{where} {agent} {name}"
                )


@pytest.mark.parametrize(
    ("map_name", "extra", "num_steps"),
    [
        ("3m", {"smax_options": {"max_steps": 20}}, 160),  # short limit: truncations too
        (
            "3s5z_vs_3s6z",
            {
                "include_state": True,
                "state_mode": "agent_specific",
                "obs_agent_id": True,
                "reward_mode": "split",
                "smax_options": {"max_steps": 25},
            },
            60,  # float32 drift between vmapped and single kernels stays < 1e-5 here
        ),
    ],
)
def test_vector_env_equals_single_envs_step_by_step(map_name, extra, num_steps):
    """Same seeds and actions: identical obs, masks, state, rewards, flags and infos.

    The reference is RLlib's own vector env semantics ("next_step" auto-reset) over SMACEnv
    copies built with vector_index 0..E-1, exactly as the runner would see them.
    """
    num_envs = 3
    config = {"backend": "smax", "map_name": map_name, "seed": 11, **extra}
    singles = [SMACEnv(EnvContext(config, worker_index=2, vector_index=i)) for i in range(num_envs)]
    vector = SMAXVectorEnv(config, num_envs=num_envs, worker_index=2)
    vector_obs, vector_infos = vector.reset()
    for e, env in enumerate(singles):
        obs, infos = env.reset()
        _assert_obs_equal(obs, vector_obs[e], f"reset env {e}")
        assert infos == vector_infos[e]
    rng = np.random.default_rng(0)
    needs_reset = [False] * num_envs
    terminated = truncated = wins = 0
    for t in range(num_steps):
        actions = [
            {
                agent: int(a)
                for agent, a in zip(
                    env.possible_agents, _legal(vector.battles.last.avail[e], rng), strict=True
                )
            }
            for e, env in enumerate(singles)
        ]
        v_obs, v_rew, v_term, v_trunc, v_info = vector.step(actions)
        for e, env in enumerate(singles):
            where = f"step {t} env {e}"
            if needs_reset[e]:
                obs, infos = env.reset()
                needs_reset[e] = False
                assert v_info[e] == infos, where
                assert not v_term[e]["__all__"] and not v_trunc[e]["__all__"], where
                assert set(v_rew[e].values()) == {0.0}, where
            else:
                obs, rewards, terms, truncs, infos = env.step(actions[e])
                assert (terms, truncs, infos) == (v_term[e], v_trunc[e], v_info[e]), where
                assert rewards.keys() == v_rew[e].keys(), where
                np.testing.assert_allclose(
                    list(v_rew[e].values()), list(rewards.values()), rtol=1e-4, atol=1e-6
                )
                needs_reset[e] = terms["__all__"] or truncs["__all__"]
                terminated += terms["__all__"]
                truncated += truncs["__all__"]
                wins += infos["agent_0"]["battle_won"]
            _assert_obs_equal(obs, v_obs[e], where)
    assert truncated > 0
    if map_name == "3m":
        assert terminated > 0


def test_reset_seed_int_spreads_like_rllib_sync_vector_env():
    """reset(seed=s) seeds env i with s + i (SyncVectorMultiAgentEnv's rule)."""
    config = {"backend": "smax", "map_name": "3m"}
    vector = SMAXVectorEnv(config, num_envs=2)
    vector_obs, _ = vector.reset(seed=5)
    for e in range(2):
        obs, _ = SMACEnv(config).reset(seed=5 + e)
        _assert_obs_equal(obs, vector_obs[e], f"env {e}")
    with pytest.raises(ValueError, match="one seed per env"):
        vector.reset(seed=[1, 2, 3])


def test_bad_input_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match="num_envs=0"):
        SMAXVectorEnv({"backend": "smax", "map_name": "3m"}, num_envs=0)
    with pytest.raises(ValueError, match="backend='smacv2'"):
        SMAXVectorEnv({"backend": "smacv2", "map_name": "3m"}, num_envs=2)
    vector = SMAXVectorEnv({"backend": "smax", "map_name": "3m", "seed": 0}, num_envs=2)
    vector.reset()
    masked = int(np.flatnonzero(vector.battles.last.avail[1, 0] == 0)[0])
    actions = [dict.fromkeys(vector.possible_agents, 4) for _ in range(2)]
    actions[1]["agent_0"] = masked
    with pytest.raises(ValueError, match="is masked"):
        vector.step(actions)
    stop = np.full((2, 3), 4, dtype=np.int32)
    with pytest.raises(ValueError, match=r"finish_step\(\) without start_step\(\)"):
        vector.battles.finish_step()
    vector.battles.start_step(stop)
    with pytest.raises(ValueError, match=r"start_step\(\) called twice"):
        vector.battles.start_step(stop)
    assert vector.battles.finish_step() is vector.battles.last
    with pytest.raises(ValueError, match="num_groups=3 must be 'auto' or an integer >= 1 that"):
        SMAXVectorEnv({"backend": "smax", "map_name": "3m"}, num_envs=4, num_groups=3)
    with pytest.raises(ValueError, match="num_groups='two' must be 'auto' or an integer"):
        SMAXVectorEnv({"backend": "smax", "map_name": "3m"}, num_envs=4, num_groups="two")
    with pytest.raises(ValueError, match=r"group=1 is not one of 0\.\.0 \(num_groups=1\)"):
        vector.battles.start_step(stop, group=1)


def test_groups_step_each_battle_as_one_call_does():
    """num_groups=2, groups started and finished one after the other (as the pipelined sampler
    does): every battle plays exactly what it plays in one call for all (3m is bit-identical),
    through auto-resets."""
    env_config = {"backend": "smax", "map_name": "3m", "seed": 3, "smax_options": {"max_steps": 20}}
    whole = SMAXVectorEnv(env_config, num_envs=4).battles
    grouped = SMAXVectorEnv(env_config, num_envs=4, num_groups=2).battles
    rng = np.random.default_rng(0)
    batch, parts = whole.reset_arrays(), grouped.reset_arrays()
    resets = 0
    for step in range(60):
        for name in ("obs", "state", "avail", "reward", "terminated", "truncated", "was_reset"):
            np.testing.assert_array_equal(
                getattr(parts, name), getattr(batch, name), err_msg=f"step {step} {name}"
            )
        actions = _legal(batch.avail, rng).astype(np.int32)
        was_reset = whole.start_step(actions)
        halves = [
            grouped.start_step(actions[:2], group=0),
            grouped.start_step(actions[2:], group=1),
        ]
        np.testing.assert_array_equal(np.concatenate(halves), was_reset)
        batch = whole.finish_step()
        first = grouped.finish_step(group=0)
        np.testing.assert_array_equal(first.obs, grouped.group_batch(0).obs)
        grouped.finish_step(group=1)
        parts = grouped.last
        resets += int(batch.was_reset.sum())
    assert resets >= 4  # every battle ended (20-step limit) and was reset at least once


@pytest.mark.parametrize(
    ("map_name", "num_envs", "groups"),
    [("3s5z_vs_3s6z", 64, 2), ("3m", 64, 1), ("3m", 256, 2), ("3s5z_vs_3s6z", 65, 1)],
)
def test_auto_groups_split_only_large_even_batches(map_name, num_envs, groups):
    """num_groups="auto": 2 groups from AUTO_GROUP_ROWS agent rows on (3s5z_vs_3s6z has 8
    agents, 3m 3), 1 below it or for an odd battle count."""
    from rllib_ext.envs.smac.battles import AUTO_GROUP_ROWS, auto_num_groups

    env = SMAXVectorEnv(
        {"backend": "smax", "map_name": map_name}, num_envs=num_envs, num_groups="auto"
    ).battles
    assert env.num_groups == groups == auto_num_groups(num_envs, env.spec.n_agents)
    assert env.group_size * groups == num_envs
    assert (num_envs * env.spec.n_agents >= AUTO_GROUP_ROWS) == (groups == 2 or num_envs % 2 == 1)
    assert SMAXVectorEnvRunner.fused_groups == "auto"


def test_sub_env_action_spaces_sample_legal_actions():
    """RLlib's random-action path samples env.envs[i].unwrapped.get_action_space(aid)."""
    vector = SMAXVectorEnv({"backend": "smax", "map_name": "3s5z_vs_3s6z", "seed": 3}, num_envs=2)
    vector.reset()
    for _ in range(30):
        actions = [
            {aid: view.unwrapped.get_action_space(aid).sample() for aid in view.possible_agents}
            for view in vector.envs
        ]
        vector.step(actions)  # raises on an illegal action


def _config(env="smax", num_envs=4, **env_config):
    from rllib_ext import PPOConfig

    return (
        PPOConfig()
        .environment(env, env_config={"map_name": "3m", **env_config})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
    )


def test_config_selects_the_batched_runner_only_for_smax_with_several_envs():
    config = _config()
    config.validate()
    assert config.env_runner_cls is SMAXVectorEnvRunner
    one_env = _config(num_envs=1)
    one_env.validate()
    assert one_env.env_runner_cls is None
    sc2 = _config(env="smac_v2", backend="smacv2")
    assert smax_env_config(sc2.env, sc2.env_config) is None
    # backend="auto" without StarCraft II resolves to SMAX, like make_backend.
    assert smax_env_config("smac_v2", {"map_name": "3m"})["backend"] == "smax"
    chosen = _config().env_runners(env_runner_cls=MultiAgentEnvRunner)
    chosen.validate()
    assert chosen.env_runner_cls is MultiAgentEnvRunner


def test_amp_inference_keeps_the_batched_runner_in_either_order():
    """SMAXVectorEnvRunner opts into AMPInference, so amp_inference=True does not trade batched
    stepping for the autocast forward; with one env the plain AMP runner comes back."""
    amp_last = _config(num_envs=4).training(**_AMP_INFERENCE)
    amp_first = (
        _config(num_envs=1).training(**_AMP_INFERENCE).env_runners(num_envs_per_env_runner=4)
    )
    for config in (amp_last, amp_first):
        config.validate()
        assert config.env_runner_cls is SMAXVectorEnvRunner
    amp_first.env_runners(num_envs_per_env_runner=1)
    amp_first.validate()
    assert amp_first.env_runner_cls is AMPMultiAgentEnvRunner
    runner = SMAXVectorEnvRunner(config=amp_last)
    assert runner.sample(num_timesteps=16, explore=True)
    assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 1.0
    runner.stop()


def test_runner_samples_episodes_equal_to_rllib_runner_semantics():
    """Local runner (no Ray): episodes carry SMAX's win info and every action was legal."""
    config = _config(num_envs=3, seed=0)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    assert isinstance(runner.env, SMAXVectorEnv) and runner.num_envs == 3
    episodes = runner.sample(num_timesteps=240, explore=True)
    assert sum(ep.env_steps() for ep in episodes) >= 240
    done = [ep for ep in episodes if ep.is_done]
    assert done
    for ep in done:
        infos = ep.get_infos(-1)
        assert set(infos["agent_0"]) >= {"battle_won", "dead_allies", "dead_enemies"}
    for ep in episodes:
        for sa in ep.agent_episodes.values():
            masks = sa.get_observations(slice(0, len(sa)))["action_mask"]  # numpy'd episode
            actions = np.asarray(sa.get_actions())
            assert (masks[np.arange(len(actions)), actions] == 1).all()
    metrics = runner.get_metrics()
    assert metrics["rllib_ext/smax_batched_envs"].peek() == 3
    runner.stop()


def test_gc_paused_switches_the_collector_off_and_back():
    """Off inside, on after (also after an exception); a collector already off stays off;
    pause=False leaves it alone."""
    import gc

    from rllib_ext.envs.smac.sampling import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    with gc_paused(False):
        assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("pause_gc", [True, False])
def test_fused_sampling_pauses_the_gc_only_while_it_runs(pause_gc):
    """The collector is off while the fused loop runs (seen from on_episode_end, which the loop
    calls) with pause_gc (the default), on again when sample() returns; pause_gc=False: on
    throughout."""
    import gc

    from ray.rllib.callbacks.callbacks import RLlibCallback

    seen: list[bool] = []

    class _Probe(RLlibCallback):
        def on_episode_end(self, **kwargs):
            seen.append(gc.isenabled())

    config = _config(num_envs=3, seed=0, smax_options={"max_steps": 10}).callbacks(_Probe)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    runner.pause_gc = pause_gc
    assert SMAXVectorEnvRunner.pause_gc is True
    runner.sample(num_timesteps=60, explore=True)
    assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 1.0
    assert seen and set(seen) == {not pause_gc}
    assert gc.isenabled()
    runner.stop()


@pytest.mark.slow
def test_build_algo_train_uses_batched_runner_on_remote_env_runner(ray_session):
    """Two iterations through build_algo()/train() with one remote env runner."""
    from rllib_ext import PPOConfig

    config = (
        PPOConfig()
        .environment("smax", env_config={"map_name": "3m", "seed": 0})
        .env_runners(
            num_env_runners=1,
            num_envs_per_env_runner=4,
            rollout_fragment_length=32,
            # The first sample() compiles the jitted step; on a busy 2-core machine that can
            # pass RLlib's 60 s default, and a timed-out sample() returns fewer steps.
            sample_timeout_s=600.0,
        )
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert runners["rllib_ext/smax_batched_envs"] == 4
    assert runners["rllib_ext/smax_fused_sampling"] == 1.0
    assert runners["rllib_ext/smax_fused_groups"] == 1  # "auto": 4 battles of 3m stay one group
    assert runners["num_env_steps_sampled_lifetime"] >= 256
    assert "rllib_ext/win_rate" in runners


def _assert_buffers_equal(ours, theirs, where):
    """InfiniteLookbackBuffer contents (data incl. lookback) equal, floats to 1e-5."""
    assert ours.lookback == theirs.lookback, where
    assert ours.finalized == theirs.finalized, (where, "finalized")
    assert ours.space == theirs.space, (where, "space", ours.space, theirs.space)
    a, b = ours.data, theirs.data
    if isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in b:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=where)
    elif isinstance(b, list):
        assert a == b, where
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype, (where, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=where)


_RECURRENT = {"recurrent_cell": "gru", "fcnet_hiddens": [16], "lstm_cell_size": 8}
_AMP_INFERENCE = {"amp": "bf16", "amp_inference": True}


class _TwoGroupRunner(SMAXVectorEnvRunner):
    fused_groups = 2


_ENDED_AT: dict[int, list[int]] = defaultdict(list)
"""``id(env_runner)`` -> the ``env_index`` of each ``on_episode_end`` call it made."""


class _EndIndexProbe(RLlibCallback):
    def on_episode_end(self, *, env_runner, env_index, **kwargs):
        _ENDED_AT[id(env_runner)].append(env_index)


@pytest.mark.parametrize(
    ("state_config", "model_config", "training", "runner_cls"),
    [
        ({"include_state": False}, {}, {}, SMAXVectorEnvRunner),
        ({"include_state": True}, {}, {}, SMAXVectorEnvRunner),
        ({"include_state": True, "state_mode": "agent_specific"}, {}, {}, SMAXVectorEnvRunner),
        ({"include_state": True, "obs_agent_id": True}, {}, {}, SMAXVectorEnvRunner),
        ({"include_state": False}, _RECURRENT, {}, SMAXVectorEnvRunner),
        (
            {"include_state": True},
            {**_RECURRENT, "recurrent_cell": "lstm"},
            {},
            SMAXVectorEnvRunner,
        ),
        ({"include_state": True}, {}, _AMP_INFERENCE, SMAXVectorEnvRunner),
        ({"include_state": False}, _RECURRENT, _AMP_INFERENCE, SMAXVectorEnvRunner),
        ({"include_state": True}, {}, {}, _TwoGroupRunner),
        ({"include_state": False}, _RECURRENT, {}, _TwoGroupRunner),
    ],
)
def test_fused_sampling_returns_the_episodes_rllibs_loop_returns(
    state_config, model_config, training, runner_cls
):
    """Greedy policy, same weights and seeds: the array-speed path and RLlib's own loop (over
    RLlib's SyncVectorMultiAgentEnv of SMACEnv copies) return the same episode chunks, also
    across sample() calls (ids, env_t_started, one-step lookback), with the same metrics.
    Recurrent modules: the same STATE_OUTs, so the carried state is RLlib's. amp_inference: the
    same bf16 forward and float32 outputs as rllib_ext's AMPMultiAgentEnvRunner over RLlib's loop.
    Two groups (fused_groups=2): the pipelined loop returns the same episodes too. Four battles,
    so some episode is reset on the last step of a call (RLlib cuts it anyway: its next chunk's
    env-to-agent time map starts with an "S" lookback entry). Both report the same env_index
    to on_episode_end, and a chunk's clock starts at its first step in the call (its duration never
    counts the time between sample() calls)."""
    env_config = {
        "map_name": "3m",
        **state_config,
        "smax_options": {"max_steps": 30},
    }
    ours_config = (
        _config(num_envs=4, **env_config)
        .rl_module(model_config=model_config)
        .training(**training)
        .debugging(seed=4)
        .callbacks(_EndIndexProbe)
    )
    theirs_config = ours_config.copy(copy_frozen=False).env_runners(
        env_runner_cls=AMPMultiAgentEnvRunner if training else MultiAgentEnvRunner
    )
    assert ours_config.env_runner_cls is SMAXVectorEnvRunner
    _ENDED_AT.clear()  # keyed by id(): a runner of an earlier case may have had the same id
    ours = runner_cls(config=ours_config)
    # "auto" (the default) keeps 4 battles of 3m (12 agent rows) in one group.
    assert ours.vector_env.battles.num_groups == {"auto": 1}.get(runner_cls.fused_groups, 2)
    theirs = theirs_config.env_runner_cls(config=theirs_config)
    assert ours.module["shared_policy"].is_stateful() == bool(model_config)
    ours.module.set_state(theirs.module.get_state())
    ids: dict[str, str] = {}
    for call in range(3):
        called = time.perf_counter()
        mine = ours.sample(num_timesteps=45, explore=False)
        mine_wall = time.perf_counter() - called
        called = time.perf_counter()
        ref = theirs.sample(num_timesteps=45, explore=False)
        ref_wall = time.perf_counter() - called
        assert [len(e) for e in mine] == [len(e) for e in ref], call
        assert _ENDED_AT[id(ours)] == _ENDED_AT[id(theirs)], call
        assert max(ep.get_duration_s() for ep in mine) <= mine_wall, call
        assert max(ep.get_duration_s() for ep in ref) <= ref_wall, call
        for ep, ref_ep in zip(mine, ref, strict=True):
            where = f"call {call} env_t_started {ref_ep.env_t_started}"
            # Episode ids are random; they must map one-to-one and persist across chunks.
            assert ids.setdefault(ref_ep.id_, ep.id_) == ep.id_, where
            assert (ep.env_t_started, ep.env_t, ep.is_terminated, ep.is_truncated) == (
                ref_ep.env_t_started,
                ref_ep.env_t,
                ref_ep.is_terminated,
                ref_ep.is_truncated,
            ), where
            assert ep.agent_episodes.keys() == ref_ep.agent_episodes.keys()
            for aid, sa in ep.agent_episodes.items():
                ref_sa = ref_ep.agent_episodes[aid]
                assert (sa.t_started, sa.t, sa.module_id, sa.agent_id) == (
                    ref_sa.t_started,
                    ref_sa.t,
                    ref_sa.module_id,
                    ref_sa.agent_id,
                ), where
                assert sa.multi_agent_episode_id == ep.id_, where
                assert ref_sa.multi_agent_episode_id == ref_ep.id_, where
                assert (sa.observation_space, sa.action_space) == (
                    ref_sa.observation_space,
                    ref_sa.action_space,
                ), where
                assert type(sa.extra_model_outputs) is type(ref_sa.extra_model_outputs), where
                for name in ("observations", "actions", "rewards", "infos"):
                    _assert_buffers_equal(
                        getattr(sa, name), getattr(ref_sa, name), f"{where} {aid} {name}"
                    )
                assert sa.extra_model_outputs.keys() == ref_sa.extra_model_outputs.keys()
                for key, buffer in sa.extra_model_outputs.items():
                    _assert_buffers_equal(
                        buffer, ref_sa.extra_model_outputs[key], f"{where} {aid} {key}"
                    )
                _assert_buffers_equal(
                    ep.env_t_to_agent_t[aid], ref_ep.env_t_to_agent_t[aid], f"{where} {aid} t"
                )
    assert len(set(_ENDED_AT[id(ours)])) > 1  # episodes ended in more than one battle
    ours_metrics, theirs_metrics = ours.get_metrics(), theirs.get_metrics()
    assert ours_metrics["rllib_ext/smax_fused_sampling"].peek() == 1.0
    for timer in ("env_reset_timer", "env_step_timer"):
        assert timer in ours_metrics and timer in theirs_metrics, timer
    assert ours_metrics["rllib_ext/smax_fused_groups"].peek() == ours.vector_env.battles.num_groups
    keys = ("num_env_steps_sampled_lifetime", "num_episodes_lifetime", "episode_return_mean")
    keys += ("episode_len_mean", "rllib_ext/win_rate", "rllib_ext/timeout_rate")
    keys += ("num_module_steps_sampled_lifetime",)
    keys += ("num_agent_steps_sampled_lifetime",)
    for key in keys:
        mine, ref = ours_metrics[key], theirs_metrics[key]
        if isinstance(ref, dict):
            assert {k: v.peek() for k, v in mine.items()} == pytest.approx(
                {k: v.peek() for k, v in ref.items()}
            ), key
        else:
            assert mine.peek() == pytest.approx(ref.peek()), key
    ours.stop()
    theirs.stop()


def test_fused_sampling_recovers_after_an_exception_in_the_loop():
    """An on_episode_end that raises once leaves a step in flight; the next sample() starts
    afresh on the fused path instead of failing on the stale step."""

    class _RaiseOnce(RLlibCallback):
        raised = False

        def on_episode_end(self, **kwargs):
            if not _RaiseOnce.raised:
                _RaiseOnce.raised = True
                raise RuntimeError("callback failed")

    config = _config(num_envs=3, seed=0, smax_options={"max_steps": 10}).callbacks(_RaiseOnce)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    with pytest.raises(RuntimeError, match="callback failed"):
        runner.sample(num_timesteps=60, explore=True)
    episodes = runner.sample(num_timesteps=60, explore=True)
    assert sum(ep.env_steps() for ep in episodes) >= 60
    assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 1.0
    runner.stop()


def test_fused_sampling_falls_back_where_it_cannot_be_exact():
    """A lookback horizon other than 1, episodes left as lists or a module off the CPU: RLlib's
    loop, with the reason."""
    from rllib_ext.envs.smac.sampling import smax_rule

    config = _config(num_envs=2, seed=0).env_runners(episodes_to_numpy=False)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    assert smax_rule(runner, num_timesteps=16, random_actions=False) == ("episodes_to_numpy=False")
    runner.stop()

    config = _config(num_envs=2, seed=0).env_runners(episode_lookback_horizon=2)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    assert "episode_lookback_horizon=2" in smax_rule(runner, num_timesteps=16, random_actions=False)
    episodes = runner.sample(num_timesteps=16, explore=True)
    assert sum(ep.env_steps() for ep in episodes) >= 16
    assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 0.0
    runner.stop()

    config = _config(num_envs=2, seed=0)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    assert smax_rule(runner, num_timesteps=16, random_actions=False) is None
    runner.module["shared_policy"].to("meta")  # any non-CPU device: no GPU needed
    assert smax_rule(runner, num_timesteps=16, random_actions=False) == ("RLModule on meta")
    runner.stop()

    config = _config(num_envs=2, seed=0).training(fused_sampling=False)  # the setting
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    runner.sample(num_timesteps=16, explore=True)
    assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 0.0
    runner.stop()


def test_module_with_extra_outputs_samples_on_rllibs_loop_and_keeps_them():
    """A module that also returns VF_PREDS: the rule's dry forward finds it before any side
    effect (no reset, RNG states restored), so RLlib's loop starts from the seeded state it
    would start from with fused sampling off, and keeps the column in the episodes."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_ext import _rllib_private as private
    from rllib_ext.envs.smac.sampling import smax_rule
    from rllib_ext.fused_sampling import FusedSamplingFallback
    from rllib_ext.modules import MaskedPPOTorchRLModule

    class _WithValues(MaskedPPOTorchRLModule):
        def _forward(self, batch, **kwargs):
            out = super()._forward(batch, **kwargs)
            out[Columns.VF_PREDS] = torch.zeros(out[Columns.ACTION_DIST_INPUTS].shape[0])
            return out

    spec = MultiRLModuleSpec(
        rl_module_specs={"shared_policy": RLModuleSpec(module_class=_WithValues)}
    )
    config = _config(num_envs=2, seed=0).rl_module(rl_module_spec=spec)
    config.validate()
    runner = SMAXVectorEnvRunner(config=config)
    reference = SMAXVectorEnvRunner(config=config.copy().training(fused_sampling=False))
    reference.module.set_state(runner.module.get_state())
    torch.manual_seed(3)
    rng = torch.get_rng_state()
    reason = smax_rule(runner, num_timesteps=16, random_actions=False, explore=True)
    assert reason is not None and "vf_preds" in reason
    assert private.needs_initial_reset(runner) and torch.equal(rng, torch.get_rng_state())
    for call in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(call)
            episodes = runner.sample(num_timesteps=16, explore=True)
        fallbacks = [w for w in caught if issubclass(w.category, FusedSamplingFallback)]
        assert len(fallbacks) == (1 if call == 0 else 0)
        torch.manual_seed(call)
        expected = reference.sample(num_timesteps=16, explore=True)
        assert runner.get_metrics()["rllib_ext/smax_fused_sampling"].peek() == 0.0
        assert len(episodes) == len(expected)
        for ep, ref_ep in zip(episodes, expected, strict=True):
            for agent, sa in ep.agent_episodes.items():
                assert Columns.VF_PREDS in sa.extra_model_outputs
                ref_sa = ref_ep.agent_episodes[agent]
                np.testing.assert_array_equal(
                    sa.observations.data["observations"], ref_sa.observations.data["observations"]
                )
                np.testing.assert_array_equal(sa.actions.data, ref_sa.actions.data)
    runner.stop()
    reference.stop()
