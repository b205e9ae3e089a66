"""Env runners that compute actions under autocast (``amp_inference=True``).

The RLModule forward runs in the learner's AMP dtype; its float outputs are cast back to
float32 before RLlib samples actions and computes ``action_logp``, so the log-probabilities
stored in episodes (and used in PPO's importance ratio) are fp32 like RLlib's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.learners.amp import resolve_amp_dtype
from rllib_ext.settings import ExtensionSettings

__all__ = ["AMPMultiAgentEnvRunner", "AMPSingleAgentEnvRunner", "CastToFloat32", "to_float32"]


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


if TYPE_CHECKING:
    from ray.rllib.env.env_runner import EnvRunner as _EnvRunnerBase
else:
    _EnvRunnerBase = object


class _AutocastSampling(_EnvRunnerBase):
    """Mixed into RLlib's env runners (before them in the bases): autocast around ``sample()``."""

    def _setup_amp_inference(self) -> None:
        amp = ExtensionSettings.from_learner_config_dict(self.config.learner_config_dict).amp
        device = next(iter(_parameters(self.module)), torch.empty(0)).device
        self._amp_inference_dtype = (
            resolve_amp_dtype(amp.amp, device) if amp.amp_inference else None
        )
        self._amp_device_type = device.type
        if self._amp_inference_dtype is not None:
            private.module_to_env(self).prepend(CastToFloat32())

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(
            device_type=self._amp_device_type,
            dtype=self._amp_inference_dtype or torch.float32,
            enabled=self._amp_inference_dtype is not None,
        ):
            return super().sample(*args, **kwargs)


def _parameters(module: Any) -> list[torch.Tensor]:
    if isinstance(module, torch.nn.Module):
        return list(module.parameters())
    return []


class AMPSingleAgentEnvRunner(_AutocastSampling, SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` with ``amp_inference`` support."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_amp_inference()


class AMPMultiAgentEnvRunner(_AutocastSampling, MultiAgentEnvRunner):
    """``MultiAgentEnvRunner`` with ``amp_inference`` support."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_amp_inference()
