"""Which AMP dtype runs on a device: a pure function of what the device is (no Ray import).

Shared by the learner (``rllib_ext.learners``) and the env runners' AMP inference
(``rllib_ext.env_runners``), so neither imports the other. :func:`choose_amp` decides from the
device's facts (type, CUDA compute capability, native CPU bf16); :func:`resolve_amp_dtype` reads
them off a ``torch.device``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rllib_ext import _rllib_private as private

__all__ = ["NATIVE_BF16_CAPABILITY", "choose_amp", "cpu_has_native_bf16", "resolve_amp_dtype"]

logger = logging.getLogger(__name__)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def cpu_has_native_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (AVX512-BF16 or AMX)."""
    return private.cpu_has_avx512_bf16() or private.cpu_has_amx()


NATIVE_BF16_CAPABILITY = (8, 0)
"""CUDA compute capability from which bf16 matmuls run natively (Ampere: A100; Hopper: H100)."""


def choose_amp(
    amp: Any,
    device_type: str,
    capability: tuple[int, int] | None = None,
    *,
    cpu_bf16: bool = False,
    device_name: str = "this GPU",
) -> str | None:
    """The AMP mode ``amp`` runs as on a device, a pure function of what the device is.

    Args:
        amp: the ``amp`` setting (``False``, ``"fp16"``, ``"bf16"``, ``"auto"``).
        device_type: ``"cuda"``, ``"cpu"``, ...
        capability: the CUDA compute capability ``(major, minor)`` (CUDA only).
        cpu_bf16: whether the CPU runs bf16 natively (CPU only).
        device_name: named in the error.

    Returns:
        ``"fp16"``, ``"bf16"`` or ``None`` (fp32). ``"auto"``: bf16 on CUDA GPUs with native
        bf16 (compute capability >= 8.0: no loss scaler, no host sync per minibatch), fp16 on
        older CUDA GPUs, bf16 on CPUs with native bf16, else fp32.

    Raises:
        ValueError: ``amp="bf16"`` on a CUDA GPU without native bf16.
    """
    if amp is False:
        return None
    native_bf16 = (
        capability is not None and tuple(capability) >= NATIVE_BF16_CAPABILITY
        if device_type == "cuda"
        else cpu_bf16
    )
    if amp == "auto":
        if device_type == "cuda":
            return "bf16" if native_bf16 else "fp16"
        return "bf16" if native_bf16 else None
    if amp == "bf16" and device_type == "cuda" and not native_bf16:
        major, minor = capability or ("?", "?")
        raise ValueError(
            f"amp='bf16' but {device_name} (compute capability {major}.{minor}) has no native "
            "bf16 (needs >= 8.0, e.g. A100/H100); allowed amp values: False, 'fp16', 'bf16', "
            "'auto'. Fix: use amp='fp16' or amp='auto' (fp16 on this GPU)."
        )
    return str(amp)


def resolve_amp_dtype(amp: Any, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for ``amp`` on ``device`` (``None``: fp32); :func:`choose_amp` with the
    device's facts.

    Raises:
        ValueError: for a mode the device cannot run (bf16 on a CUDA GPU without native bf16).
    """
    if amp is False:
        return None
    capability = name = None
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
    cpu_bf16 = device.type == "cpu" and cpu_has_native_bf16()
    choice = choose_amp(
        amp, device.type, capability, cpu_bf16=cpu_bf16, device_name=name or str(device)
    )
    if amp == "auto":
        logger.info("amp='auto' on %s -> %s", device, choice or "off (fp32)")
    if amp == "bf16" and device.type == "cpu" and not cpu_bf16:
        logger.warning(
            "amp='bf16' on a CPU without AVX512-BF16/AMX: torch emulates bf16 and the update "
            "is slower than fp32. Use amp='auto' to pick the fastest mode per device."
        )
    return _DTYPES[choice] if choice else None
