"""Recurrent (GRU or LSTM) action-masked PPO RLModule with an optional central critic.

The recurrent sibling of :class:`rllib_ext.modules.MaskedPPOTorchRLModule`, for the
published SMAC PPO recipes (MAPPO's rMAPPO, JaxMARL's MAPPO/IPPO with a GRU). Same
observation contract::

    Dict({"observations": Box(obs_dim), "action_mask": Box(0, 1, (n_actions,)),
          "state": Box(state_dim)})          # "state" optional; needed by the central critic

Network (``model_config`` keys; RLlib's ``DefaultModelConfig`` defaults where they exist)::

    observations -> MLP(fcnet_hiddens, fcnet_activation) -> GRU/LSTM(lstm_cell_size)
                 -> MLP(head_fcnet_hiddens, head_fcnet_activation) -> logits
                                  \\-> MLP(head_fcnet_hiddens) -> value  (no central critic)
    state        -> MLP(fcnet_hiddens, fcnet_activation) [-> GRU/LSTM(lstm_cell_size)]
                 -> MLP(head_fcnet_hiddens, head_fcnet_activation) -> value  (central_critic=True)

* ``head_fcnet_hiddens`` / ``head_fcnet_activation`` (RLlib's keys; default ``[]``: the
  logits and value read the GRU / encoder directly): a hidden layer after the recurrent cell, as
  in JaxMARL's MAPPO/IPPO actors (GRU 128 -> Dense 128 relu -> logits); the policy and value
  heads each get their own stack.

* ``recurrent_cell``: ``"gru"`` or ``"lstm"`` (selects this module in
  :func:`rllib_ext.modules.smac_module_spec` and the SMAC config defaults).
* ``lstm_cell_size`` (RLlib's key, the hidden size for both cells) and ``max_seq_len``
  (RLlib's: the learner trains on chunks of at most this many steps, each starting from the
  recurrent state the env runner recorded).
* Masking: :func:`~rllib_ext.modules.masked_ppo.mask_logits`, the same code as the feed-forward
  module (illegal logits = most negative float32, so a masked action is never sampled).
* ``central_critic=True``: the value reads a feed-forward MLP of ``"state"`` (with
  ``env_config={"state_mode": "agent_specific"}`` MAPPO's state + agent id); the GRU serves
  the policy only and env runners build the module ``inference_only`` without the critic.
  Without it, policy and value share the recurrent trunk (JaxMARL's IPPO-RNN layout).
* ``critic_recurrent=True`` (needs ``central_critic``): a cell of the same type and size between
  the critic's encoder and its head (JaxMARL's MAPPO ``CriticRNN``). Its state travels with the
  policy's in ``STATE_IN`` / ``STATE_OUT`` (keys ``critic_h`` (, ``critic_c``)): env runners keep
  the critic's encoder and cell (not its head) and step them beside the policy, so the episodes
  record the critic's state and the learner starts each training sequence of the critic, as of
  the policy, from the state recorded at its first step (RLlib's ``AddStatesFromEpisodesToBatch``).
  :meth:`critic_attributes` names what the value alone reads (``optimizers="actor_critic"``).
* ``orthogonal_init`` (default ``False``: torch's default initialization): JaxMARL's
  MAPPO/IPPO initialization (and CleanRL's): orthogonal kernels with gain sqrt(2) in the
  encoders, 2 in the ``head_fcnet_hiddens`` layers, 0.01 for the logits and 1 for the value;
  zero biases; the GRU/LSTM as flax's cells: LeCun-normal input kernels, orthogonal recurrent
  kernels (per gate), zero biases.
* ``value_norm`` / ``value_norm_beta`` / ``death_masking``: as for the feed-forward module
  (validated by the same :func:`~rllib_ext.modules.masked_ppo.check_masked_module_options`).

Recurrent state (``Columns.STATE_IN`` / ``STATE_OUT``): ``{"h": [B, H]}`` for the GRU,
``{"h": [B, H], "c": [B, H]}`` for the LSTM, plus the same keys prefixed ``critic_`` with
``critic_recurrent``; :meth:`get_initial_state` returns zeros ``[H]`` per key.
Inputs carry a time axis ``[B, T, ...]`` (RLlib's ``AddTimeDimToBatchAndZeroPad``; ``T=1`` on
env runners), outputs too (logits ``[B, T, A]``, values ``[B, T]``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.models.utils import get_activation_fn
from ray.rllib.utils.annotations import override
from torch import nn

from rllib_ext.modules.learner_options import DEATH_MASKING_KEY, LearnerOptionsAPI
from rllib_ext.modules.masked_ppo import (
    CENTRAL_CRITIC_KEY,
    CRITIC_RECURRENT_KEY,
    RECURRENT_CELL_KEY,
    RECURRENT_CELLS,
    check_masked_module_options,
    check_masked_observation_space,
    mask_logits,
)
from rllib_ext.modules.value_norm import VALUE_NORM_KEY, ValueNormAPI

__all__ = [
    "CRITIC_RECURRENT_KEY",
    "RECURRENT_CELLS",
    "RECURRENT_CELL_KEY",
    "MaskedRecurrentPPOTorchRLModule",
]


_SPACE_HELP = (
    'Expected gymnasium.spaces.Dict({"observations": Box, "action_mask": Box(0, 1, (n,)), '
    '"state": Box (optional)}) such as rllib_ext.envs.smac.SMACEnv emits.'
)


def _mlp(in_size: int, hiddens: list[int], activation: Any) -> tuple[nn.Module, int]:
    """``Linear -> activation`` per hidden size; returns the stack and its output size."""
    layers: list[nn.Module] = []
    act_cls = get_activation_fn(activation, framework="torch")
    for size in hiddens:
        layers.append(nn.Linear(in_size, size))
        if act_cls is not None:
            layers.append(act_cls())
        in_size = size
    return nn.Sequential(*layers), in_size


ORTHOGONAL_INIT_KEY = "orthogonal_init"
"""``model_config`` key: JaxMARL's / CleanRL's initialization (module docstring)."""
_CRITIC_STATE_PREFIX = "critic_"


def _orthogonal_(stack: nn.Module, gain: float) -> None:
    """Orthogonal kernels with ``gain``, zero biases, for every ``nn.Linear`` in ``stack``."""
    for layer in stack.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


def _flax_rnn_(rnn: nn.GRU | nn.LSTM) -> None:
    """flax's cell initialization: LeCun-normal input kernels, orthogonal recurrent kernels
    per gate block, zero biases."""
    for name, param in rnn.named_parameters():
        if name.startswith("weight_ih"):
            nn.init.normal_(param, std=param.shape[1] ** -0.5)
        elif name.startswith("weight_hh"):
            for block in param.data.split(param.shape[1]):
                nn.init.orthogonal_(block)
        else:
            nn.init.zeros_(param)


def recurrent_model_config(model_config: Any) -> dict[str, Any]:
    """RLlib's ``DefaultModelConfig`` defaults under ``model_config``, validated.

    Raises:
        ValueError: a bad ``recurrent_cell`` / ``central_critic`` / size, or ``use_lstm=True``
            (RLlib's own LSTM wrapper) together with ``recurrent_cell``.
    """
    if model_config is None:
        user: dict[str, Any] = {}
    elif dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        user = dataclasses.asdict(model_config)
    else:
        user = dict(model_config)
    config = dataclasses.asdict(DefaultModelConfig()) | {RECURRENT_CELL_KEY: "gru"} | user
    cell = config[RECURRENT_CELL_KEY]
    if cell not in RECURRENT_CELLS:
        raise ValueError(
            f"model_config['{RECURRENT_CELL_KEY}']={cell!r} is not supported; allowed values: "
            f"{', '.join(repr(c) for c in RECURRENT_CELLS)}. Fix: pass e.g. "
            f"model_config={{'{RECURRENT_CELL_KEY}': 'gru'}}."
        )
    check_masked_module_options(config)  # central_critic, value_norm(_beta), death_masking
    if config.get("use_lstm"):
        raise ValueError(
            f"model_config has use_lstm=True and {RECURRENT_CELL_KEY}={cell!r}: use_lstm wraps "
            "RLlib's default encoder in its own LSTM. Fix: drop use_lstm (recurrent_cell='lstm' "
            "gives the masked module an LSTM)."
        )
    for key in (ORTHOGONAL_INIT_KEY, CRITIC_RECURRENT_KEY):
        if not isinstance(config.get(key, False), bool):
            raise ValueError(
                f"model_config['{key}']={config[key]!r}; allowed values: True, False. "
                f"Fix: model_config={{'{key}': True}}."
            )
    if config.get(CRITIC_RECURRENT_KEY) and not config.get(CENTRAL_CRITIC_KEY):
        raise ValueError(
            f"model_config['{CRITIC_RECURRENT_KEY}']=True needs "
            f"model_config['{CENTRAL_CRITIC_KEY}']=True (without a central critic the value "
            "already reads the policy's recurrent cell). Fix: add central_critic=True, or drop "
            f"{CRITIC_RECURRENT_KEY}."
        )
    for key in ("lstm_cell_size", "max_seq_len"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"model_config['{key}']={value!r} must be an integer >= 1.")
    return config


class MaskedRecurrentPPOTorchRLModule(
    TorchRLModule, ValueFunctionAPI, InferenceOnlyAPI, ValueNormAPI, LearnerOptionsAPI
):
    """Recurrent PPO RLModule for ``Dict`` observations with an action mask (module docstring)."""

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
        config = recurrent_model_config(model_config)
        observation_space = check_masked_observation_space(
            "MaskedRecurrentPPOTorchRLModule",
            observation_space,
            central_critic=bool(config.get(CENTRAL_CRITIC_KEY, False)),
        )
        # The full dict (RLlib's connectors read model_config["max_seq_len"]).
        super().__init__(
            observation_space=observation_space,
            action_space=action_space,
            inference_only=inference_only,
            learner_only=learner_only,
            model_config=config,
            catalog_class=catalog_class,
            **kwargs,
        )

    @override(RLModule)
    def setup(self) -> None:
        config = self.model_config
        spaces = self.observation_space.spaces
        self._cell_type: str = config[RECURRENT_CELL_KEY]
        self._cell_size: int = config["lstm_cell_size"]
        options = check_masked_module_options(config)
        self._central_critic: bool = options[CENTRAL_CRITIC_KEY]
        self._critic_recurrent = bool(config.get(CRITIC_RECURRENT_KEY, False))
        self._death_masking: bool = options[DEATH_MASKING_KEY]
        hiddens, activation = list(config["fcnet_hiddens"]), config["fcnet_activation"]
        obs_dim = int(np.prod(spaces["observations"].shape))
        self.encoder, size = _mlp(obs_dim, hiddens, activation)
        cell_cls = nn.GRU if self._cell_type == "gru" else nn.LSTM
        self.rnn = cell_cls(size, self._cell_size, batch_first=True)
        head, head_activation = list(config["head_fcnet_hiddens"]), config["head_fcnet_activation"]
        # Empty stacks without head_fcnet_hiddens: the parameter names stay "pi.*" / "vf.*".
        self.pi_head, size = _mlp(self._cell_size, head, head_activation)
        self.pi = nn.Linear(size, int(self.action_space.n))
        if self._central_critic:
            state_dim = int(np.prod(spaces["state"].shape))
            self.central_critic_encoder, size = _mlp(state_dim, hiddens, activation)
            if self._critic_recurrent:
                self.critic_rnn = cell_cls(size, self._cell_size, batch_first=True)
                size = self._cell_size
        else:
            size = self._cell_size
        self.vf_head, size = _mlp(size, head, head_activation)
        self.vf = nn.Linear(size, 1)
        if config.get(ORTHOGONAL_INIT_KEY, False):
            self._orthogonal_init()
        self.setup_value_norm(config)

    def _orthogonal_init(self) -> None:
        """``orthogonal_init=True`` (module docstring); gains as JaxMARL's MAPPO."""
        for stack in (self.encoder, getattr(self, "central_critic_encoder", nn.Sequential())):
            _orthogonal_(stack, 2**0.5)
        _flax_rnn_(self.rnn)
        if self._critic_recurrent:
            _flax_rnn_(self.critic_rnn)
        for stack in (self.pi_head, self.vf_head):
            _orthogonal_(stack, 2.0)
        _orthogonal_(self.pi, 0.01)
        _orthogonal_(self.vf, 1.0)

    @property
    def central_critic(self) -> bool:
        """Whether the value head reads the global state."""
        return self._central_critic

    @property
    def death_masking(self) -> bool:
        """Whether the learner drops dead agents' rows from the loss."""
        return self._death_masking

    @property
    def recurrent_cell(self) -> str:
        """``"gru"`` or ``"lstm"``."""
        return self._cell_type

    @property
    def critic_recurrent(self) -> bool:
        """Whether the central critic has its own recurrent cell (and state)."""
        return self._critic_recurrent

    @override(RLModule)
    def get_initial_state(self) -> dict[str, np.ndarray]:
        keys = ["h"] if self._cell_type == "gru" else ["h", "c"]
        if self._critic_recurrent:
            keys += [_CRITIC_STATE_PREFIX + key for key in keys]
        return {key: np.zeros((self._cell_size,), dtype=np.float32) for key in keys}

    def critic_attributes(self) -> list[str]:
        """The attributes only the value reads: the ``"critic"`` group of
        ``optimizers="actor_critic"`` (:mod:`rllib_ext.learners.optimizer_groups`)."""
        names = ["vf_head", "vf", VALUE_NORM_KEY]
        if not self._central_critic:
            return names
        return [*names, "central_critic_encoder", *(["critic_rnn"] * self._critic_recurrent)]

    @override(TorchRLModule)
    def set_state(self, state: dict[str, Any]) -> None:
        """RLlib's (a non-strict load), refusing a whole module's weights saved with the other
        ``critic_recurrent``, which the non-strict load would skip or leave untrained in silence.

        Raises:
            ValueError: naming both settings and the fix.
        """
        if any(key.startswith("rnn.") for key in state):
            saved = any(key.startswith("critic_rnn.") for key in state)
            if saved != self._critic_recurrent:
                raise ValueError(
                    f"These module weights were saved with model_config['{CRITIC_RECURRENT_KEY}']="
                    f"{saved}, but this module has {CRITIC_RECURRENT_KEY}="
                    f"{self._critic_recurrent}. Fix: build it with --model-config "
                    f"'{{\"{CRITIC_RECURRENT_KEY}\": {str(saved).lower()}}}' (model_config="
                    f"{{'{CRITIC_RECURRENT_KEY}': {saved}}}), or start a new run."
                )
        super().set_state(state)

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        # A recurrent critic's encoder and cell stay on env runners, which keep its state.
        keep = {"central_critic_encoder", "critic_rnn"} if self._critic_recurrent else set()
        return [name for name in self.critic_attributes() if name not in keep]

    def _split(self, batch: dict[str, Any]) -> tuple[Any, torch.Tensor, Any]:
        obs = batch[Columns.OBS]
        if not isinstance(obs, dict) or "action_mask" not in obs or "observations" not in obs:
            raise ValueError(
                f"MaskedRecurrentPPOTorchRLModule needs dict observations; got "
                f"{type(obs).__name__} with keys {sorted(obs) if isinstance(obs, dict) else '-'}. "
                + _SPACE_HELP
            )
        return obs["observations"], obs["action_mask"], obs.get("state")

    def _recur(
        self, rnn: nn.Module, inputs: torch.Tensor, state_in: dict[str, torch.Tensor], prefix: str
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``[B, T, D]`` and ``{prefix + "h": [B, H](, prefix + "c")}`` -> ``[B, T, H]`` and the
        state out under the same keys."""
        # nn.GRU / nn.LSTM take the state with a leading layer axis (one layer here).
        h = state_in[prefix + "h"].unsqueeze(0)
        if self._cell_type == "gru":
            features, h_out = rnn(inputs, h)
            return features, {prefix + "h": h_out.squeeze(0)}
        features, (h_out, c_out) = rnn(inputs, (h, state_in[prefix + "c"].unsqueeze(0)))
        return features, {prefix + "h": h_out.squeeze(0), prefix + "c": c_out.squeeze(0)}

    def _features(
        self, observations: torch.Tensor, state_in: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy's ``[B, T, obs_dim]`` -> ``[B, T, H]`` and its state out."""
        return self._recur(self.rnn, self.encoder(observations.float()), state_in, "")

    def _critic_features(
        self, state: torch.Tensor, state_in: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The central critic's ``[B, T, state_dim]`` -> its head's input and its state out
        (empty without ``critic_recurrent``)."""
        embedded = self.central_critic_encoder(state.float())
        if not self._critic_recurrent:
            return embedded, {}
        if _CRITIC_STATE_PREFIX + "h" not in state_in:
            raise ValueError(
                f"model_config['{CRITIC_RECURRENT_KEY}']=True: the batch has no critic state "
                f"(Columns.STATE_IN keys {sorted(state_in)}). Fix: pass the state the module "
                "recorded (RLlib's AddStatesFromEpisodesToBatch adds it) or get_initial_state()."
            )
        return self._recur(self.critic_rnn, embedded, state_in, _CRITIC_STATE_PREFIX)

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        observations, action_mask, state = self._split(batch)
        features, state_out = self._features(observations, batch[Columns.STATE_IN])
        if self._critic_recurrent:  # env runners step the critic's cell to record its state
            state_out |= self._critic_features(state, batch[Columns.STATE_IN])[1]
        logits = self.pi(self.pi_head(features))
        output = {Columns.ACTION_DIST_INPUTS: logits, Columns.STATE_OUT: state_out}
        return mask_logits(output, action_mask)

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.check_learner_options()
        observations, action_mask, state = self._split(batch)
        features, state_out = self._features(observations, batch[Columns.STATE_IN])
        embeddings = features
        if self._central_critic:
            embeddings, critic_state_out = self._critic_features(state, batch[Columns.STATE_IN])
            state_out |= critic_state_out
        output = {
            Columns.ACTION_DIST_INPUTS: self.pi(self.pi_head(features)),
            Columns.STATE_OUT: state_out,
            # PPO's loss calls compute_values(batch, embeddings=output[EMBEDDINGS]).
            Columns.EMBEDDINGS: embeddings,
        }
        return mask_logits(output, action_mask)

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Values ``[B, T]`` (``embeddings``: ``forward_train``'s, else computed from the batch);
        de-normalized with ``value_norm`` on (see ``ValueNormAPI.values_from_head``)."""
        if embeddings is None:
            observations, _, state = self._split(batch)
            if self._central_critic:
                embeddings = self._critic_features(state, batch.get(Columns.STATE_IN, {}))[0]
            else:
                features, _ = self._features(observations, batch[Columns.STATE_IN])
                embeddings = features
        return self.values_from_head(self.vf(self.vf_head(embeddings)).squeeze(-1))
