"""RLlib's connector metrics for a fused single-agent call, logged once per call.

``SingleAgentEnvRunner._sample`` runs its env-to-module pipeline after the reset and every
step and its module-to-env pipeline after every forward; each run logs the pipeline's timer,
one timer per piece and (env-to-module) ``env_to_module_sum_episodes_length_in`` / ``_out``.
The fused loop does those pipelines' work in one pass per step, so it logs the same keys once
per call: each pipeline's mean seconds per step, spread evenly over the pieces of the runner's
pipeline (they sum to the pipeline's time, as RLlib's do), and the summed length of the envs'
episode chunks as RLlib's last env-to-module run of the call saw them.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.utils.metrics import (
    CONNECTOR_PIPELINE_TIMER,
    CONNECTOR_TIMERS,
    ENV_TO_MODULE_CONNECTOR,
    ENV_TO_MODULE_SUM_EPISODES_LENGTH_IN,
    ENV_TO_MODULE_SUM_EPISODES_LENGTH_OUT,
    MODULE_TO_ENV_CONNECTOR,
    TIMERS,
)
from ray.rllib.utils.metrics.utils import to_snake_case

from rllib_ext import _rllib_private as private

__all__ = ["log_connector_metrics"]


def log_connector_metrics(
    runner: Any, *, forwards: int, to_module_s: float, to_env_s: float, episodes_length: int
) -> None:
    """Logs the connector keys of ``runner``'s call: ``forwards`` policy steps that spent
    ``to_module_s`` / ``to_env_s`` seconds in total on the two pipelines' work, the envs'
    chunks summing to ``episodes_length`` steps at the call's end."""
    metrics = runner.metrics
    metrics.log_value(ENV_TO_MODULE_SUM_EPISODES_LENGTH_IN, episodes_length)
    metrics.log_value(ENV_TO_MODULE_SUM_EPISODES_LENGTH_OUT, episodes_length)
    if forwards <= 0:
        return
    for prefix, pipeline, seconds in (
        (ENV_TO_MODULE_CONNECTOR, private.env_to_module(runner), to_module_s),
        (MODULE_TO_ENV_CONNECTOR, private.module_to_env(runner), to_env_s),
    ):
        per_step = seconds / forwards
        metrics.log_value((prefix, CONNECTOR_PIPELINE_TIMER), per_step, reduce="ema")
        pieces = getattr(pipeline, "connectors", ())
        for piece in pieces:
            key = (prefix, TIMERS, CONNECTOR_TIMERS, to_snake_case(type(piece).__name__))
            metrics.log_value(key, per_step / len(pieces), reduce="ema")
