"""Every check of the rllib_ext settings against the rest of an RLlib PPO config, in one place.

:func:`check_algorithm_config` is called by ``rllib_ext.PPOConfig.validate()`` and by
``PPOExtTorchLearner.build()`` (the stock-config route,
``.learners(learner_class=PPOExtTorchLearner, learner_config_dict=...)``), so both routes reject
the same combination with the same message. It reads the config and never changes it.

The per-key checks are in :mod:`rllib_ext.settings`; this module adds the rules that need other
parts of the config (learner resources, ``torch_compile_learner``, the env-runner class, GAE's
``gamma``/``lambda_``, the tutorial's ``communication_type``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rllib_ext import _rllib_private as private
from rllib_ext._validation import Bounds, check_number
from rllib_ext.env_runners import (
    AMPMultiAgentEnvRunner,
    AMPSingleAgentEnvRunner,
    supports_amp_inference,
)
from rllib_ext.modules.learner_options import (
    LEARNER_APPLIED_KEYS,
    applies_learner_options,
    learner_options_error,
)
from rllib_ext.settings import CompressionSettings, ExtensionSettings

__all__ = [
    "ConfigCheck",
    "amp_env_runner_class",
    "check_algorithm_config",
    "check_comm_resources",
    "check_rates",
]

_UNIT_INTERVAL = Bounds(ge=0, le=1)
_RATE_EXAMPLES = {"lambda_": 0.95, "gamma": 0.99}


def check_rates(rates: Mapping[str, Any]) -> None:
    """``gamma`` and ``lambda_`` in ``[0, 1]``: GAE's scan needs ``gamma * lambda_ <= 1``.

    Raises:
        ValueError: naming the rate, the range and the fix.
    """
    for key, value in rates.items():
        check_number(key, value, _UNIT_INTERVAL, example=f".training({key}={_RATE_EXAMPLES[key]})")


@dataclass(frozen=True)
class ConfigCheck:
    """What :func:`check_algorithm_config` found: the settings and the warnings to log once."""

    settings: ExtensionSettings
    warnings: tuple[str, ...] = ()
    """Valid settings that have no effect (e.g. compression with one learner)."""


def check_algorithm_config(config: Any) -> ConfigCheck:
    """Validates the extension settings of ``config`` and their combination with the config.

    Args:
        config: an RLlib ``AlgorithmConfig`` (``rllib_ext.PPOConfig`` or RLlib's ``PPOConfig``)
            whose ``learner_config_dict`` holds the extension keys.

    Returns:
        The settings and the warnings; the caller decides where to log them (the learner
        logs them on rank 0, so a run shows each once).

    Raises:
        ValueError: a bad key or value, or a combination that cannot run; the message names
            the values and the fix.
    """
    settings = ExtensionSettings.from_learner_config_dict(config.learner_config_dict)
    check_rates(
        {k: getattr(config, k) for k in _RATE_EXAMPLES if getattr(config, k, None) is not None}
    )
    amp = settings.amp.amp
    if amp is not False and getattr(config, "torch_compile_learner", False):
        raise ValueError(
            f"amp={amp!r} together with torch_compile_learner=True is not supported (the "
            "compiled update bypasses the autocast/loss-scaling step). "
            "Fix: .framework(torch_compile_learner=False) or amp=False."
        )
    if amp is not False and private.torch_grad_scaler_class(config) is not None:
        raise ValueError(
            "amp is set together with .experimental(_torch_grad_scaler_class=...): two loss "
            "scalers would fight. Fix: remove _torch_grad_scaler_class; amp='fp16' brings its "
            "own GradScaler."
        )
    if settings.update.num_minibatches and (config.num_learners or 0) >= 2:
        raise ValueError(
            f"num_minibatches={settings.update.num_minibatches} needs one learner; got "
            f"num_learners={config.num_learners} (RLlib counts every learner's minibatches from "
            "minibatch_size). Fix: set num_minibatches=0 and a minibatch_size, or num_learners <= 1."
        )
    if settings.amp.amp_inference:
        _check_amp_env_runner(config)
    _check_module_options_learner(config)
    warnings = check_comm_resources(
        settings.comm,
        num_learners=config.num_learners,
        num_gpus_per_learner=config.num_gpus_per_learner,
        # rllib_ext.compat.PPOConfig's attribute; a stock config built from its dict carries it too.
        communication_type=getattr(config, "communication_type", None),
    )
    return ConfigCheck(settings=settings, warnings=tuple(warnings))


def amp_env_runner_class(config: Any) -> type:
    """The env-runner class ``amp_inference=True`` needs for ``config`` (single or multi-agent)."""
    return AMPMultiAgentEnvRunner if config.is_multi_agent else AMPSingleAgentEnvRunner


def _check_amp_env_runner(config: Any) -> None:
    current = config.env_runner_cls
    if not supports_amp_inference(current, multi_agent=config.is_multi_agent):
        wanted = amp_env_runner_class(config)
        got = "RLlib's default" if current is None else current.__name__
        raise ValueError(
            f"amp_inference=True needs an env runner that derives from rllib_ext.env_runners."
            f"{wanted.__name__} (it holds the AMP feature), got {got}. Fix: "
            f".env_runners(env_runner_cls=rllib_ext.env_runners.{wanted.__name__}) "
            "(rllib_ext.PPOConfig sets it for you), derive your runner from it, "
            "or set amp_inference=False."
        )


def _check_module_options_learner(config: Any) -> None:
    """Masked-module options that only rllib_ext's learner acts on need a learner that declares
    it applies them (``PPOExtTorchLearner`` and its subclasses)."""
    learner = config.learner_class
    if applies_learner_options(learner):
        return
    spec = config.rl_module_spec
    model_configs = [config.model_config]
    for module_spec in (getattr(spec, "rl_module_specs", None) or {}).values():
        model_configs.append(getattr(module_spec, "model_config", None) or {})
    asked = sorted({k for mc in model_configs for k in LEARNER_APPLIED_KEYS if _on(mc, k)})
    if asked:
        name = getattr(learner, "__name__", repr(learner))
        raise learner_options_error(asked, f"learner_class={name}")


def _on(model_config: Any, key: str) -> bool:
    getter = model_config.get if isinstance(model_config, Mapping) else None
    return bool(getter(key, False) if getter else getattr(model_config, key, False))


def check_comm_resources(
    comm: CompressionSettings,
    *,
    num_learners: int,
    num_gpus_per_learner: float,
    communication_type: str | None = None,
) -> list[str]:
    """Checks the compression settings and the tutorial's communication type against the learners.

    The process-group backend is RLlib's choice (``LearnerGroup`` with Ray Train's
    ``TorchConfig()``: NCCL between GPU learners, gloo between CPU learners); a
    ``communication_type`` (``"auto"``, ``"nccl"``, ``"gloo"``) that names another backend
    than the one RLlib will create is an error.

    Returns:
        Warnings (settings that are valid but have no effect).

    Raises:
        ValueError: for a communication type the learners cannot run.
    """
    on_gpu = num_gpus_per_learner > 0
    if communication_type == "nccl" and not on_gpu:
        raise ValueError(
            "communication type 'nccl' but the learners have no GPU (num_gpus_per_learner=0); "
            "NCCL only runs between GPUs and RLlib uses gloo between CPU learners. Fix: drop the "
            "type (or use 'gloo'/'auto'), .learners(num_gpus_per_learner=1), or "
            "RLLIB_EXT_FIT_RESOURCES=1 to fit the config to this machine."
        )
    if communication_type == "gloo" and on_gpu:
        raise ValueError(
            "communication type 'gloo' with GPU learners is not supported: RLlib's learner group "
            "(Ray Train's TorchConfig) uses NCCL whenever learners have GPUs. Fix: drop the type "
            "(or use 'nccl'/'auto'), or .learners(num_gpus_per_learner=0)."
        )
    warnings = []
    if comm.grad_compression is not None and num_learners < 2:
        warnings.append(
            f"grad_compression={comm.grad_compression!r} has no effect with num_learners="
            f"{num_learners}: gradients are only exchanged between 2 or more learners. "
            "Set .learners(num_learners=2) or more to use it."
        )
    return warnings
