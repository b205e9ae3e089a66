"""Value normalization for PPO critics: MAPPO's ``ValueNorm`` (running mean/std with debiasing).

The critic head learns *normalized* value targets; everything that consumes values (GAE, the
bootstrap value of truncated chunks, RLlib's own GAE connector) gets de-normalized ones through
``compute_values``. Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative
Multi-Agent Games" (https://arxiv.org/abs/2103.01955), section 4 and appendix: value
normalization is one of the five factors that matter on SMAC.

Statistics (registered buffers, so they travel with the module's state, RLlib checkpoints and
the weights synced to other learners)::

    running_mean     = beta * running_mean     + (1 - beta) * mean(targets)
    running_mean_sq  = beta * running_mean_sq  + (1 - beta) * mean(targets ** 2)
    debiasing_term   = beta * debiasing_term   + (1 - beta)
    mean = running_mean / debiasing_term;  var = max(running_mean_sq / debiasing_term - mean**2, 1e-2)

updated once per training batch (``rllib_ext.connectors.value_norm``) from the value targets of
the rows the loss sees. Before the first update the transform is the identity.

Modules opt in with :class:`ValueNormAPI` (a mixin): ``setup_value_norm(model_config)`` in
``setup()``, and ``values_from_head(raw)`` on the value head's output in ``compute_values``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "VALUE_NORM_BETA_KEY",
    "VALUE_NORM_KEY",
    "ValueNorm",
    "ValueNormAPI",
    "check_value_norm_options",
]

VALUE_NORM_KEY = "value_norm"
VALUE_NORM_BETA_KEY = "value_norm_beta"

DEFAULT_BETA = 0.99999
"""MAPPO's default (``onpolicy/algorithms/utils/valuenorm.py``): with the debiasing term the
statistics are close to a plain average over every batch of the run so far."""

_VAR_MIN = 1e-2  # MAPPO's floor: targets that barely vary are not blown up into large errors


def check_value_norm_options(config: Mapping[str, Any]) -> tuple[bool, float]:
    """Validates ``value_norm`` / ``value_norm_beta`` of a ``model_config``.

    Returns:
        ``(enabled, beta)``.

    Raises:
        ValueError: a non-bool ``value_norm`` or a ``value_norm_beta`` outside ``(0, 1)``.
    """
    enabled = config.get(VALUE_NORM_KEY, False)
    if not isinstance(enabled, bool):
        raise ValueError(
            f"model_config['{VALUE_NORM_KEY}']={enabled!r}; allowed: True, False. "
            f"Fix: model_config={{'{VALUE_NORM_KEY}': True}}."
        )
    beta = config.get(VALUE_NORM_BETA_KEY, DEFAULT_BETA)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
        raise ValueError(
            f"model_config['{VALUE_NORM_BETA_KEY}']={beta!r}; allowed: a float in (0, 1) "
            f"(default {DEFAULT_BETA}, MAPPO's). Fix: e.g. {VALUE_NORM_BETA_KEY}=0.999."
        )
    return enabled, float(beta)


class ValueNorm(nn.Module):
    """Running mean/std of scalar value targets with exponential decay and debiasing.

    Args:
        beta: decay per :meth:`update` call, in ``(0, 1)``.

    Buffers (float32, shape ``[]``): ``running_mean``, ``running_mean_sq``,
    ``debiasing_term``.
    """

    running_mean: torch.Tensor
    running_mean_sq: torch.Tensor
    debiasing_term: torch.Tensor

    def __init__(self, *, beta: float = DEFAULT_BETA) -> None:
        super().__init__()
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta={beta!r}; allowed: a float in (0, 1).")
        self.beta = float(beta)
        # float32 like MAPPO's: RLlib's state restore converts float64 arrays to float32, so
        # float64 buffers would not round-trip through a checkpoint bit for bit. The transform
        # itself is computed in float64 (see mean_std).
        for name in ("running_mean", "running_mean_sq", "debiasing_term"):
            self.register_buffer(name, torch.zeros((), dtype=torch.float32))

    def mean_std(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Debiased ``(mean, std)``, float64 scalars; ``(0, 1)`` before the first update."""
        # Exactly 0 until the first update; 1 - beta^n > 0 (representable) after it.
        if float(self.debiasing_term) == 0.0:
            one = torch.ones((), dtype=torch.float64, device=self.running_mean.device)
            return one * 0.0, one
        debias = self.debiasing_term.double()
        mean = self.running_mean.double() / debias
        mean_sq = self.running_mean_sq.double() / debias
        var = (mean_sq - mean**2).clamp(min=_VAR_MIN)
        return mean, var.sqrt()

    @torch.no_grad()
    def update_from_moments(self, *, total: float, total_sq: float, count: float) -> None:
        """One update from ``sum(x)``, ``sum(x ** 2)`` and ``count`` of a batch (no-op if 0).

        Moments rather than the values, so learners can all-reduce them first and stay equal.
        """
        if count <= 0:
            return
        weight = self.beta
        self.running_mean.mul_(weight).add_((1.0 - weight) * (total / count))
        self.running_mean_sq.mul_(weight).add_((1.0 - weight) * (total_sq / count))
        self.debiasing_term.mul_(weight).add_(1.0 - weight)

    def update(self, targets: torch.Tensor) -> None:
        """One update from the value targets ``[N]`` (any shape; all entries count)."""
        x = targets.detach().to(torch.float64)
        self.update_from_moments(
            total=float(x.sum()), total_sq=float((x * x).sum()), count=float(x.numel())
        )

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """``(values - mean) / std`` in ``values``' dtype; shape kept."""
        mean, std = self.mean_std()
        return ((values.to(torch.float64) - mean) / std).to(values.dtype)

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """``values * std + mean`` in ``values``' dtype; shape kept. Differentiable."""
        mean, std = self.mean_std()
        return values * std.to(values.dtype) + mean.to(values.dtype)

    def extra_repr(self) -> str:
        return f"beta={self.beta}"


class ValueNormAPI:
    """Mixin for a torch RLModule whose value head learns normalized targets.

    Contract for the module:

    * ``setup_value_norm(model_config)`` once in ``setup()`` (validates ``value_norm`` and
      ``value_norm_beta``; builds :class:`ValueNorm` as ``self.value_norm`` when on);
    * ``compute_values`` returns ``self.values_from_head(raw)`` where ``raw`` is the value
      head's output: de-normalized values, except inside :meth:`normalized_values`;
    * ``"value_norm"`` among ``get_non_inference_attributes()`` (env runners need no values).

    ``PPOExtTorchLearner`` computes the value loss inside :meth:`normalized_values` against
    normalized targets; ``rllib_ext.connectors.value_norm.UpdateValueNorm`` updates the
    statistics once per training batch.
    """

    value_norm: ValueNorm | None
    _values_normalized: bool

    def setup_value_norm(self, model_config: Mapping[str, Any]) -> None:
        enabled, beta = check_value_norm_options(model_config)
        self._values_normalized = False
        self.value_norm = ValueNorm(beta=beta) if enabled else None

    @contextlib.contextmanager
    def normalized_values(self) -> Iterator[None]:
        """Within: ``compute_values`` returns the head's normalized output (the loss's view)."""
        previous = self._values_normalized
        self._values_normalized = True
        try:
            yield
        finally:
            self._values_normalized = previous

    def values_from_head(self, raw: torch.Tensor) -> torch.Tensor:
        """The value head's output ``[...]`` as the caller needs it (see the class docstring)."""
        norm = getattr(self, "value_norm", None)
        if norm is None or self._values_normalized:
            return raw
        return norm.denormalize(raw)
