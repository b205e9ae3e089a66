"""RLModules: action-masked PPO with an optional central critic, and the SMAC spec builder."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rllib_ext.modules.masked_ppo import CENTRAL_CRITIC_KEY, MaskedPPOTorchRLModule

__all__ = ["CENTRAL_CRITIC_KEY", "MaskedPPOTorchRLModule", "smac_module_spec"]


def smac_module_spec(
    *,
    policy_ids: Iterable[str] = ("shared_policy",),
    central_critic: bool = False,
    model_config: Mapping[str, Any] | None = None,
) -> Any:
    """A ``MultiRLModuleSpec`` with one :class:`MaskedPPOTorchRLModule` per policy id.

    Spaces are left to RLlib, which reads them from the env's agents mapped to each policy.
    ``model_config`` is merged over the config's ``.rl_module(model_config=...)``.

    Args:
        policy_ids: the module ids, e.g. ``("shared_policy",)`` for parameter sharing.
        central_critic: value head on the global ``"state"`` (MAPPO-style).
        model_config: extra ``DefaultModelConfig`` fields (``fcnet_hiddens``, ...).

    Example::

        config.multi_agent(policies={"shared_policy"},
                           policy_mapping_fn=lambda agent_id, *a, **kw: "shared_policy")
        config.rl_module(rl_module_spec=smac_module_spec(central_critic=True))
    """
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    if not isinstance(central_critic, bool):
        raise ValueError(f"central_critic={central_critic!r}; allowed: True, False.")
    ids = [policy_ids] if isinstance(policy_ids, str) else list(policy_ids)
    if not ids:
        raise ValueError("policy_ids is empty. Fix: pass e.g. ('shared_policy',).")
    config = {**(model_config or {}), CENTRAL_CRITIC_KEY: central_critic}
    return MultiRLModuleSpec(
        rl_module_specs={
            policy_id: RLModuleSpec(module_class=MaskedPPOTorchRLModule, model_config=dict(config))
            for policy_id in ids
        }
    )
