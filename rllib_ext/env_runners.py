"""rllib_ext's env runner for each RLlib runner, holding the features its config turns on.

:class:`AMPSingleAgentEnvRunner` / :class:`AMPMultiAgentEnvRunner` are RLlib's two runners, each
holding a :class:`RunnerFeatures` (``runner.features``, built at the end of ``__init__`` from the
config) that its ``sample()`` hands every call to. The one feature today is ``amp_inference``
(:class:`AMPInference`): ``sample()`` runs under the learner's AMP dtype and :class:`CastToFloat32`
is prepended to the module-to-env pipeline, so actions and the ``action_logp`` stored in episodes
(PPO's importance ratio) are float32 as in RLlib; with ``amp_inference=False`` nothing changes.
Fused loops inside ``sample()`` run under the same autocast and skip the cast piece (it declares
:data:`~rllib_ext.sampling_protocol.FUSED_EQUIVALENT`: they cast the outputs alike). The fused
runners derive from these two classes (single inheritance), and so does a user's runner that wants
``amp_inference`` (:func:`supports_amp_inference`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.amp_choice import resolve_amp_dtype
from rllib_ext.settings import ExtensionSettings

__all__ = [
    "AMPInference",
    "AMPMultiAgentEnvRunner",
    "AMPSingleAgentEnvRunner",
    "CastToFloat32",
    "RunnerFeatures",
    "module_device",
    "rllib_env_runner_class",
    "supports_amp_inference",
    "to_float32",
]


def to_float32(x: Any) -> Any:
    """``x`` (a tensor or a nested dict of them) with fp16/bf16 tensors cast to float32."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    if isinstance(x, dict):
        return {k: to_float32(v) for k, v in x.items()}
    return x


class CastToFloat32(ConnectorV2):
    """Module-to-env piece (first in the pipeline): low-precision float tensors -> float32."""

    # sampling_protocol.FUSED_EQUIVALENT: fused loops cast the module's outputs alike.
    rllib_ext_fused_equivalent = True

    @override(ConnectorV2)
    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> Any:
        return to_float32(batch)


class AMPInference:
    """The ``amp_inference`` feature of one env runner (see the module docstring); built by
    :class:`RunnerFeatures` after RLlib's ``__init__`` built the runner's module and pipelines."""

    def __init__(self, runner: EnvRunner) -> None:
        amp = ExtensionSettings.from_learner_config_dict(runner.config.learner_config_dict).amp
        device = module_device(runner.module)
        self.dtype: torch.dtype | None = (
            resolve_amp_dtype(amp.amp, device) if amp.amp_inference else None
        )
        """The autocast dtype of ``sample()``; ``None``: ``amp_inference`` is off."""
        self.device_type = device.type
        if self.dtype is not None:
            private.module_to_env(runner).prepend(CastToFloat32())

    def sample(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)`` (the runner's ``sample()``) under the autocast dtype."""
        with torch.autocast(
            device_type=self.device_type,
            dtype=self.dtype or torch.float32,
            enabled=self.dtype is not None,
        ):
            return call(*args, **kwargs)


class RunnerFeatures:
    """The features an rllib_ext env runner holds (``runner.features``), built from its config."""

    def __init__(self, runner: EnvRunner) -> None:
        self.amp = AMPInference(runner)

    def sample(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The runner's ``sample()`` (``call``, RLlib's) with every feature around it."""
        return self.amp.sample(call, *args, **kwargs)


def supports_amp_inference(runner_class: type | None, *, multi_agent: bool) -> bool:
    """Whether ``runner_class`` holds the ``amp_inference`` feature for a single-agent or
    multi-agent config: it derives from :class:`AMPSingleAgentEnvRunner` or
    :class:`AMPMultiAgentEnvRunner` (the fused runners do)."""
    base = AMPMultiAgentEnvRunner if multi_agent else AMPSingleAgentEnvRunner
    return runner_class is not None and issubclass(runner_class, base)


def rllib_env_runner_class(config: Any) -> type:
    """The class RLlib's ``EnvRunnerGroup`` picks for ``config`` when ``env_runner_cls`` is
    ``None`` (Ray 2.58-2.60, new API stack): ``OfflineSingleAgentEnvRunner`` when
    ``.offline_data(output=...)`` records episodes, else ``MultiAgentEnvRunner`` or
    ``SingleAgentEnvRunner``.

    Raises:
        ValueError: multi-agent recording, which RLlib refuses with the same message.
    """
    if config.output:
        if config.is_multi_agent:
            raise ValueError("Multi-agent recording is not supported, yet.")
        from ray.rllib.offline.offline_env_runner import (  # lazy: RLlib's offline stack (ray.data)
            OfflineSingleAgentEnvRunner,
        )

        return OfflineSingleAgentEnvRunner
    return MultiAgentEnvRunner if config.is_multi_agent else SingleAgentEnvRunner


def module_device(module: Any) -> torch.device:
    """Where ``module`` computes: the device of its first parameter or, for a multi-agent module
    (a ``MultiRLModule`` has no parameters of its own), of the first sub-module that has
    parameters; the CPU for a module without any (or none at all)."""
    return next(_parameters(module), torch.empty(0)).device


def _parameters(module: Any) -> Iterator[torch.Tensor]:
    if isinstance(module, torch.nn.Module):
        yield from module.parameters()
    elif isinstance(module, MultiRLModule):
        for sub_module in module.values():
            yield from _parameters(sub_module)


class AMPSingleAgentEnvRunner(SingleAgentEnvRunner):
    """RLlib's ``SingleAgentEnvRunner`` holding its :class:`RunnerFeatures` (``features``)."""

    features: RunnerFeatures

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.features = RunnerFeatures(self)

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self.features.sample(super().sample, *args, **kwargs)


class AMPMultiAgentEnvRunner(MultiAgentEnvRunner):
    """RLlib's ``MultiAgentEnvRunner`` holding its :class:`RunnerFeatures` (``features``)."""

    features: RunnerFeatures

    @override(MultiAgentEnvRunner)
    def __init__(self, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.features = RunnerFeatures(self)

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self.features.sample(super().sample, *args, **kwargs)
