"""The lean learner update (``lean_update=True``): RLlib's update step in fewer kernel launches.

The same maths as ``TorchLearner``'s step, per minibatch:

* Adam: torch's fused implementation (one kernel over all parameters of an optimizer) where
  torch has one for the parameters' device, else its foreach implementation; RLlib builds the
  single-tensor loop (``torch.optim.Adam(params)``). Same update within fp32 rounding.
* The finite check before the optimizer step: one foreach norm over all gradients instead of
  RLlib's two ``isfinite(grad).all()`` per tensor; where a norm is not finite (or an LR scheduler
  or grad scaler is configured) RLlib's own ``apply_gradients`` runs, with its checks and
  warnings.
* Global-norm clipping: the per-tensor norms with torch's foreach kernel, then RLlib's formula
  (``clip / clamp(norm + 1e-6, min=clip)``, at most 1); other ``grad_clip_by`` modes are RLlib's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from ray.rllib.utils.torch_utils import clip_gradients as rllib_clip_gradients

from rllib_ext import _rllib_private as private

__all__ = ["adam", "all_finite", "clip_gradients", "keep_lean"]


def _flags(params: Iterable[torch.Tensor]) -> dict[str, bool | None]:
    """``fused=True`` where the device has the kernel (CPU and CUDA float parameters), else
    ``foreach=True``."""
    params = list(params)
    devices = {p.device.type for p in params}
    if devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params):
        return {"fused": True, "foreach": None}
    return {"fused": None, "foreach": True}


def adam(params: Iterable[torch.Tensor]) -> torch.optim.Adam:
    """``torch.optim.Adam(params)`` with torch's defaults, fused where the device has the kernel
    (CPU and CUDA float parameters), else foreach."""
    params = list(params)
    flags = _flags(params)
    return torch.optim.Adam(params, fused=flags["fused"], foreach=flags["foreach"])


def keep_lean(optim: torch.optim.Optimizer) -> bool:
    """Makes an :func:`adam` optimizer fused/foreach again after ``load_state_dict``.

    torch's ``load_state_dict`` takes the param groups' flags from the saved state: one saved
    by RLlib's plain Adam (a stock checkpoint) would turn the lean step into the single-tensor
    loop. Returns whether a flag changed. The fused kernel wants each ``step`` as a float32
    tensor on the parameter's device, which a non-fused Adam's state need not be.
    """
    changed = False
    for group in optim.param_groups:
        flags = _flags(group["params"])
        if any(group.get(k) != v for k, v in flags.items()):
            group.update(flags)
            changed = True
        if flags["fused"]:
            for param in group["params"]:
                step = optim.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor):
                    optim.state[param]["step"] = step.to(device=param.device, dtype=torch.float32)
    return changed


def all_finite(gradients: Iterable[torch.Tensor | None]) -> bool:
    """``True`` only if every element of every (non-``None``) gradient is finite, from one
    foreach norm kernel: a non-finite element makes its tensor's norm non-finite. ``False`` can
    also mean a finite gradient whose norm overflows (|g| ~ 1e19); callers then take RLlib's
    per-element path, so a ``False`` only costs time."""
    grads = [g.detach() for g in gradients if g is not None]
    return not grads or bool(torch.stack(private.foreach_norm(grads)).isfinite().all())


def clip_gradients(
    gradients_dict: dict[Any, torch.Tensor | None],
    *,
    grad_clip: float | None = None,
    grad_clip_by: str = "value",
) -> torch.Tensor | None:
    """RLlib's ``clip_gradients`` (same signature and in-place contract); ``"global_norm"`` with
    foreach norms. Returns the global norm for ``"global_norm"``, else what RLlib returns."""
    if grad_clip is None or grad_clip_by != "global_norm":
        return rllib_clip_gradients(gradients_dict, grad_clip=grad_clip, grad_clip_by=grad_clip_by)
    grads = [g for g in gradients_dict.values() if g is not None]
    if not grads:
        return torch.tensor(0.0)
    # As RLlib: each tensor's norm and the total with inf mapped to 1e9 (the clip factor
    # multiplies, it never overwrites values).
    detached = [g.detach() for g in grads]
    norms = torch.stack(private.foreach_norm(detached)).nan_to_num(neginf=-10e8, posinf=10e8)
    total_norm = torch.norm(norms, 2.0).nan_to_num(neginf=-10e8, posinf=10e8)
    coeff = torch.clamp(grad_clip / torch.clamp(total_norm + 1e-6, min=grad_clip), max=1.0)
    private.foreach_mul_(detached, coeff)
    return total_norm
