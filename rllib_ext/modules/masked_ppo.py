"""Action-masked PPO RLModule with an optional central critic on the global state (MAPPO-style).

Observation contract (what :class:`rllib_ext.envs.smac.SMACEnv` emits per agent)::

    Dict({"observations": Box(obs_dim), "action_mask": Box(0, 1, (n_actions,)),
          "state": Box(state_dim)})          # "state" optional; needed by the central critic

* The policy (and, without central critic, the value function) is RLlib's default PPO network
  built on ``"observations"`` only.
* Masking: logits of illegal actions are replaced by the most negative float32, in float32
  (also under fp16 autocast, where ``log(0)`` would turn into ``-inf`` and entropies into NaN),
  so a masked action has probability exactly 0 and is never sampled.
* ``model_config={"central_critic": True}``: the value head reads an MLP encoding of
  ``"state"`` (same ``fcnet_*`` settings as the policy) instead of the agent's observation,
  like MAPPO's centralised value function (Yu et al. 2022, https://arxiv.org/abs/2103.01955).
  Execution stays decentralised: env runners build the module ``inference_only`` and drop the
  critic; ``"state"`` is only read in training.
* ``model_config={"value_norm": True}`` (``"value_norm_beta"``, default 0.99999): the value head
  learns normalized targets (MAPPO's ValueNorm, :mod:`rllib_ext.modules.value_norm`);
  ``compute_values`` returns de-normalized values, so GAE and bootstrapping see returns.
  The statistics are buffers of this module (checkpoints, weight sync).
* ``model_config={"death_masking": True}``: ``PPOExtTorchLearner`` drops dead agents' rows from
  the PPO loss (:mod:`rllib_ext.connectors.death_mask` holds the rule).

Both need ``PPOExtTorchLearner`` (``rllib_ext.PPOConfig``'s learner), which reads them from the
module. RLlib's own ``PPOTorchLearner`` would ignore them, so ``forward_train`` raises until that
learner has claimed the module (:mod:`rllib_ext.modules.learner_options`).

Works with one shared policy for all agents (``MultiRLModuleSpec`` with one module) or one per
agent; see :func:`rllib_ext.modules.smac_module_spec`. Pattern after RLlib's
``examples/rl_modules/classes/action_masking_rlm.py``, without mutating the input batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT, ActorCriticEncoder
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.modules.learner_options import DEATH_MASKING_KEY, LearnerOptionsAPI
from rllib_ext.modules.value_norm import VALUE_NORM_KEY, ValueNormAPI, check_value_norm_options

__all__ = [
    "CENTRAL_CRITIC_KEY",
    "CRITIC_RECURRENT_KEY",
    "DEATH_MASKING_KEY",
    "RECURRENT_CELLS",
    "RECURRENT_CELL_KEY",
    "VALUE_NORM_KEY",
    "MaskedPPOTorchRLModule",
    "check_masked_module_options",
    "mask_logits",
]

CENTRAL_CRITIC_KEY = "central_critic"
RECURRENT_CELL_KEY = "recurrent_cell"
"""``model_config`` key selecting the recurrent module and its cell."""
RECURRENT_CELLS: tuple[str, ...] = ("gru", "lstm")
CRITIC_RECURRENT_KEY = "critic_recurrent"
"""``model_config`` key of the recurrent module: a recurrent cell in the central critic."""

_FLOAT32_MIN = torch.finfo(torch.float32).min

_SPACE_HELP = (
    'Expected gymnasium.spaces.Dict({"observations": Box, "action_mask": Box(0, 1, (n,)), '
    '"state": Box (optional)}) such as rllib_ext.envs.smac.SMACEnv emits.'
)


def _model_config_dict(model_config: Any) -> dict[str, Any]:
    if model_config is None:
        return {}
    if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        return dataclasses.asdict(model_config)
    return dict(model_config)


def mask_logits(output: dict[str, Any], action_mask: torch.Tensor) -> dict[str, Any]:
    """``output`` with its action logits ``[B, n]`` (or ``[B, T, n]``) set to float32's minimum
    where ``action_mask`` (same shape, 1 = legal) is 0; logits are cast to float32 first, so the
    masked value stays finite under autocast and a masked action's probability is exactly 0."""
    logits = output[Columns.ACTION_DIST_INPUTS].float()
    output[Columns.ACTION_DIST_INPUTS] = torch.where(
        action_mask > 0.5, logits, torch.full_like(logits, _FLOAT32_MIN)
    )
    return output


