"""What ``rllib_ext.PPOConfig`` fills in for rllib_ext's SMAC env (``smac_v2``, ``smac``, ``smax``
while those names hold rllib_ext's env, or the ``SMACEnv`` class).

* policies: one ``"shared_policy"`` for all agents (parameter sharing, the SMAC norm), unless
  the config is already multi-agent;
* callbacks: :class:`~rllib_ext.envs.smac.SMACMetricsCallback` added (``rllib_ext/win_rate``...), next to
  the user's callbacks;
* RLModule: :class:`~rllib_ext.modules.MaskedPPOTorchRLModule` as the default module class
  (RLlib's ``get_default_rl_module_spec``), with the central critic when
  ``.rl_module(model_config={"central_critic": True})``, and
  :class:`~rllib_ext.modules.MaskedRecurrentPPOTorchRLModule` when ``model_config`` sets
  ``"recurrent_cell"`` (``"gru"``/``"lstm"``); an explicit ``.rl_module(rl_module_spec=...)``
  wins.

The config applies these when its flags are set (``.environment()``, ``.callbacks()``...),
never in ``validate()``.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_ext.callbacks import add_callback
from rllib_ext.envs import is_smac_env
from rllib_ext.modules import masked_module_class

__all__ = [
    "SHARED_POLICY_ID",
    "apply_smac_defaults",
    "shared_policy_mapping",
    "smac_default_rl_module_spec",
]

SHARED_POLICY_ID = "shared_policy"
"""The policy every SMAC agent maps to when the config leaves policies unset."""


def shared_policy_mapping(agent_id: Any, *args: Any, **kwargs: Any) -> str:
    """Policy mapping of parameter sharing: every agent -> :data:`SHARED_POLICY_ID`."""
    return SHARED_POLICY_ID


def apply_smac_defaults(config: Any) -> None:
    """Shared policy and the SMAC metrics callback for rllib_ext's SMAC env (idempotent, else
    no-op; a user's env registered under a SMAC name is not ours: :func:`~rllib_ext.envs.
    is_smac_env`). The env-runner class is the runner table's (:mod:`rllib_ext.runner_table`)."""
    # lazy: rllib_ext.envs.smac loads the SMAX backend; keeps it out of import rllib_ext.config
    from rllib_ext.envs.smac import SMACMetricsCallback

    if not is_smac_env(config.env):
        return
    if not config.is_multi_agent:
        config.multi_agent(policies={SHARED_POLICY_ID}, policy_mapping_fn=shared_policy_mapping)
    add_callback(config, SMACMetricsCallback)


def smac_default_rl_module_spec(config: Any) -> Any:
    """The masked PPO module spec for a SMAC env, ``None`` for any other env.

    ``model_config`` is left to RLlib, which fills in ``.rl_module(model_config=...)`` (where
    ``central_critic`` lives) when it builds the modules.
    """
    if not is_smac_env(config.env):
        return None
    return RLModuleSpec(module_class=masked_module_class(config.model_config))
