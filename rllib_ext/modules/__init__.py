"""RLModules: action-masked PPO (feed-forward or recurrent) with an optional central critic,
and the SMAC spec builder."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_ext.modules.masked_ppo import CENTRAL_CRITIC_KEY, MaskedPPOTorchRLModule
from rllib_ext.modules.masked_recurrent import (
    RECURRENT_CELL_KEY,
    RECURRENT_CELLS,
    MaskedRecurrentPPOTorchRLModule,
)

__all__ = [
    "CENTRAL_CRITIC_KEY",
    "RECURRENT_CELLS",
    "RECURRENT_CELL_KEY",
    "MaskedPPOTorchRLModule",
    "MaskedRecurrentPPOTorchRLModule",
    "masked_module_class",
    "smac_module_spec",
]


def masked_module_class(model_config: Any) -> type:
    """The masked module for ``model_config``: :class:`MaskedRecurrentPPOTorchRLModule` when
    ``model_config["recurrent_cell"]`` is set (``"gru"``/``"lstm"``), else
    :class:`MaskedPPOTorchRLModule`.

    Raises:
        ValueError: ``recurrent_cell`` is neither ``None`` nor one of ``"gru"``, ``"lstm"``.
    """
    if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        model_config = dataclasses.asdict(model_config)
    cell = (model_config or {}).get(RECURRENT_CELL_KEY)
    if cell is None:
        return MaskedPPOTorchRLModule
    if cell not in RECURRENT_CELLS:
        raise ValueError(
            f"model_config['{RECURRENT_CELL_KEY}']={cell!r} is not supported; allowed values: "
            f"None, {', '.join(repr(c) for c in RECURRENT_CELLS)}. Fix: pass e.g. "
            f"model_config={{'{RECURRENT_CELL_KEY}': 'gru'}} (None: the feed-forward module)."
        )
    return MaskedRecurrentPPOTorchRLModule


def smac_module_spec(
    *,
    policy_ids: Iterable[str] = ("shared_policy",),
    central_critic: bool = False,
    recurrent_cell: str | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> Any:
    """A ``MultiRLModuleSpec`` with one masked PPO module per policy id.

    Spaces are left to RLlib, which reads them from the env's agents mapped to each policy.
    ``model_config`` is merged over the config's ``.rl_module(model_config=...)``.

    Args:
        policy_ids: the module ids, e.g. ``("shared_policy",)`` for parameter sharing.
        central_critic: value head on the global ``"state"`` (MAPPO-style).
        recurrent_cell: ``None`` (:class:`MaskedPPOTorchRLModule`, feed-forward), ``"gru"`` or
            ``"lstm"`` (:class:`MaskedRecurrentPPOTorchRLModule`; sizes from ``lstm_cell_size``
            and ``max_seq_len`` in ``model_config``).
        model_config: extra ``DefaultModelConfig`` fields (``fcnet_hiddens``, ...).

    Example::

        config.multi_agent(policies={"shared_policy"},
                           policy_mapping_fn=lambda agent_id, *a, **kw: "shared_policy")
        config.rl_module(rl_module_spec=smac_module_spec(central_critic=True,
                                                         recurrent_cell="gru"))
    """
    if not isinstance(central_critic, bool):
        raise ValueError(f"central_critic={central_critic!r}; allowed: True, False.")
    ids = [policy_ids] if isinstance(policy_ids, str) else list(policy_ids)
    if not ids:
        raise ValueError("policy_ids is empty. Fix: pass e.g. ('shared_policy',).")
    config = {**(model_config or {}), CENTRAL_CRITIC_KEY: central_critic}
    if recurrent_cell is not None:
        config[RECURRENT_CELL_KEY] = recurrent_cell
    module_class = masked_module_class(config)
    return MultiRLModuleSpec(
        rl_module_specs={
            policy_id: RLModuleSpec(module_class=module_class, model_config=dict(config))
            for policy_id in ids
        }
    )
