"""``compile_update=True``: each minibatch's forward and PPO loss as one ``torch.compile`` graph.

Per minibatch, RLlib's ``TorchLearner`` runs the module's ``forward_train`` and
``PPOTorchLearner.compute_loss_for_module`` eagerly, op by op, and backward through them the
same way. On a small network that is mostly per-op overhead. :class:`CompiledPPOLoss` traces
both into one graph (``fullgraph=True``, inductor), so AOTAutograd also compiles their backward;
the gradient stages after it (``compute_gradients`` -> ``postprocess_gradients`` ->
``apply_gradients``, :mod:`rllib_ext.learners.gradient_step`) are unchanged.

The loss is RLlib's PPO loss term for term (``ray.rllib.algorithms.ppo.torch.ppo_torch_learner``,
Ray 2.58-2.60), with one change of form: RLlib's masked mean ``sum(x[mask]) / sum(mask)`` is
``sum(where(mask, x, 0)) / sum(mask)`` (the same value up to summation order; a boolean index
has a data-dependent shape, which a graph cannot hold). Its statistics go to the
``MetricsLogger`` under RLlib's keys with RLlib's ``window=1``. The entropy coefficient and the
KL coefficient enter as tensors, so their schedules do not recompile the graph.

Scope (:func:`why_not_compiled`, decided when the learner is built, before any update): one
module, not stateful, on one learner (no DDP), without AMP or value normalisation, and a
learner whose loss is rllib_ext's (no ``compute_loss_for_module`` / ``compute_losses``
override). Outside it, or where the first trace fails (no C++ compiler for inductor, a module
dynamo cannot trace: nothing has run yet, so RLlib's eager step takes that minibatch), the
update is RLlib's eager one: a :class:`EagerUpdate` warning once per reason, and
``learners/__all_modules__/rllib_ext/compiled_update`` is 0.0 (1.0 where compiled).

Cost: the first update traces and compiles (seconds to tens of seconds on a CPU, cached on
disk by inductor for later processes), and so does the first update at each further torch
thread count (inductor's CPU kernels are built for one; ``cpu_threads=0`` switches between 1 and
2, so up to two graphs). Measured in ``benchmarks/README.md``, "One learner update, eager and
compiled".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY, Learner
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance
from ray.rllib.utils.typing import ModuleID

__all__ = ["COMPILED_UPDATE_KEY", "CompiledPPOLoss", "EagerUpdate", "ppo_loss", "why_not_compiled"]

COMPILED_UPDATE_KEY = "rllib_ext/compiled_update"
"""``learners/__all_modules__/rllib_ext/compiled_update``: 1.0 where the last update's
minibatches ran the compiled forward and loss, 0.0 where RLlib's eager step ran."""


class EagerUpdate(UserWarning):
    """``compile_update=True`` but RLlib's eager update step runs (the message says why); warned
    once per learner and reason."""


