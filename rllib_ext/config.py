"""Drop-in ``PPOConfig`` / ``PPO`` subclasses that take the extension flags.

``rllib_ext.PPOConfig().training(gae="vectorized", lambda_=0.95)`` behaves exactly like
RLlib's ``PPOConfig.training`` for every RLlib argument and additionally accepts the
extension flags of :mod:`rllib_ext.settings` plus the 2023 tutorial's old names
(``num_sgd_iter``, ``sgd_minibatch_size``). The flags are stored in the config's
``learner_config_dict``, which RLlib already carries through ``copy()``, ``to_dict()``,
checkpoints and Ray Tune; the learner class is pinned in ``_learner_class`` for the same
reason (Tune rebuilds a plain ``PPOConfig`` from the dict when given the ``"PPO"`` trainable).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.algorithms.ppo import PPO as _RLlibPPO
from ray.rllib.algorithms.ppo import PPOConfig as _RLlibPPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.annotations import override

from rllib_ext.settings import (
    ExtensionSettings,
    check_comm_resources,
    extension_keys,
    split_extension_kwargs,
)

__all__ = ["PPO", "PPOConfig"]

logger = logging.getLogger(__name__)


def _training_parameters() -> frozenset[str]:
    names: set[str] = set()
    for cls in (_RLlibPPOConfig, AlgorithmConfig):
        sig = inspect.signature(cls.training)
        names.update(
            p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
        )
    return frozenset(names)


_RLLIB_TRAINING_KEYS = _training_parameters()
_MODEL_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(DefaultModelConfig))


def _check_unit_interval(name: str, value: Any) -> None:
    if value is NotProvided or value is None:
        return
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(
            f"{name}={value!r} is out of range; allowed: a number in [0, 1]. "
            f"Fix: pass e.g. .training({name}={0.95 if name == 'lambda_' else 0.99})."
        )


def _model_overrides(model: Any) -> dict[str, Any]:
    """The entries of an old-stack ``model`` dict that the new stack's model_config must get.

    Entries equal to the old stack's ``MODEL_DEFAULTS`` are dropped (``to_dict()``/``from_dict``
    round trips carry the whole old default dict); other entries must be ``DefaultModelConfig``
    fields, otherwise RLlib would ignore them silently.
    """
    from ray.rllib.models.catalog import MODEL_DEFAULTS

    if not isinstance(model, dict):
        raise ValueError(
            f"model={model!r} must be a dict of DefaultModelConfig fields, e.g. "
            '{"fcnet_hiddens": [256, 256]}. Fix: pass a dict or use .rl_module(model_config=...).'
        )
    model = {k: v for k, v in model.items() if not (k in MODEL_DEFAULTS and MODEL_DEFAULTS[k] == v)}
    unknown = sorted(set(model) - _MODEL_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"model keys {unknown} are not RLModule model_config fields on RLlib's new API stack "
            f"(allowed: {', '.join(sorted(_MODEL_CONFIG_KEYS))}). Fix: drop them or move custom "
            "models to .rl_module(rl_module_spec=...)."
        )
    return model


def add_callback(config: AlgorithmConfig, callback: type) -> None:
    """Adds ``callback`` to ``config.callbacks_class`` unless it (or a subclass) is there.

    Keeps the user's callbacks; RLlib's do-nothing default ``RLlibCallback`` is replaced.
    """
    from ray.rllib.callbacks.callbacks import RLlibCallback

    existing = config.callbacks_class
    classes = list(existing) if isinstance(existing, (list, tuple)) else [existing]
    if any(isinstance(c, type) and issubclass(c, callback) for c in classes):
        return
    classes = [c for c in classes if c not in (None, RLlibCallback)] + [callback]
    config.callbacks(classes if len(classes) > 1 else classes[0])


SHARED_POLICY_ID = "shared_policy"
"""The policy every SMAC agent maps to when the config leaves policies unset."""


def shared_policy_mapping(agent_id: Any, *args: Any, **kwargs: Any) -> str:
    """Policy mapping of parameter sharing: every agent -> :data:`SHARED_POLICY_ID`."""
    return SHARED_POLICY_ID


class PPOConfig(_RLlibPPOConfig):
    """RLlib's ``PPOConfig`` plus the rllib_ext flags (see :mod:`rllib_ext.settings`)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PPO)
        from rllib_ext.learners.ppo import PPOExtTorchLearner

        # Pinned (not only returned by get_default_learner_class) so that it survives
        # `to_dict()` -> plain PPOConfig, which is what Tune does with a config subclass.
        self._learner_class = PPOExtTorchLearner
        self.learner_config_dict.update(ExtensionSettings().to_flat())

    @override(_RLlibPPOConfig)
    def training(self, **kwargs: Any) -> PPOConfig:
        """RLlib's ``training()`` plus the extension flags.

        Extension flags: see ``rllib_ext.settings.extension_keys()``. Old names accepted:
        ``num_sgd_iter`` -> ``num_epochs``, ``sgd_minibatch_size`` -> ``minibatch_size``.

        Raises:
            ValueError: for an unknown keyword or a bad extension value.
        """
        ext, rest = split_extension_kwargs(kwargs)
        for key in rest:
            if key not in _RLLIB_TRAINING_KEYS:
                raise ValueError(
                    f"Unknown training() argument {key!r}. It is neither an RLlib PPO setting "
                    f"nor an rllib_ext flag ({', '.join(extension_keys())}). Fix: check the "
                    "spelling; old RLlib names are listed in the rllib_ext README."
                )
        _check_unit_interval("lambda_", rest.get("lambda_", NotProvided))
        _check_unit_interval("gamma", rest.get("gamma", NotProvided))
        model = rest.get("model", NotProvided)
        if model is not NotProvided and model is not None:
            model = _model_overrides(model)
        # Validate everything before applying anything: a bad call changes nothing.
        ExtensionSettings.from_flat({**self._extension_flat(), **ext}, where="training()")
        super().training(**rest)
        if model is not NotProvided and model:
            # On the new API stack `training(model=...)` is silently ignored by RLlib; the
            # tutorial's `model={"fcnet_hiddens": ...}` means the RLModule's model_config.
            self.rl_module(model_config={**self._model_config_dict(), **model})
        self.learner_config_dict.update(ext)
        return self

    def _model_config_dict(self) -> dict[str, Any]:
        mc = self._model_config
        return dict(mc) if isinstance(mc, dict) else dataclasses.asdict(mc)

    def _extension_flat(self) -> dict[str, Any]:
        keys = set(extension_keys())
        return {k: v for k, v in self.learner_config_dict.items() if k in keys}

    @property
    def extension_settings(self) -> ExtensionSettings:
        """The validated extension settings this config will give its learners."""
        return ExtensionSettings.from_learner_config_dict(self.learner_config_dict)

    @override(_RLlibPPOConfig)
    def get_default_learner_class(self) -> type:
        from rllib_ext.learners.ppo import PPOExtTorchLearner

        return PPOExtTorchLearner

    @override(_RLlibPPOConfig)
    def validate(self) -> None:
        self._setup_smac()
        if self.extension_settings.amp.amp_inference:
            self._use_amp_env_runners()
        super().validate()
        _check_unit_interval("lambda_", self.lambda_)
        _check_unit_interval("gamma", self.gamma)
        # Raises a ValueError naming key/allowed values for bad dict-route input
        # (`update_from_dict`, Tune param spaces, YAML files).
        settings = ExtensionSettings.from_learner_config_dict(self.learner_config_dict)
        for message in check_comm_resources(
            settings.comm,
            num_learners=self.num_learners,
            num_gpus_per_learner=self.num_gpus_per_learner,
        ):
            logger.warning(message)

    def _setup_smac(self) -> None:
        """For a SMAC env, fills in what the user left at RLlib's defaults (idempotent).

        * policies: one ``"shared_policy"`` for all agents (parameter sharing, the SMAC norm);
        * RLModule: :class:`~rllib_ext.modules.MaskedPPOTorchRLModule` per policy, with the
          central critic when ``.rl_module(model_config={"central_critic": True})``;
        * callbacks: :class:`~rllib_ext.envs.smac.SMACMetricsCallback` added (``win_rate``...).

        Explicit ``.multi_agent()``, ``.rl_module(rl_module_spec=...)`` and callbacks are kept.
        """
        from rllib_ext.envs import is_smac_env

        if not is_smac_env(self.env):
            return
        from rllib_ext.envs.smac import SMACMetricsCallback
        from rllib_ext.modules import CENTRAL_CRITIC_KEY, smac_module_spec

        if not self.is_multi_agent:
            self.multi_agent(policies={SHARED_POLICY_ID}, policy_mapping_fn=shared_policy_mapping)
        if self._rl_module_spec is None:
            central = bool(self._model_config_dict().get(CENTRAL_CRITIC_KEY, False))
            self.rl_module(
                rl_module_spec=smac_module_spec(
                    policy_ids=sorted(self.policies), central_critic=central
                )
            )
        add_callback(self, SMACMetricsCallback)

    def _use_amp_env_runners(self) -> None:
        from rllib_ext.env_runners import AMPMultiAgentEnvRunner, AMPSingleAgentEnvRunner

        wanted = AMPMultiAgentEnvRunner if self.is_multi_agent else AMPSingleAgentEnvRunner
        if self.env_runner_cls is None:
            self.env_runner_cls = wanted
        elif not issubclass(self.env_runner_cls, wanted):
            raise ValueError(
                f"amp_inference=True needs env_runner_cls={wanted.__name__} (or a subclass), "
                f"got {self.env_runner_cls.__name__}. Fix: derive your env runner from "
                f"rllib_ext.env_runners.{wanted.__name__} or set amp_inference=False."
            )


class PPO(_RLlibPPO):
    """RLlib's PPO whose default config is :class:`rllib_ext.PPOConfig`.

    Use it as the Tune trainable (``tune.Tuner(rllib_ext.PPO, param_space=config)``) so the
    extension survives Tune's dict round-trip.
    """

    @classmethod
    @override(_RLlibPPO)
    def get_default_config(cls) -> PPOConfig:
        return PPOConfig()