def check_masked_module_options(model_config: Any) -> dict[str, Any]:
    """Validates the options this module adds to ``model_config``; returns them as a dict.

    Keys: ``central_critic``, ``value_norm``, ``value_norm_beta``, ``death_masking``.

    Raises:
        ValueError: a bad value (names it and the allowed values).
    """
    config = _model_config_dict(model_config)
    for key in (CENTRAL_CRITIC_KEY, DEATH_MASKING_KEY):
        value = config.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(
                f"model_config['{key}']={value!r}; allowed: True, False. "
                f"Fix: model_config={{'{key}': True}}."
            )
    value_norm, beta = check_value_norm_options(config)
    return {
        CENTRAL_CRITIC_KEY: config.get(CENTRAL_CRITIC_KEY, False),
        VALUE_NORM_KEY: value_norm,
        "value_norm_beta": beta,
        DEATH_MASKING_KEY: config.get(DEATH_MASKING_KEY, False),
    }


def check_masked_observation_space(
    owner: str, observation_space: gym.Space | None, *, central_critic: bool
) -> gym.spaces.Dict:
    """``observation_space`` if it is the masked modules' ``Dict`` (with ``"state"`` when the
    central critic is on), else one ``ValueError``. ``owner``: the module class named."""
    if not isinstance(observation_space, gym.spaces.Dict) or not {
        "observations",
        "action_mask",
    } <= set(observation_space.spaces):
        raise ValueError(f"{owner} got observation_space={observation_space}. " + _SPACE_HELP)
    if central_critic and "state" not in observation_space.spaces:
        raise ValueError(
            f"model_config['{CENTRAL_CRITIC_KEY}']=True needs a 'state' entry in the "
            "observation. Fix: env_config={'include_state': True} (the SMAC default)."
        )
    return observation_space


