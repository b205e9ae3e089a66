"""``VectorizedEpisodesToBatch`` vs RLlib's default pieces on real episodes.

The reference is RLlib's own PPO learner pipeline (``Case.stock_pipeline``). The candidate is
the same pipeline with the seven batching pieces fused by ``install_vectorized_batching``
(RLlib's GAE piece kept), so every column, advantages included, must be bit-identical, and
the episodes must be left in the same state (ids, lengths, flags, buffers), as must
``shared_data``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import tree
from ray.rllib.connectors.common import AddObservationsFromEpisodesToBatch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner import AddOneTsToEpisodesAndTruncate
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

import rllib_ext
from rllib_ext.connectors.batching import (
    BATCHING_IMPL_KEY,
    VectorizedEpisodesToBatch,
    install_vectorized_batching,
)
from rllib_ext.connectors.sequences import why_not_sequences
from tests.connectors._cases import Case, small_config

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def smax():
    """SMAX 3m through rllib_ext's SMAC auto-setup: Dict obs (with global state), one shared
    masked policy for three agents that leave the episode when they die."""
    config = (
        rllib_ext.PPOConfig()
        .environment("smax", env_config={"map_name": "3m"})
        .env_runners(num_env_runners=0)
        .rl_module(model_config={"central_critic": True, "fcnet_hiddens": [32]})
        .training(train_batch_size_per_learner=600)
        .debugging(seed=0)
    )
    case = Case(config, num_timesteps=600)
    yield case
    case.algo.stop()


def _fused(case: Case):
    pipeline = case.stock_pipeline()
    assert install_vectorized_batching(pipeline, multi_agent=case.algo.config.is_multi_agent)
    assert [type(p) for p in pipeline.connectors][0] is VectorizedEpisodesToBatch
    return pipeline


def _assert_same_batch(expected: dict, actual: dict) -> None:
    assert list(actual) == list(expected)
    for mid in expected:
        assert list(actual[mid]) == list(expected[mid]), mid
        for column in expected[mid]:
            exp_leaves, act_leaves = (tree.flatten(b[mid][column]) for b in (expected, actual))
            tree.assert_same_structure(expected[mid][column], actual[mid][column])
            assert len(exp_leaves) == len(act_leaves) > 0
            for exp, act in zip(exp_leaves, act_leaves, strict=True):
                assert isinstance(act, torch.Tensor), (mid, column)
                assert act.dtype == exp.dtype and act.shape == exp.shape, (mid, column)
                assert torch.equal(act, exp), (mid, column)


def _chunks(episodes: list) -> list:
    return list(ConnectorV2.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))


def _assert_same_episodes(expected: list, actual: list) -> None:
    assert [e.id_ for e in actual] == [e.id_ for e in expected]
    assert [len(e) for e in actual] == [len(e) for e in expected]
    exp_chunks, act_chunks = _chunks(expected), _chunks(actual)
    assert len(exp_chunks) == len(act_chunks)
    for exp, act in zip(exp_chunks, act_chunks, strict=True):
        for attr in ("id_", "multi_agent_episode_id", "t", "t_started", "is_terminated"):
            assert getattr(act, attr) == getattr(exp, attr), attr
        assert act.is_truncated == exp.is_truncated and len(act) == len(exp)
        buffers = {"observations": (exp.observations, act.observations)}
        buffers |= {"actions": (exp.actions, act.actions), "rewards": (exp.rewards, act.rewards)}
        for key, buf in exp.extra_model_outputs.items():
            buffers[key] = (buf, act.extra_model_outputs[key])
        for name, (e_buf, a_buf) in buffers.items():
            assert a_buf.lookback == e_buf.lookback, name
            for e_leaf, a_leaf in zip(
                tree.flatten(e_buf.data), tree.flatten(a_buf.data), strict=True
            ):
                assert a_leaf.dtype == e_leaf.dtype, name
                np.testing.assert_array_equal(a_leaf, e_leaf, err_msg=name)
        assert act.infos.data == exp.infos.data


@pytest.mark.parametrize("case_name", ["cartpole", "multi_agent", "smax"])
def test_fused_equals_rllib_pieces(case_name: str, request: pytest.FixtureRequest) -> None:
    case: Case = request.getfixturevalue(case_name)
    exp_batch, exp_shared, exp_episodes = case.run_full(case.stock_pipeline())
    metrics = MetricsLogger()
    act_batch, act_shared, act_episodes = case.run_full(_fused(case), metrics=metrics)
    for mid in act_batch:  # the fused path ran, not RLlib's pieces kept as fallback
        assert metrics.peek((mid, BATCHING_IMPL_KEY)) == 1.0
    _assert_same_batch(exp_batch, act_batch)
    assert act_shared == exp_shared
    _assert_same_episodes(exp_episodes, act_episodes)
    # Both episode layouts are exercised: chunks that terminated and chunks cut by the batch.
    chunks = _chunks(case.episodes)
    assert any(c.is_terminated for c in chunks) and any(not c.is_done for c in chunks)


def test_smax_batch_has_nested_observations(smax: Case) -> None:
    batch = smax.run(_fused(smax))
    (mid,) = batch
    obs = batch[mid]["obs"]
    assert set(obs) == {"observations", "action_mask", "state"}
    assert obs["action_mask"].shape[0] == batch[mid]["actions"].shape[0]


def test_learner_installs_it_and_reports_it(cartpole: Case) -> None:
    pieces = cartpole.learner._learner_connector.connectors
    assert isinstance(pieces[0], VectorizedEpisodesToBatch)
    assert AddOneTsToEpisodesAndTruncate not in [type(p) for p in pieces]
    metrics = MetricsLogger()
    cartpole.run_full(cartpole.learner._learner_connector, metrics=metrics)
    assert metrics.peek(("default_policy", BATCHING_IMPL_KEY)) == 1.0


@pytest.fixture(scope="module")
def smax_recurrent():
    """SMAX 3m with the recurrent masked module and JaxMARL's recurrent critic: a Dict state
    (``h``, ``critic_h``) per agent chunk, agents leaving at death (chunks of many lengths),
    two battles; the second sample continues the first's battles (``t_started > 0``)."""
    config = (
        rllib_ext.PPOConfig()
        .environment("smax", env_config={"map_name": "3m"})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .rl_module(
            model_config={
                "recurrent_cell": "gru",
                "central_critic": True,
                "critic_recurrent": True,
                "fcnet_hiddens": [16],
                "lstm_cell_size": 8,
                "max_seq_len": 8,
            }
        )
        .training(train_batch_size_per_learner=400)
        .debugging(seed=0)
    )
    case = Case(config, num_timesteps=400)
    case.episodes = case.algo.env_runner.sample(num_timesteps=400, random_actions=False)
    yield case
    case.algo.stop()


