"""``amp_inference``: the env runner's forward under autocast, a protocol any runner opts into.

A runner class opts in by putting :class:`AMPInference` before the RLlib runner it extends in
its bases (``class MyRunner(AMPInference, MultiAgentEnvRunner)``): ``sample()`` then runs under
the learner's AMP dtype and :class:`CastToFloat32` is prepended to its module-to-env pipeline,
so actions and the ``action_logp`` stored in episodes (PPO's importance ratio) are float32 as in
RLlib. Fused loops inside ``sample()`` inherit the autocast and skip the cast piece (it declares
:data:`~rllib_ext.sampling_protocol.FUSED_EQUIVALENT`: they cast the outputs alike).
:class:`AMPSingleAgentEnvRunner` / :class:`AMPMultiAgentEnvRunner` are RLlib's two runners
with nothing else added; ``rllib_ext.PPOConfig`` picks them for ``amp_inference=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
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


if TYPE_CHECKING:
    from ray.rllib.env.env_runner import EnvRunner as _EnvRunnerBase
else:
    _EnvRunnerBase = object


class AMPInference(_EnvRunnerBase):
    """The ``amp_inference`` protocol (see the module docstring); before an RLlib runner in the
    bases. With ``amp_inference=False`` it changes nothing (autocast disabled, no cast piece)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        amp = ExtensionSettings.from_learner_config_dict(self.config.learner_config_dict).amp
        device = module_device(self.module)
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


def supports_amp_inference(runner_class: type | None, *, multi_agent: bool) -> bool:
    """Whether ``runner_class`` opted into :class:`AMPInference` and extends the RLlib runner a
    single-agent (``SingleAgentEnvRunner``) or multi-agent config needs."""
    base = MultiAgentEnvRunner if multi_agent else SingleAgentEnvRunner
    return (
        runner_class is not None
        and issubclass(runner_class, AMPInference)
        and issubclass(runner_class, base)
    )


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


class AMPSingleAgentEnvRunner(AMPInference, SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` with ``amp_inference`` support."""


class AMPMultiAgentEnvRunner(AMPInference, MultiAgentEnvRunner):
    """``MultiAgentEnvRunner`` with ``amp_inference`` support."""
