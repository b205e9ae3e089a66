"""Fused single-agent sampling (``rllib_ext.fused_sampling``) against RLlib's own loop.

Both runners are built from the same config in this process, with the same weights, env seed
and torch seed before each call, so RLlib's ``SingleAgentEnvRunner._sample`` and the fused loop
must return the same episode chunks (ids mapped one-to-one, lookback, extra model outputs,
dtypes), report the same metrics, and call ``on_episode_end`` with the same env indices.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from rllib_ext import PPOConfig
from rllib_ext.env_runners import AMPSingleAgentEnvRunner
from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner
from rllib_ext.fused_sampling import FUSED_METRIC, FusedSamplingFallback, FusedSingleAgentEnvRunner

_ENDED_AT: dict[int, list[int]] = defaultdict(list)


class _EndIndexProbe(RLlibCallback):
    def on_episode_end(self, *, env_runner, env_index, **kwargs):
        _ENDED_AT[id(env_runner)].append(env_index)


def _config(env: str, num_envs: int = 4, **env_runners) -> PPOConfig:
    environment = {
        k: env_runners.pop(k) for k in ("normalize_actions", "clip_actions") if k in env_runners
    }
    return (
        PPOConfig()
        .environment(env, **environment)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs, **env_runners)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=5)
        .callbacks(_EndIndexProbe)
    )


def _pair(config: PPOConfig) -> tuple[FusedSingleAgentEnvRunner, SingleAgentEnvRunner]:
    assert config.env_runner_cls is FusedSingleAgentEnvRunner
    reference = config.copy(copy_frozen=False).env_runners(env_runner_cls=SingleAgentEnvRunner)
    ours, theirs = FusedSingleAgentEnvRunner(config=config), SingleAgentEnvRunner(config=reference)
    ours.module.set_state(theirs.module.get_state())
    return ours, theirs


def _assert_buffers_equal(ours, theirs, where):
    assert ours.lookback == theirs.lookback, where
    assert ours.finalized == theirs.finalized, where
    assert ours.space == theirs.space, where
    a, b = ours.data, theirs.data
    if isinstance(b, list):
        assert a == b, where
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype, (where, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=where)


def _assert_same_chunks(mine, ref, ids, where):
    assert [len(e) for e in mine] == [len(e) for e in ref], where
    for ep, ref_ep in zip(mine, ref, strict=True):
        at = f"{where} t_started {ref_ep.t_started}"
        assert ids.setdefault(ref_ep.id_, ep.id_) == ep.id_, at  # one-to-one, across calls
        assert (ep.t_started, ep.t, ep.is_terminated, ep.is_truncated) == (
            ref_ep.t_started,
            ref_ep.t,
            ref_ep.is_terminated,
            ref_ep.is_truncated,
        ), at
        for name in ("observations", "actions", "rewards", "infos"):
            _assert_buffers_equal(getattr(ep, name), getattr(ref_ep, name), f"{at} {name}")
        assert ep.extra_model_outputs.keys() == ref_ep.extra_model_outputs.keys(), at
        for key, buffer in ep.extra_model_outputs.items():
            _assert_buffers_equal(buffer, ref_ep.extra_model_outputs[key], f"{at} {key}")


_METRICS = (
    "num_env_steps_sampled_lifetime",
    "num_episodes_lifetime",
    "episode_return_mean",
    "episode_len_mean",
    "episode_return_max",
    "num_module_steps_sampled_lifetime",
)


@pytest.mark.parametrize(
    ("env", "explore", "env_runners"),
    [
        ("CartPole-v1", True, {}),
        ("CartPole-v1", False, {}),
        ("Acrobot-v1", True, {"episode_lookback_horizon": 3}),
        ("Pendulum-v1", True, {}),  # Box actions, unsquashed; every episode truncated at 200
        ("Pendulum-v1", True, {"normalize_actions": False, "clip_actions": True}),
        ("MountainCarContinuous-v0", True, {"normalize_actions": False}),
    ],
)
def test_fused_sampling_returns_the_episodes_rllibs_loop_returns(env, explore, env_runners):
    """Chunk by chunk over four calls: the same episodes, callbacks and metrics."""
    ours, theirs = _pair(_config(env, **env_runners))
    _ENDED_AT.clear()
    ids: dict[str, str] = {}
    for call in range(4):
        torch.manual_seed(call)
        mine = ours.sample(num_timesteps=150, explore=explore)
        torch.manual_seed(call)
        ref = theirs.sample(num_timesteps=150, explore=explore)
        _assert_same_chunks(mine, ref, ids, f"call {call}")
    assert _ENDED_AT[id(ours)] == _ENDED_AT[id(theirs)]
    mine_metrics, ref_metrics = ours.get_metrics(), theirs.get_metrics()
    assert mine_metrics[FUSED_METRIC].peek() == 1.0
    for key in _METRICS:
        if key in ref_metrics:
            mine_value, ref_value = mine_metrics[key], ref_metrics[key]
            if isinstance(ref_value, dict):
                mine_value = {k: v.peek() for k, v in mine_value.items()}
                ref_value = {k: v.peek() for k, v in ref_value.items()}
                assert mine_value == pytest.approx(ref_value), key
            else:
                assert mine_value.peek() == pytest.approx(ref_value.peek()), key
    for timer in ("env_reset_timer", "env_step_timer", "rlmodule_inference_timer"):
        assert timer in mine_metrics, timer
    ours.stop()
    theirs.stop()


def test_episodes_mode_and_a_force_reset_match_rllib():
    """``num_episodes`` (always from fresh episodes) and ``force_reset`` between time-step calls."""
    ours, theirs = _pair(_config("CartPole-v1", num_envs=3))
    ids: dict[str, str] = {}
    calls = [
        {"num_episodes": 4},
        {"num_timesteps": 60},
        {"num_timesteps": 60, "force_reset": True},
        {"num_episodes": 2},
        {"num_timesteps": 30},
    ]
    for call, kwargs in enumerate(calls):
        torch.manual_seed(call)
        mine = ours.sample(explore=True, **kwargs)
        torch.manual_seed(call)
        ref = theirs.sample(explore=True, **kwargs)
        _assert_same_chunks(mine, ref, ids, f"call {call} {kwargs}")
        assert ours.get_metrics()[FUSED_METRIC].peek() == 1.0


def test_amp_inference_samples_like_rllibs_loop_under_the_same_autocast():
    """``amp_inference``: the fused loop inherits the runner's autocast and float32 outputs."""
    config = _config("CartPole-v1").training(amp="bf16", amp_inference=True)
    assert config.env_runner_cls is FusedSingleAgentEnvRunner
    reference = config.copy(copy_frozen=False).env_runners(env_runner_cls=AMPSingleAgentEnvRunner)
    ours, theirs = (
        FusedSingleAgentEnvRunner(config=config),
        AMPSingleAgentEnvRunner(config=reference),
    )
    ours.module.set_state(theirs.module.get_state())
    ids: dict[str, str] = {}
    for call in range(2):
        torch.manual_seed(call)
        mine = ours.sample(num_timesteps=80, explore=True)
        torch.manual_seed(call)
        ref = theirs.sample(num_timesteps=80, explore=True)
        _assert_same_chunks(mine, ref, ids, f"call {call}")
        assert mine[0].extra_model_outputs["action_logp"].data.dtype == np.float32