@pytest.mark.parametrize("case_name", ["lstm", "smax_recurrent"])
def test_stateful_fused_equals_rllib_pieces(case_name: str, request: pytest.FixtureRequest) -> None:
    """Time rank, zero padding, ``seq_lens`` and ``state_in`` as RLlib's
    ``AddTimeDimToBatchAndZeroPad`` + ``AddStatesFromEpisodesToBatch`` build them."""
    case: Case = request.getfixturevalue(case_name)
    (mid,) = case.learner.module.keys()
    max_seq_len = case.learner.module[mid].model_config["max_seq_len"]
    exp_batch, exp_shared, exp_episodes = case.run_full(case.stock_pipeline())
    metrics = MetricsLogger()
    act_batch, act_shared, act_episodes = case.run_full(_fused(case), metrics=metrics)
    assert metrics.peek((mid, BATCHING_IMPL_KEY)) == 1.0
    _assert_same_batch(exp_batch, act_batch)
    assert act_shared == exp_shared
    assert act_shared[f"_zero_padded_for_mid={mid}"] is True
    assert list(act_batch[mid]["state_in"]) == list(exp_batch[mid]["state_in"])  # key order too
    _assert_same_episodes(exp_episodes, act_episodes)
    # [B, T] with padding; every layout of a chunk is exercised: chunks that start their
    # episode (the initial state) and chunks that continue one (their lookback's state_out),
    # chunks of one and of several sequences.
    seq_lens = act_batch[mid]["seq_lens"]
    assert act_batch[mid]["loss_mask"].shape == (len(seq_lens), max_seq_len)
    assert (seq_lens < max_seq_len).any() and (seq_lens == max_seq_len).any()
    chunks = _chunks(case.episodes)
    assert any(c.t_started > 0 for c in chunks) and any(c.t_started == 0 for c in chunks)
    assert any(len(c) + 1 > max_seq_len for c in chunks)
    assert any(len(c) + 1 <= max_seq_len for c in chunks)


def test_stateful_chunks_without_state_out_fall_back_to_rllib_pieces(lstm: Case) -> None:
    """Episodes without ``state_out`` (e.g. offline data): RLlib's pieces start every sequence
    from the initial state, and the piece hands over to them."""
    episodes = copy.deepcopy(lstm.episodes)
    for chunk in _chunks(episodes):
        del chunk.extra_model_outputs["state_out"]
    metrics = MetricsLogger()
    exp_batch, exp_shared, _ = lstm.run_full(lstm.stock_pipeline(), episodes=episodes)
    act_batch, act_shared, _ = lstm.run_full(_fused(lstm), metrics=metrics, episodes=episodes)
    assert metrics.peek(("default_policy", BATCHING_IMPL_KEY)) == 0.0
    _assert_same_batch(exp_batch, act_batch)
    assert act_shared == exp_shared


def test_continuing_chunk_without_lookback_state_is_refused(lstm: Case) -> None:
    chunk = copy.deepcopy(next(c for c in _chunks(lstm.episodes) if c.t_started > 0))
    assert why_not_sequences([chunk]) is None
    chunk.extra_model_outputs["state_out"].lookback = 0
    assert "no state_out before its start" in why_not_sequences([chunk])


def test_non_empty_incoming_batch_falls_back(cartpole: Case) -> None:
    piece = _fused(cartpole).connectors[0]
    assert piece._why_not_fused(cartpole.learner.module, {"obs": []}, [], []) is not None


class _Marker(ConnectorV2):
    def __call__(self, *, batch, **kwargs):
        return batch


def test_custom_learner_connector_keeps_rllib_pieces() -> None:
    config = small_config().training(learner_connector=lambda *a, **k: _Marker())
    pipeline = config.build_learner_connector(None, None)
    pipeline.prepend(AddOneTsToEpisodesAndTruncate())
    before = [type(p) for p in pipeline.connectors]
    assert before[1] is _Marker and AddObservationsFromEpisodesToBatch in before
    assert not install_vectorized_batching(pipeline, multi_agent=False)
    assert [type(p) for p in pipeline.connectors] == before


def test_batching_rllib_keeps_rllib_pieces() -> None:
    algo = small_config().training(batching="rllib").build_algo()
    try:
        pieces = [type(p) for p in algo.learner_group._learner._learner_connector.connectors]
        assert pieces[0] is AddOneTsToEpisodesAndTruncate
        assert VectorizedEpisodesToBatch not in pieces
    finally:
        algo.stop()


def test_bad_batching_value_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"batching='fast'.*'rllib'.*'vectorized'"):
        rllib_ext.PPOConfig().training(batching="fast")
