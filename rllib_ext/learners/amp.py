"""Mixed-precision state of ``PPOExtTorchLearner``: per-module loss scaling (the dtype per device is
chosen in :mod:`rllib_ext.amp_choice`).

Why not RLlib's ``_torch_grad_scaler_class`` (RLLIB_NOTES §2): RLlib replaces inf gradients by
finite numbers (``nan_to_num``) before the scaler sees them, clips gradients while they are
still scaled, builds CUDA-only scalers, updates a module's scaler once per optimizer, and does
not checkpoint the scaler. Here each module owns one ``torch.amp.GradScaler`` on the learner's
device; gradients are unscaled before clipping; a step with inf/nan gradients is skipped (the
optimizer never sees it) and the scale backs off; ``update()`` runs once per module and step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from rllib_ext.settings import AMPSettings

__all__ = ["AMP_METRIC", "AMPState"]

AMP_METRIC = "rllib_ext/amp"
"""``learners/<module>/<this>/...``: ``dtype``, ``loss_scale``, ``skipped_steps`` (``_lifetime``)."""

logger = logging.getLogger(__name__)


@dataclass
class AMPState:
    """Per-learner AMP state: dtype, one GradScaler per module (fp16), skip counters."""

    settings: AMPSettings
    device: torch.device
    dtype: torch.dtype | None
    scalers: dict[str, torch.amp.GradScaler] = field(default_factory=dict)
    skipped_steps: dict[str, int] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def scaling(self) -> bool:
        return self.dtype == torch.float16

    @property
    def dtype_name(self) -> str:
        return str(self.dtype or torch.float32).removeprefix("torch.")

    def autocast(self) -> torch.autocast:
        return torch.autocast(
            device_type=self.device.type,
            dtype=self.dtype or torch.float32,
            enabled=self.enabled,
        )

    def scaler(self, module_id: str) -> torch.amp.GradScaler:
        scaler = self.scalers.get(module_id)
        if scaler is None:
            s = self.settings
            scaler = torch.amp.GradScaler(
                self.device.type,
                init_scale=s.amp_init_scale,
                growth_factor=s.amp_growth_factor,
                backoff_factor=s.amp_backoff_factor,
                growth_interval=s.amp_growth_interval,
            )
            self.scalers[module_id] = scaler
            self.skipped_steps.setdefault(module_id, 0)
        return scaler

    def get_state(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype_name,
            "scalers": {mid: sc.state_dict() for mid, sc in self.scalers.items()},
            "skipped_steps": dict(self.skipped_steps),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        saved = state.get("dtype")
        if saved is not None and saved != self.dtype_name:
            # A resume may legitimately change precision (other device, amp="auto"): say so.
            logger.warning(
                "AMP state saved with dtype %s, restored into a learner running %s: %s",
                saved,
                self.dtype_name,
                "the fp16 loss scale starts from the checkpoint's"
                if self.scaling and state.get("scalers")
                else "the checkpoint's loss scale is not used",
            )
        for mid, scaler_state in state.get("scalers", {}).items():
            if scaler_state:
                self.scaler(mid).load_state_dict(scaler_state)
        self.skipped_steps.update(state.get("skipped_steps", {}))
