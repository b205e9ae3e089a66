"""``PPOExtTorchLearner``: RLlib's PPO torch learner with the rllib_ext components."""

from __future__ import annotations

import logging

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from ray.rllib.utils.annotations import override

from rllib_ext.connectors.gae import VectorizedGAE
from rllib_ext.settings import ExtensionSettings

__all__ = ["PPOExtTorchLearner"]

logger = logging.getLogger(__name__)


class PPOExtTorchLearner(PPOTorchLearner):
    """PPO torch learner that reads its components from ``config.learner_config_dict``.

    Works with ``rllib_ext.PPOConfig`` and with the stock config
    (``.learners(learner_class=PPOExtTorchLearner, learner_config_dict={...})``).
    """

    ext_settings: ExtensionSettings

    @override(PPOTorchLearner)
    def build(self) -> None:
        # Validate first: a bad flag must fail before any module or optimizer is built.
        self.ext_settings = ExtensionSettings.from_learner_config_dict(
            self.config.learner_config_dict
        )
        super().build()
        self._install_gae()

    def _install_gae(self) -> None:
        gae = self.ext_settings.gae
        if (
            gae.gae != "vectorized"
            or self._learner_connector is None
            or not self.config.add_default_connectors_to_learner_pipeline
        ):
            return
        # PPOLearner.build appended RLlib's GAE piece last; put ours in its place.
        self._learner_connector.insert_after(
            GeneralAdvantageEstimation,
            VectorizedGAE(
                gamma=self.config.gamma,
                lambda_=self.config.lambda_,
                standardize_advantages=gae.standardize_advantages,
            ),
        )
        self._learner_connector.remove(GeneralAdvantageEstimation)
