"""The 2023 RLlib API that the tutorial (and most RLlib posts of that time) uses, in one place.

Opt in with ``from rllib_ext.compat import PPOConfig`` (and ``PPO``): :class:`rllib_ext.PPOConfig`
is RLlib's config plus rllib_ext's flags only. Mapped onto RLlib's new API stack through
rllib_ext's own classes, never by patching Ray:

* :class:`PPOConfig` / :class:`PPO` (:mod:`rllib_ext.compat.ppo`): rllib_ext's classes with the
  two mixins below and the old ``.training()`` keywords;
* :class:`LegacyAPIMixin` (in :class:`PPOConfig`): ``.rollouts()``, ``.resources(num_gpus=,
  num_cpus=...)``, old dict keys, ``resources_total``;
* :class:`LegacyAlgorithmMixin` (in :class:`PPO`): ``episode_reward_mean`` & co. in every
  result, a one-line error instead of an endless wait for missing hardware;
* :mod:`rllib_ext.tune`: ``tune.run("PPO", ..., local_dir=..., resources_per_trial=...)``, where
  ``"PPO"`` is :class:`PPO`;
* ``RLLIB_EXT_FIT_RESOURCES=1``: scale a request to the machine;
* :mod:`rllib_ext.compat.training_kwargs`: the old ``.training()`` keywords (``num_sgd_iter``,
  ``fp16``, the ``communication`` block).

Names load on first use (no Ray import until then: the command line reads the keyword
aliases for ``--help``). The README's "Tutorial API" table lists every mapping and every refusal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rllib_ext._versions import warn_if_untested

if TYPE_CHECKING:
    from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
    from rllib_ext.compat.config import AgentIdMapping, LegacyAPIMixin
    from rllib_ext.compat.metrics import (
        LEGACY_METRICS,
        add_legacy_metrics,
        legacy_metrics_on_train_result,
    )
    from rllib_ext.compat.ppo import PPO, PPOConfig
    from rllib_ext.compat.resources import (
        FIT_RESOURCES_ENV,
        check_request,
        fit_resources_enabled,
        fit_to_machine,
        learners_for_num_gpus,
        resource_request,
    )
    from rllib_ext.compat.training_kwargs import TRAINING_ALIASES, split_extension_kwargs

_HOMES = {
    "PPO": "ppo",
    "PPOConfig": "ppo",
    "LegacyAlgorithmMixin": "algorithm",
    "AgentIdMapping": "config",
    "LegacyAPIMixin": "config",
    "LEGACY_METRICS": "metrics",
    "add_legacy_metrics": "metrics",
    "legacy_metrics_on_train_result": "metrics",
    "FIT_RESOURCES_ENV": "resources",
    "check_request": "resources",
    "fit_resources_enabled": "resources",
    "fit_to_machine": "resources",
    "learners_for_num_gpus": "resources",
    "resource_request": "resources",
    "TRAINING_ALIASES": "training_kwargs",
    "split_extension_kwargs": "training_kwargs",
}

__all__ = [
    "FIT_RESOURCES_ENV",
    "LEGACY_METRICS",
    "TRAINING_ALIASES",
    "AgentIdMapping",
    "LegacyAPIMixin",
    "LegacyAlgorithmMixin",
    "PPO",
    "PPOConfig",
    "add_legacy_metrics",
    "check_request",
    "fit_resources_enabled",
    "fit_to_machine",
    "learners_for_num_gpus",
    "legacy_metrics_on_train_result",
    "resource_request",
    "split_extension_kwargs",
]


def __getattr__(name: str) -> Any:
    """Loads a public name from its submodule on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rllib_ext.compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rllib_ext.compat.{home}"), name)
    if home == "ppo":
        warn_if_untested()  # as for rllib_ext.PPOConfig; rllib_ext.config registers the env names
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
