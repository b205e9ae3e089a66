"""Drop-in ``PPOConfig`` / ``PPO`` subclasses that take the extension flags.

``rllib_ext.PPOConfig().training(gae="compiled", lambda_=0.95)`` behaves exactly like
RLlib's ``PPOConfig.training`` for every RLlib argument and additionally accepts the
extension flags of :mod:`rllib_ext.settings`. The 2023 tutorial's API (``.rollouts()``,
``fp16=True``, dict configs with old keys...) is :mod:`rllib_ext.compat`; here a 2023 call behaves
as on RLlib's own config, except where RLlib would store a value and never read it: that fails
in one line naming ``rllib_ext.compat`` and the new name (:data:`LEGACY_DICT_KEYS`). The flags are stored in the config's
``learner_config_dict``, which RLlib already carries through ``copy()``, ``to_dict()``,
checkpoints and Ray Tune; the learner class is pinned with ``.learners(learner_class=...)`` for the same
reason (Tune rebuilds a plain ``PPOConfig`` from the dict when given the ``"PPO"`` trainable).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import DEPRECATED_VALUE, AlgorithmConfig, NotProvided
from ray.rllib.algorithms.ppo import PPO as _RLlibPPO
from ray.rllib.algorithms.ppo import PPOConfig as _RLlibPPOConfig
from ray.rllib.core import COMPONENT_METRICS_LOGGER
from ray.rllib.models.catalog import MODEL_DEFAULTS
from ray.rllib.utils.annotations import override
from ray.util import log_once

from rllib_ext.config_checks import check_algorithm_config, check_rates
from rllib_ext.envs import register_envs
from rllib_ext.learners.checkpoint_state import (
    METRICS_STATE_KEY,
    merged_metrics_state,
    split_metrics_state,
)
from rllib_ext.learners.ppo import PPOExtTorchLearner
from rllib_ext.runner_table import apply_env_runner_table
from rllib_ext.settings import REMOVED_KEYS, ExtensionSettings, extension_keys
from rllib_ext.smac_config import apply_smac_defaults, smac_default_rl_module_spec

__all__ = ["LEGACY_DICT_KEYS", "LEGACY_TRAINING_KEYS", "PPO", "PPOConfig", "non_default_model"]

logger = logging.getLogger("rllib_ext.config")

_USE_COMPAT = "use rllib_ext.compat.PPOConfig for the 2023 API, or"

LEGACY_TRAINING_KEYS: dict[str, str] = {
    "sgd_minibatch_size": "the new name minibatch_size=...",
    "fp16": "the new name amp='fp16'",
    "fp16_loss_scaling": "the new names amp='fp16', amp_init_scale=...",
    "communication": "the new names grad_compression=..., grad_clip=... (RLlib picks nccl/gloo)",
    "communication_type": "drop it (RLlib picks nccl between GPU learners, gloo between CPU ones)",
}
"""2023 ``.training()`` keywords that RLlib 2.60's ``PPOConfig.training`` does not take: a
``TypeError`` as there, naming the fix (``num_sgd_iter`` RLlib still maps itself, with its
deprecation warning)."""

LEGACY_DICT_KEYS: dict[str, str] = {
    "training": "put the block's keys at the top level of the dict",
    "communication": "the new names grad_compression and grad_clip at the top level",
    "communication_type": "drop it (RLlib picks nccl between GPU learners, gloo between CPU ones)",
    "num_sgd_iter": "the new name num_epochs",
    "sgd_minibatch_size": "the new name minibatch_size",
    "fp16": "the new name amp='fp16'",
    "fp16_loss_scaling": "the new name amp_init_scale (with amp='fp16')",
    "horizon": "a step limit in the env (gymnasium.wrappers.TimeLimit)",
    "num_gpus": "the new names .learners(num_learners=N, num_gpus_per_learner=1)",
}
"""2023 top-level dict keys that RLlib's ``update_from_dict`` stores but its new API stack never
reads (``"training"`` even hides the ``.training()`` method): refused with the fix. The values a
``to_dict()`` round trip carries (``None``, ``0``, RLlib's ``DEPRECATED_VALUE``) pass."""


def _unread(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == DEPRECATED_VALUE


def non_default_model(model: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an old-stack ``model`` dict that differ from RLlib's ``MODEL_DEFAULTS``
    (``to_dict()`` carries the whole default dict)."""
    return {k: v for k, v in model.items() if not (k in MODEL_DEFAULTS and MODEL_DEFAULTS[k] == v)}


def _training_parameters() -> frozenset[str]:
    names: set[str] = set()
    for cls in (_RLlibPPOConfig, AlgorithmConfig):
        sig = inspect.signature(cls.training)
        names.update(
            p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
        )
    return frozenset(names)


_RLLIB_TRAINING_KEYS = _training_parameters()


def _then_apply_derived(name: str) -> Callable[..., Any]:
    """``PPOConfig.<name>``: the next class's setter ``name`` (RLlib's),
    then :meth:`PPOConfig._apply_derived_settings`; returns the config, like RLlib's setters."""

    @functools.wraps(getattr(AlgorithmConfig, name))
    def setter(self: PPOConfig, *args: Any, **kwargs: Any) -> PPOConfig:
        getattr(super(PPOConfig, self), name)(*args, **kwargs)
        self._apply_derived_settings()
        return self

    return override(AlgorithmConfig)(setter)


class PPOConfig(_RLlibPPOConfig):
    """RLlib's ``PPOConfig`` plus the rllib_ext flags (see :mod:`rllib_ext.settings`)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PPO)
        # Pinned (not only returned by get_default_learner_class) so that it survives
        # `to_dict()` -> plain PPOConfig, which is what Tune does with a config subclass.
        self.learners(learner_class=PPOExtTorchLearner)
        self.learner_config_dict.update(ExtensionSettings().to_flat())

    @override(_RLlibPPOConfig)
    def training(self, **kwargs: Any) -> PPOConfig:
        """RLlib's ``training()`` plus the extension flags (``rllib_ext.settings.extension_keys()``).

        RLlib's own keywords behave as in RLlib, the deprecated ones too (``num_sgd_iter``, and
        ``model``, which the new API stack does not read: logged once, the fix is
        ``.rl_module(model_config=...)``). The 2023 tutorial's keywords are
        :class:`rllib_ext.compat.PPOConfig`'s.

        Raises:
            TypeError: for a 2023 keyword RLlib does not take either (:data:`LEGACY_TRAINING_KEYS`).
            ValueError: for an unknown keyword or a bad extension value.
        """
        known = set(extension_keys())
        ext = {k: v for k, v in kwargs.items() if k in known}
        rest = {k: v for k, v in kwargs.items() if k not in known}
        for key in rest:
            if key in REMOVED_KEYS:
                raise ValueError(
                    f"{key}={rest[key]!r} is no longer a setting: {REMOVED_KEYS[key]}. Fix: drop it."
                )
            if key in LEGACY_TRAINING_KEYS:
                raise TypeError(
                    f"training({key}={rest[key]!r}): RLlib's PPOConfig.training() takes no {key!r} "
                    f"(2023 API). Fix: {_USE_COMPAT} {LEGACY_TRAINING_KEYS[key]}."
                )
            if key not in _RLLIB_TRAINING_KEYS:
                raise ValueError(
                    f"Unknown training() argument {key!r}. It is neither an RLlib PPO setting "
                    f"nor an rllib_ext flag ({', '.join(extension_keys())}). Fix: check the "
                    "spelling; old RLlib names are listed in the rllib_ext README."
                )
        check_rates({k: rest[k] for k in ("lambda_", "gamma") if rest.get(k) is not None})
        # Validate everything before applying anything: a bad call changes nothing.
        ExtensionSettings.from_flat({**self._extension_flat(), **ext}, where="training()")
        model = rest.get("model")
        if isinstance(model, Mapping) and non_default_model(model) and log_once("rllib_ext_model"):
            logger.warning(
                "training(model=%r): RLlib's new API stack stores this and does not read it (as "
                "in RLlib). Fix: .rl_module(model_config=...), or rllib_ext.compat.PPOConfig, "
                "which maps the 2023 model dict onto model_config.",
                non_default_model(model),
            )
        super().training(**rest)
        self.learner_config_dict.update(ext)
        self._apply_derived_settings()
        return self

    @override(AlgorithmConfig)
    def rollouts(self, *args: Any, **kwargs: Any) -> PPOConfig:
        """Fails every time: RLlib's ``rollouts()`` raises once per process, then returns None.

        Raises:
            ValueError: always, naming ``.env_runners()`` and ``rllib_ext.compat``.
        """
        given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        raise ValueError(
            f".rollouts({given}): RLlib removed rollouts() (2023 API; it raises once per process, "
            f"then returns None). Fix: {_USE_COMPAT} the new name .env_runners(num_env_runners=..., "
            "num_envs_per_env_runner=...)."
        )

    @override(AlgorithmConfig)
    def resources(self, *, num_gpus: Any = NotProvided, **kwargs: Any) -> PPOConfig:
        """RLlib's ``resources()``; ``num_gpus`` other than 0 fails on the new API stack.

        Raises:
            ValueError: for ``num_gpus`` > 0, which RLlib's new API stack stores and never reads.
        """
        if num_gpus is not NotProvided and not _unread(num_gpus):
            self._refuse_unread("num_gpus", num_gpus, f".resources(num_gpus={num_gpus!r})")
        super().resources(num_gpus=num_gpus, **kwargs)
        return self

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: Any) -> PPOConfig:
        """RLlib's ``update_from_dict``, then the derived settings.

        Raises:
            ValueError: for a 2023 key that RLlib would store and never read
                (:data:`LEGACY_DICT_KEYS`), before anything is applied.
        """
        if isinstance(config_dict, AlgorithmConfig):  # RLlib's default_resource_request passes one
            config_dict = config_dict.to_dict()
        new_stack = config_dict.get("enable_rl_module_and_learner", True) is not False
        for key in LEGACY_DICT_KEYS:
            value = config_dict.get(key)
            if not _unread(value) and (key != "num_gpus" or new_stack):
                self._refuse_unread(key, value, f'update_from_dict({{"{key}": {value!r}}})')
        super().update_from_dict(config_dict)
        self._apply_derived_settings()
        return self

    def _refuse_unread(self, key: str, value: Any, call: str) -> None:
        if key == "num_gpus" and not self.enable_rl_module_and_learner:
            return  # RLlib's old API stack reads it
        raise ValueError(
            f"{call}: RLlib's new API stack stores {key}={value!r} and never reads it (2023 API). "
            f"Fix: {_USE_COMPAT} {LEGACY_DICT_KEYS[key]}."
        )

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

    @override(AlgorithmConfig)
    def api_stack(self, *args: Any, **kwargs: Any) -> PPOConfig:
        """RLlib's ``api_stack()``, then the derived settings (the old stack: RLlib's runner)."""
        super().api_stack(*args, **kwargs)
        if "output" in self.__dict__:  # not inside RLlib's __init__, which calls it early
            self._apply_derived_settings()
        return self

    def _apply_derived_settings(self) -> None:
        """Fills in what the flags imply; idempotent, explicit user choices are kept.

        * SMAC env: shared policy + SMAC metrics callback (:mod:`rllib_ext.smac_config`);
        * the env-runner class, from the one runner table (:mod:`rllib_ext.runner_table`: a
          user's class and RLlib's offline recording are kept, else the batched SMAX runner,
          the fused single-agent runner, the AMP runner or RLlib's default).
        """
        apply_smac_defaults(self)
        apply_env_runner_table(self)


class PPO(_RLlibPPO):
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