def _masked_mean(mask: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if mask is None:
        return torch.mean
    num_valid = torch.sum(mask)

    def mean(data: torch.Tensor) -> torch.Tensor:
        # RLlib: torch.sum(data[mask]) / num_valid; `mask` indexes data's leading dims.
        keep = mask.reshape(mask.shape + (1,) * (data.dim() - mask.dim()))
        return torch.sum(torch.where(keep, data, torch.zeros_like(data))) / num_valid

    return mean


def ppo_loss(
    module: Any,
    config: Any,
    batch: Mapping[str, Any],
    entropy_coeff: torch.Tensor,
    kl_coeff: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``module.forward_train(batch)`` and RLlib's PPO loss of one module's minibatch.

    Args:
        module: the module (unwrapped ``TorchRLModule`` with ``compute_values``).
        config: the module's ``PPOConfig`` (``clip_param``, ``vf_clip_param``,
            ``vf_loss_coeff``, ``use_kl_loss``, ``use_critic``).
        batch: the minibatch's columns, each ``[B, ...]``; ``Columns.LOSS_MASK`` (bool ``[B]``)
            optional.
        entropy_coeff, kl_coeff: scalar tensors (the schedulers' current values).

    Returns:
        The total loss (scalar) and RLlib's logged statistics by key (scalars).
    """
    fwd_out = module.forward_train(batch)
    mask = batch.get(Columns.LOSS_MASK)
    mean = _masked_mean(mask)
    curr_dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
    prev_dist = module.get_exploration_action_dist_cls().from_logits(
        batch[Columns.ACTION_DIST_INPUTS]
    )
    logp_ratio = torch.exp(curr_dist.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP])
    if config.use_kl_loss:
        mean_kl_loss = mean(prev_dist.kl(curr_dist))
    else:
        mean_kl_loss = torch.tensor(0.0, device=logp_ratio.device)
    curr_entropy = curr_dist.entropy()
    advantages = batch[Postprocessing.ADVANTAGES]
    surrogate_loss = torch.min(
        advantages * logp_ratio,
        advantages * torch.clamp(logp_ratio, 1 - config.clip_param, 1 + config.clip_param),
    )
    targets = batch[Postprocessing.VALUE_TARGETS]
    if config.use_critic:
        value_fn_out = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
        vf_loss = torch.pow(value_fn_out - targets, 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
        mean_vf_loss = mean(vf_loss_clipped)
        mean_vf_unclipped_loss = mean(vf_loss)
    else:
        zero = torch.tensor(0.0, device=surrogate_loss.device)
        value_fn_out = mean_vf_unclipped_loss = vf_loss_clipped = mean_vf_loss = zero
    total_loss = mean(
        -surrogate_loss + config.vf_loss_coeff * vf_loss_clipped - entropy_coeff * curr_entropy
    )
    if config.use_kl_loss:
        total_loss = total_loss + kl_coeff * mean_kl_loss
    stats = {
        POLICY_LOSS_KEY: -mean(surrogate_loss),
        VF_LOSS_KEY: mean_vf_loss,
        LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: mean_vf_unclipped_loss,
        LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(targets, value_fn_out),
        ENTROPY_KEY: mean(curr_entropy),
        LEARNER_RESULTS_KL_KEY: mean_kl_loss,
    }
    return total_loss, stats


def _fill_kl_lookup(module: Any, logits: torch.Tensor) -> None:
    """Runs the loss's KL once eagerly (on ``logits``, no grad) so torch.distributions' KL
    lookup table holds the pair of distribution types before the trace: dynamo cannot trace the
    lookup itself (it fails on Normal's) and, for a pair already there, guards on the table."""
    with torch.no_grad():
        prev = module.get_exploration_action_dist_cls().from_logits(logits)
        prev.kl(module.get_train_action_dist_cls().from_logits(logits))


def why_not_compiled(learner: Any, rllib_ext_loss: Callable[..., Any]) -> str | None:
    """Why ``learner``'s minibatch step cannot run :func:`ppo_loss` compiled, or ``None``.

    ``rllib_ext_loss``: rllib_ext's own ``compute_loss_for_module`` (the one :func:`ppo_loss`
    reproduces where no module normalises values).
    """
    cls = type(learner)
    if cls.compute_loss_for_module is not rllib_ext_loss:
        return f"{cls.__name__} overrides compute_loss_for_module"
    if cls.compute_losses is not Learner.compute_losses:
        return f"{cls.__name__} overrides compute_losses"
    if learner.config.torch_compile_learner:
        return "RLlib's torch_compile_learner=True compiles the update itself"
    if learner.config.num_learners > 1:
        return "num_learners >= 2 (DDP-wrapped modules)"
    if learner.amp.enabled:
        return f"amp={learner.ext_settings.amp.amp!r} (autocast around the loss)"
    module_ids = list(learner.module.keys())
    if len(module_ids) != 1:
        return f"{len(module_ids)} modules (one is compiled)"
    module = learner.module[module_ids[0]].unwrapped()
    if module.is_stateful():
        return f"module {module_ids[0]!r} is stateful (sequence batches)"
    if getattr(module, "value_norm", None) is not None:
        return f"module {module_ids[0]!r} normalises values (value_norm=True)"
    return None


class CompiledPPOLoss:
    """One learner's compiled :func:`ppo_loss`; see the module docstring.

    :meth:`losses` returns the loss per module for one minibatch (its statistics logged), or
    ``None`` where RLlib's eager step must run it.
    """

    def __init__(self, learner: Any, rllib_ext_loss: Callable[..., Any]) -> None:
        self._learner = learner
        self._warned: set[str] = set()
        self._compiled: Callable[..., Any] | None = None
        self._traced = False
        why_not = why_not_compiled(learner, rllib_ext_loss)
        if why_not is None:
            self._compiled = torch.compile(ppo_loss, fullgraph=True)
        else:
            self._warn(why_not)

    def _warn(self, why: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(
                f"rllib_ext: compile_update=True, but RLlib's eager update step runs: {why}.",
                EagerUpdate,
                stacklevel=3,
            )

    def log_mode(self) -> None:
        """Logs :data:`COMPILED_UPDATE_KEY` for the update about to run."""
        self._learner.metrics.log_value(
            (ALL_MODULES, COMPILED_UPDATE_KEY), float(self._compiled is not None), window=1
        )

    def _eager(self, why: str) -> None:
        """This minibatch runs RLlib's eager step: warned once per reason, reported as 0."""
        self._warn(why)
        self._learner.metrics.log_value((ALL_MODULES, COMPILED_UPDATE_KEY), 0.0, window=1)

    def losses(self, batch: Mapping[ModuleID, Any]) -> dict[ModuleID, torch.Tensor] | None:
        if self._compiled is None:
            return None
        if len(batch) != 1:
            self._eager(f"a minibatch for {len(batch)} modules")
            return None
        ((module_id, module_batch),) = batch.items()
        mask = module_batch.get(Columns.LOSS_MASK)
        if mask is not None and mask.dtype != torch.bool:
            self._eager(f"the loss mask is {mask.dtype}, not torch.bool")
            return None
        learner = self._learner
        module = learner.module[module_id].unwrapped()
        config = learner.config.get_config_for_module(module_id)
        entropy_coeff = torch.as_tensor(
            learner.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        )
        kl_coeff = torch.as_tensor(learner.curr_kl_coeffs_per_module[module_id])
        columns = dict(module_batch.items())
        if not self._traced and config.use_kl_loss:
            _fill_kl_lookup(module, columns[Columns.ACTION_DIST_INPUTS])
        try:
            loss, stats = self._compiled(module, config, columns, entropy_coeff, kl_coeff)
        except Exception as exc:  # noqa: BLE001 - only before the first trace succeeded
            if self._traced:
                raise
            # The trace failed before anything ran: the eager step takes this minibatch.
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            self._compiled = None
            self._eager(f"torch.compile failed ({type(exc).__name__}: {first})")
            return None
        self._traced = True
        learner.metrics.log_dict(stats, key=module_id, window=1)
        return {module_id: loss}
