"""The 2023 behaviour of the ``PPO`` trainable: old result names, a resource check before Tune waits.

:class:`LegacyAlgorithmMixin` sits in ``rllib_ext.compat.PPO``'s bases before :class:`rllib_ext.PPO`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.utils.annotations import override

from rllib_ext.compat.metrics import add_legacy_metrics
from rllib_ext.compat.resources import check_request

__all__ = ["LegacyAlgorithmMixin"]


if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm as _AlgorithmBase
else:
    _AlgorithmBase = object


class LegacyAlgorithmMixin(_AlgorithmBase):
    """Old metric names in every result; an unfulfillable Tune request fails in one line."""

    @override(Algorithm)
    def log_result(self, result: dict) -> None:
        # Before RLlib's on_train_result callbacks, so they (and Tune's stop rules) see the names.
        add_legacy_metrics(result)
        super().log_result(result)

    @classmethod
    @override(Algorithm)
    def default_resource_request(cls, config: Any) -> Any:
        """RLlib's placement group for the trial, after checking that Ray can ever grant it.

        Raises:
            ValueError: the request (main process + env runners + learners) exceeds the
                cluster; Tune would otherwise keep the trial pending forever.
        """
        request = super().default_resource_request(config)
        if isinstance(config, AlgorithmConfig):
            built = config
        else:
            built = cls.get_default_config().update_from_dict(config)
        check_request(built, include_main=True)
        return request
