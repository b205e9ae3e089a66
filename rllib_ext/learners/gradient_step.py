"""The gradient half of ``PPOExtTorchLearner``'s update step, as ordered stages.

RLlib's ``TorchLearner`` runs, per minibatch, ``compute_gradients`` -> ``postprocess_gradients``
-> ``apply_gradients``. :class:`GradientStep` gives each rllib_ext feature the stage it owns,
in this order (the RLlib seam that calls it in brackets)::

    1. backward  [compute_gradients]      fp16: each module's loss times its loss scale. With
                                          num_learners >= 2, DDP all-reduces the gradients
                                          during backward, through the compression hook when
                                          grad_compression is set (rllib_ext.learners.comm).
    2. unscale   [postprocess_gradients]  fp16: GradScaler.unscale_ per optimizer, which also
                                          records whether a gradient is inf/nan.
    3. clip      [postprocess_gradients]  RLlib's grad_clip (lean_update: the foreach global
                                          norm of rllib_ext.learners.lean).
    4. step      [apply_gradients]        exactly one of:
                                          fp16: GradScaler.step (skipped on inf/nan) + update;
                                          lean: finite gradients -> each optimizer's step
                                          (fused Adam);
                                          else RLlib's apply_gradients (its checks, warnings).
    5. after     [apply_gradients]        each module's :class:`StepOutcome` goes to its
                                          listeners: the comm hook's error-feedback memory
                                          follows the loss scale; AMP and comm metrics.

Every stage runs outside the forward's autocast region (the learner leaves it around each
seam). Features meet only through :class:`StepOutcome`: AMP does not call compression, and a
new feature adds a listener, not a branch in the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray.rllib.utils.typing import ModuleID, ParamDict, TensorType

from rllib_ext import _rllib_private as private
from rllib_ext.learners import lean
from rllib_ext.learners.amp import AMP_METRIC, AMPState
from rllib_ext.learners.comm import CommCompression

__all__ = ["GradientStep", "StepOutcome"]


@dataclass(frozen=True)
class StepOutcome:
    """What stage 4 did to one module: ``scale_factor`` = loss scale after / before the step
    (1.0 without fp16), ``skipped`` = the optimizer step was skipped (inf/nan under fp16)."""

    scale_factor: float = 1.0
    skipped: bool = False


class GradientStep:
    """Stages 1-5 of the module docstring for one learner (``learner``: the
    ``PPOExtTorchLearner`` whose optimizers, parameters and metrics they use)."""

    def __init__(
        self, learner: Any, *, amp: AMPState, comm: CommCompression, lean_update: bool
    ) -> None:
        self._learner = learner
        self.amp = amp
        self.comm = comm
        self.lean_update = lean_update
        self._modules_in_step: tuple[ModuleID, ...] = ()

    # 1. backward -------------------------------------------------------------------------

    def backward(
        self,
        loss_per_module: dict[ModuleID, TensorType],
        rllib_backward: Callable[[dict[ModuleID, TensorType]], ParamDict],
    ) -> ParamDict:
        """RLlib's backward (``rllib_backward``) of the losses, loss-scaled under fp16."""
        if not self.amp.scaling:
            return rllib_backward(loss_per_module)
        scaled = {mid: self.amp.scaler(mid).scale(loss) for mid, loss in loss_per_module.items()}
        gradients = rllib_backward(scaled)
        self._modules_in_step = tuple(loss_per_module) if gradients else ()
        return gradients

    # 2. unscale, 3. clip ---------------------------------------------------------------

    def postprocess(
        self, gradients: ParamDict, rllib_postprocess: Callable[[ParamDict], ParamDict]
    ) -> ParamDict:
        """Unscales (fp16) in place, then RLlib's ``postprocess_gradients`` clips, so
        ``grad_clip`` means what it means in fp32."""
        if self.amp.scaling:
            # GradScaler records inf/nan per optimizer here; its `step` will not unscale again.
            for mid in self._modules_in_step:
                scaler = self.amp.scaler(mid)
                for _, optim in self._learner.get_optimizers_for_module(mid):
                    scaler.unscale_(optim)
        return rllib_postprocess(gradients)

    # 4. step, 5. after -------------------------------------------------------------------

    def apply(self, gradients: ParamDict, rllib_apply: Callable[[ParamDict], None]) -> None:
        """Stage 4 (one step per optimizer, by exactly one path) and stage 5."""
        if self.amp.scaling:
            outcomes = self._scaled_step(gradients)
        else:
            if self._lean_step_applies(gradients):
                self._set_gradients(gradients)
                for mid in private.optimizer_module_ids(self._learner):
                    for _, optim in self._learner.get_optimizers_for_module(mid):
                        optim.step()
            else:
                rllib_apply(gradients)
            outcomes = {mid: StepOutcome() for mid in private.optimizer_module_ids(self._learner)}
        self._after(outcomes)

    def _lean_step_applies(self, gradients: ParamDict) -> bool:
        """Whether RLlib's ``apply_gradients`` would just set the gradients and step every
        optimizer: ``lean_update``, all gradients finite, no LR scheduler classes, no grad
        scalers of RLlib's."""
        config = self._learner.config
        return (
            self.lean_update
            and private.torch_lr_scheduler_classes(config) is None
            and private.torch_grad_scaler_class(config) is None
            and lean.all_finite(gradients.values())
        )

    def _set_gradients(self, gradients: ParamDict) -> None:
        for pid, grad in gradients.items():
            private.learner_param(self._learner, pid).grad = grad

    def _scaled_step(self, gradients: ParamDict) -> dict[ModuleID, StepOutcome]:
        self._set_gradients(gradients)
        outcomes = {}
        for mid in self._modules_in_step:
            scaler = self.amp.scaler(mid)
            before = scaler.get_scale()
            # No nan_to_num: GradScaler.step skips the optimizer step when unscale_ found
            # inf/nan, so Adam's moments never see a non-finite gradient.
            for _, optim in self._learner.get_optimizers_for_module(mid):
                scaler.step(optim)
            scaler.update()
            after = scaler.get_scale()
            # The scale only shrinks after a step with inf/nan gradients.
            outcomes[mid] = StepOutcome(scale_factor=after / before, skipped=after < before)
        return outcomes

    def _after(self, outcomes: dict[ModuleID, StepOutcome]) -> None:
        metrics = self._learner.metrics
        for mid, outcome in outcomes.items():
            # The comm hook's error-feedback memory holds loss-scaled gradients.
            self.comm.rescale(mid, outcome.scale_factor)
            if outcome.skipped:
                self.amp.skipped_steps[mid] = self.amp.skipped_steps.get(mid, 0) + 1
                metrics.log_value((mid, f"{AMP_METRIC}/skipped_steps"), 1, reduce="sum")
            if self.amp.enabled:
                self._log_amp(mid)
        if self.comm.enabled:
            self.comm.log_stats(metrics)

    def _log_amp(self, mid: ModuleID) -> None:
        metrics = self._learner.metrics
        if private.learner_index(self._learner) == 0:
            # A string "item" cannot be merged across learners: rank 0 reports it (all ranks
            # run the same dtype).
            metrics.log_value((mid, f"{AMP_METRIC}/dtype"), self.amp.dtype_name, reduce="item")
        if self.amp.scaling:
            scaler = self.amp.scaler(mid)
            metrics.log_value((mid, f"{AMP_METRIC}/loss_scale"), scaler.get_scale(), window=1)
            metrics.log_value(
                (mid, f"{AMP_METRIC}/skipped_steps_lifetime"),
                self.amp.skipped_steps.get(mid, 0),
                window=1,
            )
            metrics.log_value((mid, f"{AMP_METRIC}/skipped_steps"), 0, reduce="sum")
