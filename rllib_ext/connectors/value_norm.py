"""``UpdateValueNorm``: one update of each module's value normalizer per training batch.

Where it sits: last piece of the PPO learner connector pipeline, right after the GAE piece
(RLlib's ``GeneralAdvantageEstimation`` or ``rllib_ext.connectors.gae.CompiledGAE``), which
computed ``value_targets`` from de-normalized values (``compute_values``); installed by
``PPOExtTorchLearner`` when a module has ``model_config={"value_norm": True}``. The learner
connector runs once per ``Learner.update``, so the statistics move once per training batch,
before the minibatch loop normalizes the targets with them (MAPPO's order: update, then
normalize).

Rows: the targets where ``Columns.LOSS_MASK`` is set (no bootstrap rows, no zero padding and,
with death masking, no dead agents).

Several learners (``num_learners >= 2``): each learner's moments (sum, sum of squares, count)
are all-reduced over the learners' process group before the update, so every learner applies
the same update and the statistics stay identical (DDP also broadcasts rank 0's buffers).
Every learner contributes one row per value-normalized module, zeros where its shard holds no
rows of a module, so all learners enter the same collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.typing import EpisodeType

from rllib_ext.modules.value_norm import ValueNorm, ValueNormAPI

__all__ = ["UpdateValueNorm", "value_norms"]

MEAN_KEY = "rllib_ext/value_norm/mean"
STD_KEY = "rllib_ext/value_norm/std"


def value_norms(rl_module: MultiRLModule) -> dict[Any, ValueNorm]:
    """The value normalizers of a MultiRLModule's modules, by module id, in sorted id order."""
    out: dict[Any, ValueNorm] = {}
    for mid in sorted(rl_module.keys(), key=str):
        module = rl_module[mid].unwrapped()
        norm = getattr(module, "value_norm", None) if isinstance(module, ValueNormAPI) else None
        if norm is not None:
            out[mid] = norm
    return out


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


class UpdateValueNorm(ConnectorV2):
    """Updates every value-normalized module's statistics from the batch's value targets.

    Logs ``<mid>/value_norm/mean`` and ``<mid>/value_norm/std`` after the update.
    """

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        episodes: list[EpisodeType],
        batch: dict[str, Any],
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        norms = value_norms(rl_module)
        if not norms:
            return batch
        device = next(iter(norms.values())).running_mean.device
        moments = torch.zeros(len(norms), 3, dtype=torch.float64, device=device)
        for row, mid in enumerate(norms):
            module_batch = batch.get(mid)
            if module_batch is None or Postprocessing.VALUE_TARGETS not in module_batch:
                continue
            targets = _tensor(module_batch[Postprocessing.VALUE_TARGETS]).to(device)
            if Columns.LOSS_MASK in module_batch:
                targets = targets[_tensor(module_batch[Columns.LOSS_MASK]).to(device).bool()]
            targets = targets.to(torch.float64)
            moments[row, 0] = targets.sum()
            moments[row, 1] = (targets * targets).sum()
            moments[row, 2] = targets.numel()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(moments)
        for (mid, norm), (total, total_sq, count) in zip(
            norms.items(), moments.tolist(), strict=True
        ):
            norm.update_from_moments(total=total, total_sq=total_sq, count=count)
            if metrics is not None:
                mean, std = norm.mean_std()
                metrics.log_value((mid, MEAN_KEY), float(mean), window=1)
                metrics.log_value((mid, STD_KEY), float(std), window=1)
        return batch
