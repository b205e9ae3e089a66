"""The learner connector pieces ``PPOExtTorchLearner`` installs into RLlib's learner pipeline.

Each function takes a built learner (its pipeline is RLlib's ``PPOLearner`` one, GAE last) and
changes the pipeline in place, or leaves it as it is where the pipeline is not RLlib's default
(aggregator actors, ``add_default_connectors_to_learner_pipeline=False``):

* :func:`install_compiled_gae`: ``CompiledGAE`` in place of RLlib's ``GeneralAdvantageEstimation``;
* :func:`install_vectorized_batching_pieces`: ``VectorizedEpisodesToBatch`` in place of RLlib's
  episodes-to-batch pieces;
* :func:`install_module_options`: ``DeathMask`` before and ``UpdateValueNorm`` after the GAE
  piece, where a module asks (``model_config`` ``death_masking`` / ``value_norm``).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.connectors.learner import GeneralAdvantageEstimation

from rllib_ext import _rllib_private as private
from rllib_ext.connectors.batching import install_vectorized_batching
from rllib_ext.connectors.death_mask import DeathMask
from rllib_ext.connectors.gae import CompiledGAE, check_bootstrap_step_before_gae
from rllib_ext.connectors.value_norm import UpdateValueNorm, value_norms
from rllib_ext.modules.learner_options import LearnerOptionsAPI, wants_death_masking
from rllib_ext.settings import BatchingSettings, GAESettings

__all__ = ["install_compiled_gae", "install_module_options", "install_vectorized_batching_pieces"]

logger = logging.getLogger("rllib_ext.learners.ppo")


def _default_pipeline(learner: Any) -> Any:
    pipeline = private.learner_connector(learner)
    if pipeline is None or not learner.config.add_default_connectors_to_learner_pipeline:
        return None
    return pipeline


def install_vectorized_batching_pieces(learner: Any, settings: BatchingSettings) -> None:
    """``batching="vectorized"``: RLlib's batching pieces fused (INFO where the order differs)."""
    pipeline = _default_pipeline(learner)
    if settings.batching != "vectorized" or pipeline is None:
        return
    if not install_vectorized_batching(pipeline, multi_agent=learner.config.is_multi_agent):
        logger.info(
            "batching='vectorized': the learner pipeline is not RLlib's default order "
            "(custom learner_connector pieces?); RLlib's batching pieces are kept."
        )


def install_compiled_gae(learner: Any, settings: GAESettings) -> None:
    """``gae="compiled"``: ``CompiledGAE`` where ``PPOLearner.build`` appended RLlib's piece."""
    pipeline = _default_pipeline(learner)
    if settings.gae != "compiled" or pipeline is None:
        return
    check_bootstrap_step_before_gae(pipeline)
    pipeline.insert_after(
        GeneralAdvantageEstimation,
        CompiledGAE(
            gamma=learner.config.gamma,
            lambda_=learner.config.lambda_,
            standardize_advantages=settings.standardize_advantages,
        ),
    )
    pipeline.remove(GeneralAdvantageEstimation)


def install_module_options(learner: Any) -> None:
    """``DeathMask`` before and ``UpdateValueNorm`` after the GAE piece, where modules ask; each
    piece once, so calling it again (a module added later) adds only what is missing.

    Raises:
        ValueError: a module asks, but the learner has no pipeline with a GAE piece.
    """
    modules = learner.module
    want_mask = any(wants_death_masking(modules[mid].unwrapped()) for mid in modules.keys())
    want_norm = bool(value_norms(modules))
    if not (want_mask or want_norm):
        return
    pipeline = private.learner_connector(learner)
    pieces = [] if pipeline is None else list(pipeline.connectors)
    gae = next((p for p in pieces if isinstance(p, GeneralAdvantageEstimation)), None)
    if pipeline is None or gae is None:
        config = learner.config
        raise ValueError(
            "model_config death_masking=True / value_norm=True need the learner's own "
            "connector pipeline with its GAE piece, but it has none (num_aggregator_actors_"
            f"per_learner={config.num_aggregator_actors_per_learner}, add_default_"
            "connectors_to_learner_pipeline="
            f"{config.add_default_connectors_to_learner_pipeline}). Fix: keep "
            "num_aggregator_actors_per_learner=0 and the default connectors, or turn the "
            "options off."
        )
    classes = [type(p) for p in pieces]
    if want_mask and DeathMask not in classes:
        pipeline.insert_before(type(gae), DeathMask())
    if want_norm and UpdateValueNorm not in classes:
        pipeline.insert_after(type(gae), UpdateValueNorm())
    for mid in modules.keys():
        module = modules[mid].unwrapped()
        if isinstance(module, LearnerOptionsAPI):
            module.claim_learner_options()
