"""``CompiledGAE`` vs RLlib's ``GeneralAdvantageEstimation`` on real episodes, same weights.

Each case builds one algorithm (``rllib_ext.PPOConfig``, so the learner is
``PPOExtTorchLearner``), samples real episodes with its local env runner, and runs two learner
connector pipelines on deep copies of them with the learner's own ``MultiRLModule``:

* stock: ``config.build_learner_connector(...)`` with ``AddOneTsToEpisodesAndTruncate``
  prepended and RLlib's ``GeneralAdvantageEstimation`` appended, exactly as
  ``PPOLearner.build`` assembles it;
* ours: the learner's installed pipeline (``CompiledGAE`` in the last slot).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ray.rllib.connectors.learner import (
    AddOneTsToEpisodesAndTruncate,
    GeneralAdvantageEstimation,
)
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.postprocessing.zero_padding import split_and_zero_pad_n_episodes

from rllib_ext.connectors.batching import VectorizedEpisodesToBatch
from rllib_ext.connectors.gae import CompiledGAE
from tests.connectors._cases import GAMMA, LAMBDA, Case

pytestmark = pytest.mark.usefixtures("ray_session")


def _assert_parity(stock: dict, ours: dict, module_ids) -> None:
    assert set(module_ids) <= set(stock) and set(module_ids) <= set(ours)
    for mid in module_ids:
        mask = stock[mid][Columns.LOSS_MASK].numpy().astype(bool)
        assert torch.equal(stock[mid][Columns.LOSS_MASK], ours[mid][Columns.LOSS_MASK])
        assert mask.sum() > 0
        for key in (Postprocessing.ADVANTAGES, Postprocessing.VALUE_TARGETS):
            expected, actual = stock[mid][key], ours[mid][key]
            assert actual.dtype == expected.dtype == torch.float32, key
            assert actual.shape == expected.shape, key
            np.testing.assert_allclose(
                actual.numpy()[mask], expected.numpy()[mask], rtol=1e-5, atol=1e-5, err_msg=key
            )


def _installed_gae(learner) -> CompiledGAE:
    pieces = learner._learner_connector.connectors
    assert not any(type(p) is GeneralAdvantageEstimation for p in pieces)
    (gae,) = [p for p in pieces if isinstance(p, CompiledGAE)]
    return gae


def test_learner_pipeline_uses_compiled_gae(cartpole):
    pieces = cartpole.learner._learner_connector.connectors
    assert isinstance(pieces[0], VectorizedEpisodesToBatch)
    assert isinstance(pieces[0].pieces[0], AddOneTsToEpisodesAndTruncate)
    assert isinstance(pieces[-1], CompiledGAE)
    assert _installed_gae(cartpole.learner).standardize_advantages == "all"


def test_cartpole_parity(cartpole):
    episodes = cartpole.episodes
    assert any(e.is_terminated for e in episodes) and any(not e.is_done for e in episodes)
    stock = cartpole.run(cartpole.stock_pipeline())
    ours = cartpole.run(cartpole.learner._learner_connector)
    _assert_parity(stock, ours, ["default_policy"])


def test_multi_agent_two_modules_parity(multi_agent):
    stock = multi_agent.run(multi_agent.stock_pipeline())
    ours = multi_agent.run(multi_agent.learner._learner_connector)
    _assert_parity(stock, ours, ["p0", "p1"])
    # The two modules have different weights and data: each got its own values.
    assert not torch.equal(
        ours["p0"][Postprocessing.VALUE_TARGETS][:10], ours["p1"][Postprocessing.VALUE_TARGETS][:10]
    )


def test_lstm_zero_padded_parity(lstm):
    stock = lstm.run(lstm.stock_pipeline())
    episodes = copy.deepcopy(lstm.episodes)
    ours = lstm.learner._learner_connector(
        rl_module=lstm.learner.module, batch={}, episodes=episodes, shared_data={}, metrics=None
    )
    mid = "default_policy"
    assert ours[mid][Postprocessing.ADVANTAGES].shape[1] == 20  # [B, T], zero-padded
    _assert_parity(stock, ours, [mid])
    # Padding cells (per RLlib's own split_and_zero_pad_n_episodes) hold zeros.
    lens = [len(e) for e in episodes]  # with the bootstrap step added by the pipeline
    real = np.stack(split_and_zero_pad_n_episodes(np.ones(sum(lens)), lens, 20)).astype(bool)
    assert real.shape == ours[mid][Postprocessing.ADVANTAGES].shape and (~real).any()
    for key in (Postprocessing.ADVANTAGES, Postprocessing.VALUE_TARGETS):
        assert np.all(ours[mid][key].numpy()[~real] == 0.0)


def _compiled_only(case: Case, mode: str) -> dict:
    """Our pipeline with ``standardize_advantages=mode`` (same pieces, same module)."""
    pipeline = case.stock_pipeline()
    pipeline.insert_after(
        GeneralAdvantageEstimation,
        CompiledGAE(gamma=GAMMA, lambda_=LAMBDA, standardize_advantages=mode),
    )
    pipeline.remove(GeneralAdvantageEstimation)
    return case.run(pipeline)


def test_standardize_none_gives_raw_advantages(cartpole):
    mid = "default_policy"
    raw = _compiled_only(cartpole, "none")[mid]
    with torch.no_grad():
        values = cartpole.learner.module[mid].compute_values(raw)
    np.testing.assert_allclose(
        raw[Postprocessing.ADVANTAGES].numpy(),
        (raw[Postprocessing.VALUE_TARGETS] - values).numpy(),
        rtol=1e-6,
        atol=1e-6,
    )
    stock = cartpole.run(cartpole.stock_pipeline())[mid]
    mask = stock[Columns.LOSS_MASK].numpy()
    np.testing.assert_allclose(
        raw[Postprocessing.VALUE_TARGETS].numpy()[mask],
        stock[Postprocessing.VALUE_TARGETS].numpy()[mask],
        rtol=1e-5,
        atol=1e-5,
    )


def test_standardize_masked_uses_loss_rows_only(cartpole):
    mid = "default_policy"
    raw = _compiled_only(cartpole, "none")[mid]
    masked = _compiled_only(cartpole, "masked")[mid]
    mask = masked[Columns.LOSS_MASK].numpy()
    assert (~mask).sum() > 0  # there are bootstrap rows to leave out
    raw_adv = raw[Postprocessing.ADVANTAGES].numpy()
    sel = raw_adv[mask]
    expected = (raw_adv - sel.mean()) / max(1e-4, sel.std())
    np.testing.assert_allclose(
        masked[Postprocessing.ADVANTAGES].numpy(), expected, rtol=1e-5, atol=1e-5
    )
    adv = masked[Postprocessing.ADVANTAGES].numpy()[mask]
    assert abs(adv.mean()) < 1e-5 and abs(adv.std() - 1.0) < 1e-4
    # "all" (RLlib) includes the bootstrap rows, so it differs from "masked".
    stock = cartpole.run(cartpole.stock_pipeline())[mid][Postprocessing.ADVANTAGES].numpy()
    assert np.abs(stock[mask] - adv).max() > 1e-3


def test_rejects_unknown_standardize_mode():
    with pytest.raises(ValueError, match="standardize_advantages='sometimes'"):
        CompiledGAE(gamma=0.99, lambda_=0.95, standardize_advantages="sometimes")


# -- the pipeline CompiledGAE may sit in (forward compatibility with RLlib's GAE rewrite) --


def _pipeline_of(*names: str) -> object:
    import types

    return types.SimpleNamespace(connectors=[type(name, (), {})() for name in names])


def test_compiled_gae_accepts_rllibs_default_order() -> None:
    from rllib_ext.connectors.gae import check_bootstrap_step_before_gae

    check_bootstrap_step_before_gae(
        _pipeline_of(
            "AddObservationsFromEpisodesToBatch",
            "AddOneTsToEpisodesAndTruncate",
            "BatchIndividualItems",
            "GeneralAdvantageEstimation",
        )
    )


def test_compiled_gae_refuses_a_pipeline_without_the_bootstrap_step() -> None:
    """As after ray#61319: a new first piece, no AddOneTsToEpisodesAndTruncate."""
    import ray

    from rllib_ext.connectors.gae import check_bootstrap_step_before_gae

    pipeline = _pipeline_of(
        "EpisodeIdDeduplication", "AddObservationsFromEpisodesToBatch", "GeneralAdvantageEstimation"
    )
    with pytest.raises(ValueError) as raised:
        check_bootstrap_step_before_gae(pipeline)
    message = str(raised.value)
    assert "\n" not in message
    assert f"Ray {ray.__version__}" in message
    assert "AddOneTsToEpisodesAndTruncate" in message and "Fix: gae='rllib'" in message
