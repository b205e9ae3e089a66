"""``PPOExtTorchLearner``: RLlib's PPO torch learner with the rllib_ext components.

Components, each switched on by its settings (``rllib_ext.settings``):

* compiled GAE: swaps RLlib's ``GeneralAdvantageEstimation`` for ``CompiledGAE``;
* vectorized batching: fuses RLlib's default episodes-to-batch pieces into
  ``VectorizedEpisodesToBatch`` (``rllib_ext.connectors.batching``);
* AMP: autocast around forward + loss only (backward outside), fp16 loss scaling with one
  ``torch.amp.GradScaler`` per module, gradients unscaled before ``grad_clip``, steps with
  inf/nan gradients skipped (see ``rllib_ext.learners.amp``);
* gradient compression: a DDP comm hook per module when ``num_learners >= 2``
  (see ``rllib_ext.learners.comm``);
* per-module options of :class:`rllib_ext.modules.MaskedPPOTorchRLModule` (``model_config``):
  ``death_masking`` puts ``DeathMask`` before the GAE piece; ``value_norm`` puts
  ``UpdateValueNorm`` after it and computes the value loss on normalized values and targets.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import ALL_MODULES, COMPONENT_METRICS_LOGGER, COMPONENT_OPTIMIZER
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ModuleID, ParamDict, StateDict, TensorType

from rllib_ext import _rllib_private as private
from rllib_ext._threads import CPU_THREADS_KEY, LearnerThreads
from rllib_ext.amp_choice import resolve_amp_dtype
from rllib_ext.config_checks import check_algorithm_config
from rllib_ext.learners import lean
from rllib_ext.learners.amp import AMP_METRIC, AMPState
from rllib_ext.learners.checkpoint_state import (
    METRICS_STATE_KEY,
    merged_metrics_state,
    split_metrics_state,
)
from rllib_ext.learners.comm import CommCompression
from rllib_ext.learners.compiled_loss import CompiledPPOLoss
from rllib_ext.learners.deferred_metrics import deferred_metrics
from rllib_ext.learners.gradient_step import GradientStep
from rllib_ext.learners.minibatches import indexed_or_rllib, with_num_minibatches
from rllib_ext.learners.optimizer_groups import check_saved_layout, optimizer_groups
from rllib_ext.learners.pipeline import (
    install_compiled_gae,
    install_module_options,
    install_vectorized_batching_pieces,
)
from rllib_ext.modules.value_norm import ValueNormAPI
from rllib_ext.settings import ExtensionSettings

__all__ = ["PPOExtTorchLearner"]

logger = logging.getLogger(__name__)

AMP_STATE_KEY = "rllib_ext_amp"
COMM_STATE_KEY = "rllib_ext_comm"


class PPOExtTorchLearner(PPOTorchLearner):
    """PPO torch learner that reads its components from ``config.learner_config_dict``.

    Works with ``rllib_ext.PPOConfig`` and with the stock config
    (``.learners(learner_class=PPOExtTorchLearner, learner_config_dict={...})``).
    Results carry ``learners/<module>/gae/...`` and ``learners/<module>/amp/...``.
    """

    ext_settings: ExtensionSettings
    amp: AMPState
    comm: CommCompression
    rllib_ext_applies_learner_options: ClassVar[bool] = True
    """Declares that this learner applies the modules' ``value_norm`` / ``death_masking``
    (:data:`rllib_ext.modules.learner_options.APPLIES_LEARNER_OPTIONS`)."""

    @override(PPOTorchLearner)
    def build(self) -> None:
        # Validate first: a bad flag must fail before any module or optimizer is built. The same
        # function as rllib_ext.PPOConfig.validate(), so the stock-config route fails the same.
        checked = check_algorithm_config(self.config)
        self.ext_settings = checked.settings
        amp_settings = self.ext_settings.amp
        if private.learner_index(self) == 0:
            for message in checked.warnings:
                logger.warning(message)
        # Before super().build(): TorchLearner.build ends by wrapping modules in DDP, which is
        # where the comm hooks get registered.
        self.comm = CommCompression(self.ext_settings.comm)
        super().build()
        # Before any step: torch's intra-op threads where this learner runs on the CPU.
        self.threads = LearnerThreads(self.ext_settings.update.cpu_threads, self.device.type)
        self.amp = AMPState(
            settings=amp_settings,
            device=self.device,
            dtype=resolve_amp_dtype(amp_settings.amp, self.device),
        )
        self.gradient_step = GradientStep(
            self, amp=self.amp, comm=self.comm, lean_update=self.ext_settings.update.lean_update
        )
        self._minibatch_fallbacks: set[str] = set()
        self.compiled_loss = self._compiled_loss()
        install_compiled_gae(self, self.ext_settings.gae)
        install_vectorized_batching_pieces(self, self.ext_settings.batching)
        install_module_options(self)

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        super()._make_modules_ddp_if_necessary()
        self.comm.register(self.module)

    @override(TorchLearner)
    def add_module(self, **kwargs: Any) -> Any:
        spec = super().add_module(**kwargs)
        self.comm.register(self.module)
        install_module_options(self)
        self.compiled_loss = self._compiled_loss()
        return spec

    def _compiled_loss(self) -> CompiledPPOLoss | None:
        """``compile_update``: the compiled forward and loss (``None`` where off)."""
        if not self.ext_settings.update.compile_update:
            return None
        return CompiledPPOLoss(self, PPOExtTorchLearner.compute_loss_for_module)

    # -- loss -------------------------------------------------------------------------------

    @override(PPOTorchLearner)
    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config: Any,
        batch: dict[str, Any],
        fwd_out: dict[str, TensorType],
    ) -> TensorType:
        """RLlib's PPO loss; with value norm, its value terms in normalized units.

        The targets are normalized with the statistics ``UpdateValueNorm`` moved for this
        training batch and the module's ``compute_values`` returns the head's normalized output
        (``normalized_values()``), so ``vf_loss``, ``vf_clip_param`` and ``vf_explained_var``
        are on the normalized scale (MAPPO's loss).
        """
        module = self.module[module_id].unwrapped()
        norm = getattr(module, "value_norm", None) if isinstance(module, ValueNormAPI) else None
        if norm is None or not config.use_critic:
            return super().compute_loss_for_module(
                module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
            )
        # A shallow copy: the minibatch itself keeps the targets in return units.
        normalized = dict(batch)
        normalized[Postprocessing.VALUE_TARGETS] = norm.normalize(
            batch[Postprocessing.VALUE_TARGETS]
        )
        with module.normalized_values():
            return super().compute_loss_for_module(
                module_id=module_id, config=config, batch=normalized, fwd_out=fwd_out
            )

    # -- update -----------------------------------------------------------------------------

    @override(Learner)
    def update(self, *args: Any, **kwargs: Any) -> Any:
        """RLlib's update, with torch's CPU threads for it set first (``cpu_threads``, results:
        ``learners/__all_modules__/rllib_ext/cpu_threads``); with ``lean_update``, the metrics
        its minibatches log reach the ``MetricsLogger`` once per update
        (``rllib_ext.learners.deferred_metrics``)."""
        threads = self.threads.before_update()
        lean_update = self.ext_settings.update.lean_update
        with deferred_metrics(self) if lean_update else contextlib.nullcontext():
            if self.device.type == "cpu":
                self.metrics.log_value((ALL_MODULES, CPU_THREADS_KEY), threads, window=1)
            if self.compiled_loss is not None:
                self.compiled_loss.log_mode()
            return super().update(*args, **kwargs)

    @override(Learner)
    def _create_iterator_if_necessary(self, **kwargs: Any) -> Any:
        # RLlib's choice of iterator; with lean_update, its cyclic iterator's minibatches by
        # index gathers in the same order (rllib_ext.learners.minibatches). A train batch the
        # learner connector built from episodes here is RLlib's local: no caller sees its rows'
        # final order.
        batch_iter = super()._create_iterator_if_necessary(**kwargs)
        batch_iter = with_num_minibatches(batch_iter, self.ext_settings.update.num_minibatches)
        if not self.ext_settings.update.lean_update:
            return batch_iter
        training_data = kwargs.get("training_data")
        from_episodes = getattr(training_data, "episodes", None) is not None
        return indexed_or_rllib(
            self, batch_iter, self._minibatch_fallbacks, leave_final_order=not from_episodes
        )

    # -- update step ------------------------------------------------------------------------

    # Autocast covers RLlib's forward and loss only. `_uncompiled_update` (RLlib 2.58, bound by
    # TorchLearner.build) runs forward_train -> compute_losses -> compute_gradients ->
    # postprocess_gradients -> apply_gradients; the three gradient seams below leave the
    # autocast region again and hand over to the ordered stages of `self.gradient_step`
    # (rllib_ext.learners.gradient_step), so backward, clipping and the optimizer step run as
    # without AMP.
    # No RLlib body is copied; tests/learners/test_amp.py checks the regions op by op.

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, Any, dict]:
        """TorchLearner's update step, entered under autocast when AMP is on; with
        ``compile_update``, the compiled forward and loss followed by the same gradient seams
        (``TorchLearner._uncompiled_update``'s order, single learner, so no ``no_sync``)."""
        losses = None if self.compiled_loss is None else self.compiled_loss.losses(batch)
        if losses is not None:
            private.compute_off_policyness(self, batch)
            gradients = self.compute_gradients(losses)
            self.apply_gradients(self.postprocess_gradients(gradients))
            return {}, losses, {}
        if not self.amp.enabled:
            return super()._uncompiled_update(batch, **kwargs)
        with self.amp.autocast():
            return super()._uncompiled_update(batch, **kwargs)

    def _outside_autocast(self) -> contextlib.AbstractContextManager:
        """Leaves the update's autocast region (nothing to leave when AMP is off)."""
        if not self.amp.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.amp.device.type, enabled=False)

    @override(TorchLearner)
    def compute_gradients(
        self, loss_per_module: dict[ModuleID, TensorType], **kwargs: Any
    ) -> ParamDict:
        # Stage 1 (rllib_ext.learners.gradient_step). Backward outside autocast (PyTorch AMP
        # guidance): each op's backward runs in the dtype autocast chose for its forward.
        with self._outside_autocast():
            rllib_backward = super().compute_gradients
            return self.gradient_step.backward(
                loss_per_module, lambda losses: rllib_backward(losses, **kwargs)
            )

    @override(Learner)
    def postprocess_gradients(self, gradients_dict: ParamDict) -> ParamDict:
        # Stages 2-3: unscale (fp16), then RLlib's clip.
        with self._outside_autocast():
            return self.gradient_step.postprocess(gradients_dict, super().postprocess_gradients)

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id: ModuleID, config: Any = None) -> None:
        update = self.ext_settings.update
        if not update.lean_update and update.optimizers == "module":
            return super().configure_optimizers_for_module(module_id, config)
        # RLlib's optimizer (Adam, torch's defaults, the config's lr or schedule), fused with
        # lean_update; one per group of rllib_ext.learners.optimizer_groups.
        adam = lean.adam if update.lean_update else torch.optim.Adam
        module = self.module[module_id]
        groups = optimizer_groups(module_id, module, self.get_parameters(module), update.optimizers)
        for name, params in groups:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=adam(params),
                params=params,
                lr_or_lr_schedule=config.lr,
            )

    @override(TorchLearner)
    def _get_clip_function(self) -> Callable[..., Any]:
        if self.ext_settings.update.lean_update:
            return lean.clip_gradients
        return super()._get_clip_function()

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: ParamDict) -> None:
        # Stages 4-5: one optimizer step per module by exactly one path, then its listeners.
        with self._outside_autocast():
            self.gradient_step.apply(gradients_dict, super().apply_gradients)

    # -- checkpoints ------------------------------------------------------------------------

    @override(Learner)
    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kw: Any
    ) -> StateDict:
        state = super().get_state(components, not_components=not_components, **kw)
        if COMPONENT_METRICS_LOGGER in state:
            # Ours apart: a stock learner restoring this checkpoint must not report them.
            state[COMPONENT_METRICS_LOGGER], ours = split_metrics_state(
                state[COMPONENT_METRICS_LOGGER]
            )
            state[METRICS_STATE_KEY] = ours
        if private.check_component(self, AMP_STATE_KEY, components, not_components):
            state[AMP_STATE_KEY] = self.amp.get_state()
        if self.comm.enabled and private.check_component(
            self, COMM_STATE_KEY, components, not_components
        ):
            state[COMM_STATE_KEY] = self.comm.get_state()
        return state

    @override(Learner)
    def set_state(self, state: StateDict) -> None:
        if COMPONENT_OPTIMIZER in state:
            check_saved_layout(
                self, state[COMPONENT_OPTIMIZER], self.ext_settings.update.optimizers
            )
        super().set_state(state)
        if state.get(METRICS_STATE_KEY):
            self.metrics.set_state(
                merged_metrics_state(self.metrics.get_state(), state[METRICS_STATE_KEY])
            )
        if COMPONENT_OPTIMIZER in state and self.ext_settings.update.lean_update:
            # A stock checkpoint's optimizer state brings RLlib's plain Adam flags with it.
            for mid in private.optimizer_module_ids(self):
                for _, optim in self.get_optimizers_for_module(mid):
                    lean.keep_lean(optim)
        if AMP_STATE_KEY in state:
            self.amp.set_state(state[AMP_STATE_KEY])
        if private.learner_index(self) != 0:
            # Restored metrics come from rank 0; only rank 0 may hold the string item.
            for mid in self.module.keys():
                self.metrics.delete(mid, f"{AMP_METRIC}/dtype", key_error=False)
        if COMM_STATE_KEY in state and self.comm.enabled:
            self.comm.set_state(state[COMM_STATE_KEY])
