"""Gradient-compression part of ``PPOExtTorchLearner``: settings -> hook, registration, metrics.

RLlib wraps each module in ``TorchDDPRLModule`` (a ``DistributedDataParallel``) when
``num_learners > 1`` (``TorchLearner._make_modules_ddp_if_necessary`` and ``add_module``); the
learner calls :meth:`CommCompression.register` right after both, so every DDP module gets its
hook before its first backward pass. The path of ``grad_compression`` from here: the hook and
state of :data:`HOOKS` (``rllib_ext/distributed/<codec>.py``), which call the codec's math in
``rllib_ext/ops/codecs/<codec>.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchDDPRLModule
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ext.distributed import (
    BF16State,
    CommHookState,
    FP16State,
    OneBitState,
    PowerSGDHookState,
    bf16_hook,
    fp16_hook,
    onebit_hook,
    powersgd_hook,
)
from rllib_ext.settings import CompressionSettings

__all__ = ["COMM_METRIC", "HOOKS", "CommCompression", "make_comm_hook"]

COMM_METRIC = "rllib_ext/comm"
"""``learners/<module>/<this>/...``: bytes, times, compression ratio of the last update."""

logger = logging.getLogger(__name__)

CommHook = Callable[[Any, dist.GradBucket], Any]

StateFactory = Callable[[CompressionSettings, dist.ProcessGroup | None], CommHookState]

HOOKS: dict[str, tuple[CommHook, StateFactory]] = {
    "fp16": (fp16_hook, FP16State),
    "bf16": (bf16_hook, BF16State),
    "powersgd": (powersgd_hook, PowerSGDHookState),
    "onebit": (onebit_hook, OneBitState),
}
"""``grad_compression`` value -> (hook, state class); every state class takes the settings."""


def make_comm_hook(
    settings: CompressionSettings, process_group: dist.ProcessGroup | None = None
) -> tuple[CommHook, CommHookState]:
    """``(hook, state)`` for ``ddp_module.register_comm_hook(state, hook)``.

    One state per DDP module: states hold per-bucket memory keyed by bucket index. The settings
    were validated when they were built; their values are the only defaults.

    Raises:
        ValueError: ``settings.grad_compression`` is ``None`` (no hook: DDP's plain all-reduce).
    """
    if settings.grad_compression is None:
        raise ValueError(
            "make_comm_hook() got grad_compression=None, which means no hook. Fix: leave DDP's "
            f"plain all-reduce in place, or pick one of {sorted(HOOKS)}."
        )
    hook, state_class = HOOKS[settings.grad_compression]
    return hook, state_class(settings, process_group)


class CommCompression:
    """One DDP comm hook (and its state) per module of a learner."""

    def __init__(self, settings: CompressionSettings) -> None:
        self.settings = settings
        self.states: dict[str, CommHookState] = {}
        self._pending_state: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.grad_compression is not None

    def register(self, module: MultiRLModule) -> None:
        """Registers a hook on every DDP-wrapped sub-module that has none yet."""
        if not self.enabled:
            return
        for mid, sub in module.items():
            if not isinstance(sub, TorchDDPRLModule) or mid in self.states:
                continue
            hook, state = make_comm_hook(self.settings)
            sub.register_comm_hook(state, hook)
            self.states[mid] = state
            if mid in self._pending_state:
                state.set_state(self._pending_state.pop(mid))
            logger.info("module %r: %s gradient compression hook registered", mid, hook.__name__)

    def rescale(self, module_id: str, factor: float) -> None:
        """Keeps error-feedback memory in the units of loss-scaled gradients (AMP fp16)."""
        state = self.states.get(module_id)
        if state is not None and factor != 1.0:
            state.rescale_error_feedback(factor)

    def log_stats(self, metrics: MetricsLogger) -> None:
        """Logs and resets the statistics of the last update step under
        ``<mid>/rllib_ext/comm/...`` (:data:`COMM_METRIC`)."""
        for mid, state in self.states.items():
            stats = state.pop_stats()
            for key in ("bytes_sent", "bytes_uncompressed"):
                metrics.log_value((mid, f"{COMM_METRIC}/{key}"), stats[key], reduce="sum")
            metrics.log_value(
                (mid, f"{COMM_METRIC}/time_ms"), stats["comm_time_s"] * 1e3, reduce="sum"
            )
            metrics.log_value(
                (mid, f"{COMM_METRIC}/codec_time_ms"),
                (stats["encode_time_s"] + stats["decode_time_s"]) * 1e3,
                reduce="sum",
            )
            ratio = stats["compression_ratio"]
            metrics.log_value((mid, f"{COMM_METRIC}/compression_ratio"), ratio, window=1)
            buckets = stats["num_buckets"]
            compiled = stats["num_compiled_buckets"] / buckets if buckets else 0.0
            metrics.log_value((mid, f"{COMM_METRIC}/compiled_codec"), compiled, window=1)

    def get_state(self) -> dict[str, Any]:
        return {mid: state.get_state() for mid, state in self.states.items()}

    def set_state(self, state: dict[str, Any]) -> None:
        for mid, hook_state in state.items():
            if mid in self.states:
                self.states[mid].set_state(hook_state)
            else:
                # Restored before the module is wrapped (e.g. added later): apply on register.
                self._pending_state[mid] = hook_state