class _PassThrough(ConnectorV2):
    def __call__(self, *, batch, **kwargs):
        return batch


class _PerStep(RLlibCallback):
    def on_episode_step(self, **kwargs):
        pass


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda c: c.env_runners(
                env_to_module_connector=lambda env, spaces, device: _PassThrough()
            ),
            "custom env-to-module",
        ),
        (lambda c: c.callbacks(_PerStep), "callback _PerStep.on_episode_step"),
        (lambda c: c.rl_module(model_config={"use_lstm": True, "max_seq_len": 4}), "stateful"),
        (lambda c: c.env_runners(episodes_to_numpy=False), "episodes_to_numpy=False"),
    ],
)
def test_falls_back_to_rllibs_loop_visibly(change, reason):
    """Where the fused loop cannot be exact, RLlib's loop samples: metric 0, one warning."""
    config = change(_config("CartPole-v1"))
    runner = config.env_runner_cls(config=config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        episodes = runner.sample(num_timesteps=40)
        runner.sample(num_timesteps=40)
    assert sum(len(e) for e in episodes) >= 40
    assert runner.get_metrics()[FUSED_METRIC].peek() == 0.0
    lines = [str(w.message) for w in caught if issubclass(w.category, FusedSamplingFallback)]
    assert len(lines) == 1 and reason in lines[0], lines


def test_random_actions_sample_on_rllibs_loop_then_fused_again():
    runner = _config("CartPole-v1").env_runner_cls(config=_config("CartPole-v1"))
    runner.sample(num_timesteps=20, random_actions=True)
    assert runner.get_metrics()[FUSED_METRIC].peek() == 0.0
    episodes = runner.sample(num_timesteps=20)
    assert runner.get_metrics()[FUSED_METRIC].peek() == 1.0
    assert all(e.t_started == 0 for e in episodes)  # leaving RLlib's loop reset the envs


def _same_step_cartpoles(env_config):
    n = env_config.get("num_envs", 1)
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def test_non_next_step_autoreset_falls_back():
    """RLlib's loop (and the fused one) assume gymnasium's next-step autoreset: a vector env
    with another mode is left to RLlib's loop, with the reason."""
    config = (
        _config("CartPole-v1")
        .environment(_same_step_cartpoles)
        .env_runners(gym_env_vectorize_mode="vector_entry_point")
    )
    runner = config.env_runner_cls(config=config)
    assert runner.env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    with pytest.warns(FusedSamplingFallback, match="autoreset mode"):
        runner.sample(num_timesteps=20)
    assert runner.get_metrics()[FUSED_METRIC].peek() == 0.0


def test_multi_agent_and_user_runner_classes_are_left_alone():
    class Mine(SingleAgentEnvRunner):
        pass

    assert _config("CartPole-v1").env_runners(env_runner_cls=Mine).env_runner_cls is Mine
    off = _config("CartPole-v1").training(fused_sampling=False)
    assert off.env_runner_cls is None
    amp_off = _config("CartPole-v1").training(fused_sampling=False, amp="bf16", amp_inference=True)
    assert amp_off.env_runner_cls is AMPSingleAgentEnvRunner
    multi = _config("CartPole-v1").multi_agent(
        policies={"a", "b"}, policy_mapping_fn=lambda agent_id, *args, **kwargs: "a"
    )
    assert multi.env_runner_cls is None  # the earlier automatic choice is undone
    # A config that was single-agent until its env became SMAX gets the batched SMAX runner.
    smax = _config("CartPole-v1").environment("smax", env_config={"map_name": "3m"})
    assert smax.env_runner_cls is SMAXVectorEnvRunner


def test_build_algo_train_reports_fused_sampling_on_a_remote_runner(ray_session):
    config = (
        _config("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(train_batch_size=256, minibatch_size=64, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert runners[FUSED_METRIC] == 1.0
    assert runners["num_env_steps_sampled_lifetime"] >= 256
    assert "episode_return_mean" in runners
