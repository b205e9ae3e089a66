"""``rllib_ext.compat.PPOConfig`` / ``PPO``: rllib_ext's classes plus the 2023 tutorial API.

The tutorial's chapters run on these with only their imports changed
(``from rllib_ext.compat import PPOConfig``). Composed from rllib_ext's own classes and the 2023
layer of this package, never by patching Ray:

* :class:`PPOConfig` = :class:`~rllib_ext.compat.config.LegacyAPIMixin` (``.rollouts()``,
  ``.resources(num_gpus=, num_cpus=)``, old dict keys, ``communication_type``,
  ``resources_total``, ``RLLIB_EXT_FIT_RESOURCES``) + :class:`rllib_ext.PPOConfig`, whose
  ``.training()`` here also takes the old keywords (:mod:`rllib_ext.compat.training_kwargs`:
  ``num_sgd_iter``, ``sgd_minibatch_size``, ``fp16``, ``fp16_loss_scaling``, the
  ``communication`` block) and maps ``model={...}`` onto the RLModule's ``model_config``;
* :class:`PPO` = :class:`~rllib_ext.compat.algorithm.LegacyAlgorithmMixin` (old result names,
  a one-line error for a request the cluster cannot grant) + :class:`rllib_ext.PPO`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
from rllib_ext.compat.config import LegacyAPIMixin
from rllib_ext.compat.training_kwargs import split_extension_kwargs
from rllib_ext.config import PPO as _ExtPPO
from rllib_ext.config import PPOConfig as _ExtPPOConfig
from rllib_ext.config import non_default_model

__all__ = ["PPO", "PPOConfig"]

_MODEL_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(DefaultModelConfig))


def model_overrides(model: Any) -> dict[str, Any]:
    """The entries of a 2023 ``model`` dict that the new stack's ``model_config`` must get.

    Entries equal to the old stack's ``MODEL_DEFAULTS`` are dropped (``to_dict()``/``from_dict``
    round trips carry the whole old default dict); other entries must be ``DefaultModelConfig``
    fields, otherwise RLlib would ignore them silently.

    Raises:
        ValueError: for a value that is not a dict, or keys ``DefaultModelConfig`` lacks.
    """
    if not isinstance(model, dict):
        raise ValueError(
            f"model={model!r} must be a dict of DefaultModelConfig fields, e.g. "
            '{"fcnet_hiddens": [256, 256]}. Fix: pass a dict or use .rl_module(model_config=...).'
        )
    model = non_default_model(model)
    unknown = sorted(set(model) - _MODEL_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"model keys {unknown} are not RLModule model_config fields on RLlib's new API stack "
            f"(allowed: {', '.join(sorted(_MODEL_CONFIG_KEYS))}). Fix: drop them or move custom "
            "models to .rl_module(rl_module_spec=...)."
        )
    return model


class PPOConfig(LegacyAPIMixin, _ExtPPOConfig):
    """:class:`rllib_ext.PPOConfig` with the 2023 tutorial API (see the module docstring)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PPO)

    @override(_ExtPPOConfig)
    def training(self, **kwargs: Any) -> PPOConfig:
        """rllib_ext's ``training()`` plus the 2023 keywords.

        ``num_sgd_iter`` -> ``num_epochs``, ``sgd_minibatch_size`` -> ``minibatch_size``,
        ``fp16=True`` -> ``amp="fp16"``, ``fp16_loss_scaling`` -> ``amp_init_scale``,
        ``communication={...}`` -> ``grad_compression``/``grad_clip``/``communication_type``,
        ``model={...}`` -> ``.rl_module(model_config=...)`` (RLlib's new stack ignores it).

        Raises:
            ValueError: an alias given with its new name, a bad old value, an unknown keyword.
        """
        ext, rest = split_extension_kwargs(kwargs)
        model = rest.pop("model", NotProvided)
        if model is not NotProvided and model is not None:
            model = model_overrides(model)
        super().training(**ext, **rest)
        if model is not NotProvided and model:
            self.rl_module(model_config={**self._model_config_dict(), **model})
        return self

    def _model_config_dict(self) -> dict[str, Any]:
        mc = private.user_model_config(self)
        return dict(mc) if isinstance(mc, dict) else dataclasses.asdict(mc)


class PPO(LegacyAlgorithmMixin, _ExtPPO):
    """:class:`rllib_ext.PPO` with the 2023 result names; its default config is :class:`PPOConfig`.

    The trainable ``rllib_ext.tune.run("PPO", ...)`` runs.
    """

    @classmethod
    @override(_ExtPPO)
    def get_default_config(cls) -> PPOConfig:
        return PPOConfig()
