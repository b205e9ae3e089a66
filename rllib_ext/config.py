"""Drop-in ``PPOConfig`` / ``PPO`` subclasses that take the extension flags.

``rllib_ext.PPOConfig().training(gae="compiled", lambda_=0.95)`` behaves exactly like
RLlib's ``PPOConfig.training`` for every RLlib argument and additionally accepts the
extension flags of :mod:`rllib_ext.settings` plus the 2023 tutorial's old names
(``num_sgd_iter``, ``sgd_minibatch_size``). The flags are stored in the config's
``learner_config_dict``, which RLlib already carries through ``copy()``, ``to_dict()``,
checkpoints and Ray Tune; the learner class is pinned with ``.learners(learner_class=...)`` for the same
reason (Tune rebuilds a plain ``PPOConfig`` from the dict when given the ``"PPO"`` trainable).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.algorithms.ppo import PPO as _RLlibPPO
from ray.rllib.algorithms.ppo import PPOConfig as _RLlibPPOConfig
from ray.rllib.core import COMPONENT_METRICS_LOGGER
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.models.catalog import MODEL_DEFAULTS
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.compat.algorithm import LegacyAlgorithmMixin
from rllib_ext.compat.config import LegacyAPIMixin
from rllib_ext.compat.training_kwargs import split_extension_kwargs
from rllib_ext.config_checks import check_algorithm_config, check_rates
from rllib_ext.envs import register_envs
from rllib_ext.learners.checkpoint_state import (
    METRICS_STATE_KEY,
    merged_metrics_state,
    split_metrics_state,
)
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.runner_table import apply_env_runner_table
from rllib_ext.settings import ExtensionSettings, extension_keys
from rllib_ext.smac_config import apply_smac_defaults, smac_default_rl_module_spec

__all__ = ["PPO", "PPOConfig"]


def _training_parameters() -> frozenset[str]:
    names: set[str] = set()
    for cls in (LegacyAPIMixin, _RLlibPPOConfig, AlgorithmConfig):
        sig = inspect.signature(cls.training)
        names.update(
            p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
        )
    return frozenset(names)


_RLLIB_TRAINING_KEYS = _training_parameters()
_MODEL_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(DefaultModelConfig))


def _model_overrides(model: Any) -> dict[str, Any]:
    """The entries of an old-stack ``model`` dict that the new stack's model_config must get.

    Entries equal to the old stack's ``MODEL_DEFAULTS`` are dropped (``to_dict()``/``from_dict``
    round trips carry the whole old default dict); other entries must be ``DefaultModelConfig``
    fields, otherwise RLlib would ignore them silently.
    """
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


def _then_apply_derived(name: str) -> Callable[..., Any]:
    """``PPOConfig.<name>``: the next class's setter ``name`` (the 2023 layer, then RLlib's),
    then :meth:`PPOConfig._apply_derived_settings`; returns the config, like RLlib's setters."""

    @functools.wraps(getattr(AlgorithmConfig, name))
    def setter(self: PPOConfig, *args: Any, **kwargs: Any) -> PPOConfig:
        getattr(super(PPOConfig, self), name)(*args, **kwargs)
        self._apply_derived_settings()
        return self

    return override(AlgorithmConfig)(setter)


class PPOConfig(LegacyAPIMixin, _RLlibPPOConfig):
    """RLlib's ``PPOConfig`` plus the rllib_ext flags (see :mod:`rllib_ext.settings`)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PPO)
        # Pinned (not only returned by get_default_learner_class) so that it survives
        # `to_dict()` -> plain PPOConfig, which is what Tune does with a config subclass.
        self.learners(learner_class=PPOExtTorchLearner)
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
        check_rates({k: rest[k] for k in ("lambda_", "gamma") if rest.get(k) is not None})
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
        self._apply_derived_settings()
        return self

    def _model_config_dict(self) -> dict[str, Any]:
        mc = private.user_model_config(self)
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
        return PPOExtTorchLearner

    @override(_RLlibPPOConfig)
    def validate(self) -> None:
        """RLlib's checks plus :func:`rllib_ext.config_checks.check_algorithm_config`.

        Reads the config and changes nothing; what rllib_ext fills in (SMAC policies and
        callback, the AMP env runner) is set with the flags, see ``_apply_derived_settings``.
        """
        super().validate()
        # Errors only: the learner logs the warnings, once per run.
        check_algorithm_config(self)

    # -- what the flags imply, set when they are set (never in validate) -----------------------

    @override(_RLlibPPOConfig)
    def get_default_rl_module_spec(self) -> Any:
        return smac_default_rl_module_spec(self) or super().get_default_rl_module_spec()

    # RLlib's setters whose values the derived settings depend on: each runs, then those follow.
    environment = _then_apply_derived("environment")
    multi_agent = _then_apply_derived("multi_agent")
    callbacks = _then_apply_derived("callbacks")
    learners = _then_apply_derived("learners")
    env_runners = _then_apply_derived("env_runners")
    offline_data = _then_apply_derived("offline_data")
    update_from_dict = _then_apply_derived("update_from_dict")

    def _apply_derived_settings(self) -> None:
        """Fills in what the flags imply; idempotent, explicit user choices are kept.

        * SMAC env: shared policy + SMAC metrics callback (:mod:`rllib_ext.smac_config`);
        * the env-runner class, from the one runner table (:mod:`rllib_ext.runner_table`: a
          user's class and RLlib's offline recording are kept, else the batched SMAX runner,
          the fused single-agent runner, the AMP runner or RLlib's default).
        """
        apply_smac_defaults(self)
        apply_env_runner_table(self)


class PPO(LegacyAlgorithmMixin, _RLlibPPO):
    """RLlib's PPO whose default config is :class:`rllib_ext.PPOConfig`.

    Use it as the Tune trainable (``tune.Tuner(rllib_ext.PPO, param_space=config)``) so the
    extension survives Tune's dict round-trip.
    """

    @classmethod
    @override(_RLlibPPO)
    def get_default_config(cls) -> PPOConfig:
        return PPOConfig()

    @override(Algorithm)
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if COMPONENT_METRICS_LOGGER in state:
            # Ours apart: stock RLlib restoring this checkpoint must not report them.
            state[COMPONENT_METRICS_LOGGER], ours = split_metrics_state(
                state[COMPONENT_METRICS_LOGGER]
            )
            state[METRICS_STATE_KEY] = ours
        return state

    @override(Algorithm)
    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if state.get(METRICS_STATE_KEY):
            self.metrics.set_state(
                merged_metrics_state(self.metrics.get_state(), state[METRICS_STATE_KEY])
            )


# `from rllib_ext.config import PPOConfig` registers the SMAC env names like `rllib_ext.PPOConfig`.
register_envs()
