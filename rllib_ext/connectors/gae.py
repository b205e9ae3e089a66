"""``CompiledGAE``: drop-in for RLlib's ``GeneralAdvantageEstimation`` learner connector piece.

Where it sits: last piece of the PPO learner connector pipeline, in the slot where
``PPOLearner.build`` appends ``GeneralAdvantageEstimation`` (``PPOExtTorchLearner`` swaps it).
What it needs before it: ``AddOneTsToEpisodesAndTruncate`` (one bootstrap step appended to
every episode chunk, ``terminateds``/``truncateds`` set on the chunk's last real step) and a
complete train batch (observations, rewards, flags; ``[B, T]`` zero-padded for stateful
modules).

Differences from RLlib's piece, none of which change the numbers with the default settings:

* the value pass runs under ``torch.no_grad()`` (RLlib's builds an autograd graph it never uses);
* GAE is :func:`rllib_ext.ops.gae.compute_value_targets`: one numba-compiled backward pass
  over all episode chunks, no Python loop over time steps (``gae="compiled"``);
* unpadding/re-padding for stateful modules is one boolean-mask operation, no per-episode loop;
* ``standardize_advantages`` ("all" = RLlib, "masked", "none") is an explicit option.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.typing import EpisodeType

from rllib_ext._validation import check_choice
from rllib_ext.ops.gae import compute_value_targets
from rllib_ext.settings import STANDARDIZE_MODES

__all__ = ["CompiledGAE", "check_bootstrap_step_before_gae", "padding_mask"]

GAE_TIME_KEY = "rllib_ext/gae/time_ms"
GAE_IMPL_KEY = "rllib_ext/gae/compiled"
"""``<mid>/<this>``: 1.0 when this piece (not RLlib's) computed the module's advantages."""


_BOOTSTRAP_PIECE = "AddOneTsToEpisodesAndTruncate"


def check_bootstrap_step_before_gae(pipeline: Any) -> None:
    """Raises unless RLlib's ``AddOneTsToEpisodesAndTruncate`` runs before its GAE piece.

    ``CompiledGAE`` bootstraps from the step that piece appends to every chunk. A learner
    pipeline without it (RLlib's GAE rewrite, ray#61319, drops it) would make the values of
    the last real step the bootstrap, so rllib_ext refuses instead of computing that.
    """
    names = [type(piece).__name__ for piece in pipeline.connectors]
    gae = names.index(GeneralAdvantageEstimation.__name__)
    if _BOOTSTRAP_PIECE not in names[:gae]:
        raise ValueError(
            f"gae='compiled' needs RLlib's {_BOOTSTRAP_PIECE} before its GAE piece, but the "
            f"learner pipeline of Ray {ray.__version__} is {names}. Fix: gae='rllib' (RLlib's "
            "own GAE), or a Ray release rllib-ext is tested with (`rllib-ext doctor`)."
        )


def padding_mask(episode_lens: np.ndarray, max_seq_len: int) -> np.ndarray:
    """Which cells of the ``[R, max_seq_len]`` zero-padded layout hold real data.

    Layout as RLlib's ``split_and_zero_pad_n_episodes``: each episode of length ``L`` fills
    ``ceil(L / max_seq_len)`` rows, the last one right-padded.

    Args:
        episode_lens: ``[E]`` int, lengths in batch order.
        max_seq_len: row length ``T``.

    Returns:
        ``[R, T]`` bool, ``R = sum(ceil(L / T))``; row-major order of the ``True`` cells is
        the flat (unpadded) order.
    """
    lens = np.asarray(episode_lens, dtype=np.int64)
    rows_per_ep = -(-lens // max_seq_len)
    fill = np.full(int(rows_per_ep.sum()), max_seq_len, dtype=np.int64)
    last_rows = np.cumsum(rows_per_ep) - 1
    fill[last_rows] = lens - (rows_per_ep - 1) * max_seq_len
    return np.arange(max_seq_len)[None, :] < fill[:, None]


def _flat(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class CompiledGAE(GeneralAdvantageEstimation):
    """Computes ``advantages`` and ``value_targets`` for every module with a value function.

    Writes, per module id ``mid`` in the batch: ``batch[mid]["advantages"]`` and
    ``batch[mid]["value_targets"]`` as float32 tensors on the module's device, shape ``[N]``
    (``[B, T]`` for stateful modules), exactly as RLlib's piece does.
    Logs ``<mid>/gae/time_ms`` (wall time of this piece) and ``<mid>/gae/compiled`` (1.0)
    into the learner's metrics.
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        gamma: float,
        lambda_: float,
        standardize_advantages: str = "all",
    ) -> None:
        super().__init__(input_observation_space, input_action_space, gamma=gamma, lambda_=lambda_)
        check_choice(
            "standardize_advantages",
            standardize_advantages,
            STANDARDIZE_MODES,
            example="CompiledGAE(..., standardize_advantages='all')",
        )
        self.standardize_advantages = standardize_advantages

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
        start = time.perf_counter()
        module_ids = [
            mid
            for mid in batch
            if mid in rl_module and isinstance(rl_module[mid].unwrapped(), ValueFunctionAPI)
        ]
        if not module_ids:
            return batch
        # Episode lengths are only needed to undo/redo zero-padding of stateful modules.
        episode_lens: list[tuple[Any, int]] = []
        if any(rl_module[mid].unwrapped().is_stateful() for mid in module_ids):
            episode_lens = [
                (e.module_id, len(e))
                for e in self.single_agent_episode_iterator(
                    episodes, agents_that_stepped_only=False
                )
            ]

        for mid in module_ids:
            module = rl_module[mid].unwrapped()
            module_batch = batch[mid]
            with torch.no_grad():
                vf_preds = module.compute_values(module_batch)
            device = vf_preds.device
            values = _flat(vf_preds)
            mask = None
            if module.is_stateful():
                # As RLlib: single-agent episodes carry module_id None.
                lens = [n for owner, n in episode_lens if owner is None or owner == mid]
                mask = padding_mask(np.asarray(lens), module.model_config["max_seq_len"])

            def unpad(x: Any, mask: np.ndarray | None = mask) -> np.ndarray:
                arr = _flat(x)
                return arr[mask] if mask is not None and arr.ndim == 2 else arr.reshape(-1)

            values = unpad(values).astype(np.float32, copy=False)
            # Rounded exactly as RLlib: advantages -> float32, then + values.
            value_targets = compute_value_targets(
                values,
                unpad(module_batch[Columns.REWARDS]),
                unpad(module_batch[Columns.TERMINATEDS]),
                unpad(module_batch[Columns.TRUNCATEDS]),
                self.gamma,
                self.lambda_,
            )
            advantages = value_targets - values
            advantages = self._standardize(advantages, module_batch, unpad)

            if mask is not None:
                advantages, value_targets = (
                    self._repad(a, mask) for a in (advantages, value_targets)
                )
            module_batch[Postprocessing.ADVANTAGES] = torch.from_numpy(advantages).to(device)
            module_batch[Postprocessing.VALUE_TARGETS] = torch.from_numpy(value_targets).to(device)

        if metrics is not None:
            elapsed_ms = (time.perf_counter() - start) * 1e3
            for mid in module_ids:
                metrics.log_value((mid, GAE_TIME_KEY), elapsed_ms, window=1)
                metrics.log_value((mid, GAE_IMPL_KEY), 1.0, window=1)
        return batch

    def _standardize(
        self, advantages: np.ndarray, module_batch: dict[str, Any], unpad: Any
    ) -> np.ndarray:
        mode = self.standardize_advantages
        if mode == "none":
            return advantages.astype(np.float32, copy=False)
        if mode == "masked" and Columns.LOSS_MASK in module_batch:
            sel = advantages[unpad(module_batch[Columns.LOSS_MASK]).astype(bool)]
        else:
            # "all" (RLlib): the bootstrap rows appended per chunk enter mean and std too.
            sel = advantages
        std = max(1e-4, float(sel.std())) if sel.size else 1.0
        mean = float(sel.mean()) if sel.size else 0.0
        return ((advantages - mean) / std).astype(np.float32)

    @staticmethod
    def _repad(flat: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = np.zeros(mask.shape, dtype=np.float32)
        out[mask] = flat
        return out