class MaskedPPOTorchRLModule(DefaultPPOTorchRLModule, ValueNormAPI, LearnerOptionsAPI):
    """PPO RLModule for ``Dict`` observations with an action mask (see module docstring)."""

    def __init__(
        self,
        *,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        inference_only: bool | None = None,
        learner_only: bool = False,
        model_config: dict[str, Any] | DefaultModelConfig | None = None,
        catalog_class: Any = None,
        **kwargs: Any,
    ) -> None:
        config = _model_config_dict(model_config)
        options = check_masked_module_options(config)
        central = options[CENTRAL_CRITIC_KEY]
        observation_space = check_masked_observation_space(
            "MaskedPPOTorchRLModule", observation_space, central_critic=central
        )
        if config.get(RECURRENT_CELL_KEY) is not None:
            raise ValueError(
                f"model_config['{RECURRENT_CELL_KEY}']={config[RECURRENT_CELL_KEY]!r} needs the "
                "recurrent module, but this is MaskedPPOTorchRLModule (feed-forward), so the cell "
                "would be ignored. Fix: build the spec with rllib_ext.modules.smac_module_spec("
                f"recurrent_cell={config[RECURRENT_CELL_KEY]!r}) (or module_class="
                "MaskedRecurrentPPOTorchRLModule), or drop recurrent_cell."
            )
        for key in ("orthogonal_init", CRITIC_RECURRENT_KEY):
            if config.get(key):
                raise ValueError(
                    f"model_config['{key}']=True is an option of the recurrent module "
                    "(MaskedRecurrentPPOTorchRLModule); this feed-forward module would ignore "
                    f"it. Fix: add recurrent_cell='gru', or drop {key}."
                )
        if central and config.get("use_lstm", False):
            raise ValueError(
                f"model_config['{CENTRAL_CRITIC_KEY}']=True with use_lstm=True is not supported. "
                "Fix: use the central critic with the MLP encoder (use_lstm=False)."
            )
        # Set before nn.Module.__init__: plain attributes, not parameters (RLlib's pattern).
        self._full_observation_space = observation_space
        self._central_critic = central
        self._death_masking = options[DEATH_MASKING_KEY]
        super().__init__(
            observation_space=observation_space["observations"],
            action_space=action_space,
            inference_only=inference_only,
            learner_only=learner_only,
            model_config=model_config,
            catalog_class=catalog_class,
            **kwargs,
        )
        # The networks are built; from now on the module reports the space it consumes.
        self.observation_space = self._full_observation_space

    @property
    def central_critic(self) -> bool:
        """Whether the value head reads the global state."""
        return self._central_critic

    @property
    def death_masking(self) -> bool:
        """Whether the learner drops dead agents' rows from the loss."""
        return self._death_masking

    @override(DefaultPPOTorchRLModule)
    def setup(self) -> None:
        if self._central_critic:
            # The observation-based critic encoder would never be used: share it away.
            self.catalog.actor_critic_encoder_config.shared = True
        super().setup()
        self.setup_value_norm(_model_config_dict(self.model_config))
        if self._central_critic:
            defaults = dataclasses.asdict(DefaultModelConfig())
            config = defaults | _model_config_dict(self.model_config)
            encoder_config = private.encoder_config(
                observation_space=self._full_observation_space["state"],
                model_config_dict=config,
            )
            # Same fcnet_hiddens as the policy, so the catalog's value head fits its output.
            self.central_critic_encoder = encoder_config.build(framework="torch")

    @override(DefaultPPOTorchRLModule)
    def get_non_inference_attributes(self) -> list[str]:
        names = [*super().get_non_inference_attributes(), VALUE_NORM_KEY]
        return [*names, "central_critic_encoder"] if self._central_critic else names

    def _split(self, batch: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor, Any]:
        obs = batch[Columns.OBS]
        if not isinstance(obs, dict) or "action_mask" not in obs or "observations" not in obs:
            raise ValueError(
                f"MaskedPPOTorchRLModule needs dict observations; got {type(obs).__name__} "
                f"with keys {sorted(obs) if isinstance(obs, dict) else '-'}. " + _SPACE_HELP
            )
        inner = dict(batch)  # shallow copy: the caller's batch keeps its dict observations
        inner[Columns.OBS] = obs["observations"]
        return inner, obs["action_mask"], obs.get("state")

    def _state_embeddings(self, state: Any) -> torch.Tensor:
        return self.central_critic_encoder({Columns.OBS: state})[ENCODER_OUT]

    @override(DefaultPPOTorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        inner, action_mask, _ = self._split(batch)
        encoder = self.encoder
        if isinstance(encoder, ActorCriticEncoder) and not encoder.config.shared:
            # Acting reads only the policy tower; with vf_share_layers=False RLlib's
            # ActorCriticEncoder would also run the critic's tower and drop its output.
            features = encoder.actor_encoder(inner, **kwargs)[ENCODER_OUT]
            return mask_logits({Columns.ACTION_DIST_INPUTS: self.pi(features)}, action_mask)
        return mask_logits(super()._forward(inner, **kwargs), action_mask)

    @override(DefaultPPOTorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.check_learner_options()
        inner, action_mask, state = self._split(batch)
        output = super()._forward_train(inner, **kwargs)
        if self._central_critic:
            # PPO's loss calls compute_values(batch, embeddings=output[EMBEDDINGS]).
            output[Columns.EMBEDDINGS] = self._state_embeddings(state)
        return mask_logits(output, action_mask)

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        # De-normalized with value norm on (see ValueNormAPI.values_from_head).
        if embeddings is not None:
            return self.values_from_head(super().compute_values(batch, embeddings))
        inner, _, state = self._split(batch)
        if self._central_critic:
            return self.values_from_head(
                super().compute_values(inner, self._state_embeddings(state))
            )
        return self.values_from_head(super().compute_values(inner))
