"""The 2023 RLlib API that the tutorial (and most RLlib posts of that time) uses, in one place.

Mapped onto RLlib's new API stack through rllib_ext's own classes, never by patching Ray:

* :class:`LegacyAPIMixin` (in ``rllib_ext.PPOConfig``): ``.rollouts()``, ``.resources(num_gpus=,
  num_cpus=...)``, old dict keys, ``resources_total``;
* :class:`LegacyAlgorithmMixin` (in ``rllib_ext.PPO``): ``episode_reward_mean`` & co. in every
  result, a one-line error instead of an endless wait for missing hardware;
* :mod:`rllib_ext.tune`: ``tune.run("PPO", ..., local_dir=..., resources_per_trial=...)``;
* ``RLLIB_EXT_FIT_RESOURCES=1``: scale a request to the machine.

The README's "Tutorial API" table lists every mapping and every refusal.
"""

from __future__ import annotations

from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
from rllib_ext.compat.config import AgentIdMapping, LegacyAPIMixin
from rllib_ext.compat.metrics import (
    LEGACY_METRICS,
    add_legacy_metrics,
    legacy_metrics_on_train_result,
)
from rllib_ext.compat.resources import (
    FIT_RESOURCES_ENV,
    check_request,
    fit_resources_enabled,
    fit_to_machine,
    learners_for_num_gpus,
    resource_request,
)

__all__ = [
    "FIT_RESOURCES_ENV",
    "LEGACY_METRICS",
    "AgentIdMapping",
    "LegacyAPIMixin",
    "LegacyAlgorithmMixin",
    "add_legacy_metrics",
    "check_request",
    "fit_resources_enabled",
    "fit_to_machine",
    "learners_for_num_gpus",
    "legacy_metrics_on_train_result",
    "resource_request",
]
