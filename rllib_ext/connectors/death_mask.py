"""``DeathMask``: dead SMAC agents' rows leave the PPO loss (MAPPO's "active masks").

Where it sits: in the PPO learner connector pipeline right before the GAE piece (RLlib's
``GeneralAdvantageEstimation`` or ``rllib_ext.connectors.gae.CompiledGAE``); installed by
``PPOExtTorchLearner`` for every module with ``model_config={"death_masking": True}``. What
it needs before it: the train batch with the dict observations (``"action_mask"``) and
``Columns.LOSS_MASK`` (both made by RLlib's default pieces / the vectorized batching piece).

It writes a new ``Columns.LOSS_MASK`` = old mask AND NOT dead, so the PPO loss (policy,
value, entropy and KL terms, all averaged over the mask), advantage standardization with
``standardize_advantages="masked"`` and the value-normalization statistics ignore dead rows.
The rows stay in the batch: GAE still runs over the whole trajectory.

The rule (:func:`dead_rows`): **a row is dead iff its action mask allows exactly one action
and that action is a backend's no-op** (:data:`NO_OP_ACTIONS`: 0 = SMAC/SMACv2's no-op,
4 = SMAX's stop). Exact on both backends:

* SMAC/SMACv2 (``StarCraft2Env.get_avail_agent_actions``): a dead unit gets exactly
  ``[1, 0, ...]``; a living one always has stop (1) legal and the no-op (0) illegal, so its
  mask is never one-hot at 0, nor at 4 (stop is legal besides).
* SMAX (JaxMARL ``SMAX.get_avail_actions``): a dead unit gets only stop (4); a living one has
  the four moves (0-3) and stop legal, so at least five actions.

Zero-padded rows of stateful modules have an all-zero mask and are never "dead" (they are
out of the loss mask already).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.typing import EpisodeType

from rllib_ext.modules.learner_options import wants_death_masking

__all__ = ["DeathMask", "NO_OP_ACTIONS", "dead_rows"]

NO_OP_ACTIONS: tuple[int, ...] = (0, 4)
"""The action a dead agent is left with: SMAC/SMACv2 index 0 ("no-op"), SMAX index 4 ("stop");
``rllib_ext.envs.smac`` backends' ``spec.no_op_action``."""

DEAD_FRACTION_KEY = "rllib_ext/death_mask/dead_fraction"


def dead_rows(action_mask: torch.Tensor) -> torch.Tensor:
    """Which rows belong to dead agents (see the module docstring for the rule).

    Args:
        action_mask: ``[..., A]`` 0/1 (float or bool) legal actions.

    Returns:
        ``[...]`` bool.
    """
    legal = action_mask > 0.5
    single = legal.sum(dim=-1) == 1
    no_op = torch.zeros_like(single)
    for index in NO_OP_ACTIONS:
        if index < legal.shape[-1]:
            no_op = no_op | legal[..., index]
    return single & no_op


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


class DeathMask(ConnectorV2):
    """Removes dead agents' rows from ``Columns.LOSS_MASK`` of every module that asks for it.

    Logs ``<mid>/death_mask/dead_fraction`` (dead rows / rows in the loss before masking).
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
        for mid, module_batch in batch.items():
            if mid not in rl_module or not wants_death_masking(rl_module[mid].unwrapped()):
                continue
            obs = module_batch[Columns.OBS]
            if not isinstance(obs, dict) or "action_mask" not in obs:
                raise ValueError(
                    f"death_masking=True for module {mid!r} needs dict observations with an "
                    f"'action_mask'; got {type(obs).__name__}. Fix: use a SMAC env "
                    "(rllib_ext.envs.smac) or set death_masking=False."
                )
            dead = dead_rows(_tensor(obs["action_mask"]))
            if Columns.LOSS_MASK in module_batch:
                old = _tensor(module_batch[Columns.LOSS_MASK]).bool().to(dead.device)
            else:
                old = torch.ones_like(dead)
            # A new tensor in place of the old entry; the old tensor is left untouched.
            module_batch[Columns.LOSS_MASK] = old & ~dead
            if metrics is not None:
                in_loss = int(old.sum())
                fraction = float((old & dead).sum()) / in_loss if in_loss else 0.0
                metrics.log_value((mid, DEAD_FRACTION_KEY), fraction, window=1)
        return batch
