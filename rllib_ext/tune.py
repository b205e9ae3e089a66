"""Ray Tune with the 2023 tutorial's call shape: ``from rllib_ext import tune``.

``tune.run("PPO", config=..., stop={"episode_reward_mean": 450}, checkpoint_freq=10,
checkpoint_at_end=True, local_dir="./results", verbose=2, resources_per_trial=...)`` runs as
written:

* ``"PPO"`` is :class:`rllib_ext.compat.PPO` (old dict keys accepted, old result names
  reported); a class (``rllib_ext.PPO``, RLlib's ``PPO``) runs as given;
* ``local_dir`` (removed from Tune) becomes ``storage_path`` (made absolute);
* ``resources_per_trial`` is accepted for an RLlib trainable and not passed on: the trainable
  reserves its own placement group from the config (Tune refuses both at once), which is
  exactly ``config.resources_total``; the difference, if any, is logged;
* ``metric``/``mode`` default to ``"episode_reward_mean"``/``"max"`` for a trainable that reports
  the old names (``rllib_ext.compat.PPO``), ``"env_runners/episode_return_mean"``/``"max"`` for
  another RLlib trainable, so ``analysis.best_checkpoint`` works as the tutorial uses it;
* with ``RLLIB_EXT_FIT_RESOURCES=1`` the config is fitted to the machine here, in the driver
  (Ray's worker processes do not see the driver's environment variables);
* ``RLLIB_EXT_MAX_ITERATIONS=N`` adds a ``training_iteration`` stop of ``N`` (CI, smoke runs);
* everything else goes to :func:`ray.tune.run` unchanged. Every other name of ``ray.tune``
  (``Tuner``, ``RunConfig``...) is re-exported from here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any, TypeGuard

from ray import tune as _tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.tune import *  # noqa: F403 (the rest of Ray Tune, unchanged)
from ray.tune.stopper import CombinedStopper, FunctionStopper, Stopper

from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
from rllib_ext.compat.ppo import PPO
from rllib_ext.compat.resources import fit_resources_enabled, resource_request

__all__ = ["MAX_ITERATIONS_ENV", "iteration_cap", "resolve_trainable", "run"]

logger = logging.getLogger("rllib_ext.tune")

MAX_ITERATIONS_ENV = "RLLIB_EXT_MAX_ITERATIONS"
"""An integer ``N >= 1``: every :func:`run` also stops at ``training_iteration`` ``N``."""


def resolve_trainable(run_or_experiment: Any) -> Any:
    """``"PPO"`` -> :class:`rllib_ext.compat.PPO` (the 2023 API); anything else unchanged."""
    if run_or_experiment == "PPO":
        return PPO
    return run_or_experiment


def iteration_cap() -> int | None:
    """``RLLIB_EXT_MAX_ITERATIONS`` as an int, ``None`` when unset.

    Raises:
        ValueError: for a value that is not an integer >= 1.
    """
    raw = os.environ.get(MAX_ITERATIONS_ENV, "").strip()
    if not raw:
        return None
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(
            f"{MAX_ITERATIONS_ENV}={raw!r} must be an integer >= 1. Fix: e.g. "
            f"{MAX_ITERATIONS_ENV}=3, or unset it."
        )
    return cap


def _with_iteration_cap(stop: Any) -> Any:
    cap = iteration_cap()
    if cap is None:
        return stop
    logger.info("%s=%d: the run also stops at training_iteration %d.", MAX_ITERATIONS_ENV, cap, cap)
    if stop is None:
        return {"training_iteration": cap}
    if isinstance(stop, Mapping):
        capped = dict(stop)
        capped["training_iteration"] = min(cap, capped.get("training_iteration", cap))
        return capped
    first = stop if isinstance(stop, Stopper) else FunctionStopper(stop)
    return CombinedStopper(first, FunctionStopper(functools.partial(_reached, cap)))


def _reached(cap: int, trial_id: str, result: Mapping[str, Any]) -> bool:
    return result.get("training_iteration", 0) >= cap


def _is_rllib_trainable(trainable: Any) -> TypeGuard[type[Algorithm]]:
    return isinstance(trainable, type) and issubclass(trainable, Algorithm)


def run(
    run_or_experiment: Any,
    *,
    config: Any = None,
    stop: Any = None,
    local_dir: str | None = None,
    storage_path: str | None = None,
    resources_per_trial: Any = None,
    metric: str | None = None,
    mode: str | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`ray.tune.run` with the tutorial's arguments (see the module docstring).

    Returns:
        Tune's ``ExperimentAnalysis``.

    Raises:
        ValueError: for ``local_dir`` together with ``storage_path``, a bad
            ``RLLIB_EXT_MAX_ITERATIONS``, or a resource request the cluster cannot grant
            (from :class:`rllib_ext.compat.PPO`, naming ``RLLIB_EXT_FIT_RESOURCES=1``).
    """
    trainable = resolve_trainable(run_or_experiment)
    if local_dir is not None:
        if storage_path is not None:
            raise ValueError(
                f"local_dir={local_dir!r} and storage_path={storage_path!r} were both given; "
                "local_dir is Tune's old name of storage_path. Fix: pass only storage_path."
            )
        storage_path = os.path.abspath(local_dir)
        logger.warning(
            "local_dir=%r -> storage_path=%r (Tune's name since 2.7).", local_dir, storage_path
        )
    if _is_rllib_trainable(trainable):
        if config is not None and fit_resources_enabled():
            # Ray's worker processes do not see the driver's environment, so the fitting is
            # done here and travels in the config Tune hands the trial.
            config = trainable.get_default_config().update_from_dict(
                config.to_dict() if hasattr(config, "to_dict") else dict(config)
            )
        if resources_per_trial is not None:
            _explain_resources_per_trial(trainable, config, resources_per_trial)
            resources_per_trial = None
        if metric is None and mode is None:
            old_names = issubclass(trainable, LegacyAlgorithmMixin)
            metric = "episode_reward_mean" if old_names else "env_runners/episode_return_mean"
            mode = "max"
    return _tune.run(
        trainable,
        config=config,
        stop=_with_iteration_cap(stop),
        storage_path=storage_path,
        resources_per_trial=resources_per_trial,
        metric=metric,
        mode=mode,
        **kwargs,
    )


def _explain_resources_per_trial(trainable: type[Algorithm], config: Any, asked: Any) -> None:
    reserved = None
    if config is not None:
        built = (
            config
            if isinstance(config, AlgorithmConfig)
            else trainable.get_default_config().update_from_dict(dict(config))
        )
        reserved = resource_request(built).as_tune_resources()
    same = isinstance(asked, Mapping) and reserved is not None and dict(asked) == reserved
    logger.warning(
        "resources_per_trial=%r is not passed to Tune: %s reserves its own placement group "
        "from the config (main process + env runners + learners%s)%s.",
        asked,
        trainable.__name__,
        f" = {reserved}" if reserved is not None else "",
        "" if same or reserved is None else "; the config's own request is what the trial gets",
    )
