"""DDP communication hooks for compressed gradient exchange (no Ray import).

Shaped like PyTorch's ``torch.distributed.algorithms.ddp_comm_hooks``: each hook is a free
function ``hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]`` over a
state object, registered with ``ddp_module.register_comm_hook(state, hook)``. The learner builds
them from its settings with :func:`rllib_ext.learners.comm.make_comm_hook`.

==========  =============================  ============================================  ============================================
module      hook / state                   wire format (``n`` fp32 grads, ``W`` ranks)   bytes this rank sends (ring collectives)
==========  =============================  ============================================  ============================================
``cast``    ``fp16_hook`` / FP16State      all-reduce fp16                               ``2 (W-1)/W * 2n`` (2x smaller than fp32)
``cast``    ``bf16_hook`` / BF16State      all-reduce bf16, or all-gather of bf16 bytes  ``2 (W-1)/W * 2n``, or ``(W-1) * 2n``
``powersgd``  ``powersgd_hook`` / ...      all-reduce P and Q (+ uncompressed tensors)   ``2 (W-1)/W * 4 (sum (rows+cols) r)``
``onebit``  ``onebit_hook`` / OneBitState  all-gather packed signs + fp32 scale          ``(W-1) * (n/8 + 4)``
==========  =============================  ============================================  ============================================

The math of each codec is in :mod:`rllib_ext.ops.codecs`; the hooks only move bytes through the
shared preamble and recorder of ``_hook`` (statistics and observers: :mod:`.stats`; state base,
checkpoint format: :mod:`.state`).

Non-finite gradients (a loss-scaled fp16 overflow) are propagated, never clipped or
``nan_to_num``'d, so every rank's ``GradScaler`` sees the overflow and skips the same step:
fp16 casts before dividing (a value above the fp16 range becomes ``inf``); 1-bit's scale becomes
inf/NaN so the decoded bucket is non-finite on every rank; PowerSGD's P/Q turn NaN. The stateful
hooks then restart their error-feedback memory (and PowerSGD its Q) from zero for that bucket:
otherwise ``inf - inf`` would keep the memory NaN for the rest of training.
"""

from __future__ import annotations

from rllib_ext.distributed.cast import BF16State, FP16State, bf16_hook, fp16_hook
from rllib_ext.distributed.onebit import OneBitState, onebit_hook
from rllib_ext.distributed.powersgd import PowerSGDHookState, powersgd_hook
from rllib_ext.distributed.state import CommHookState, gather_state, merge_states
from rllib_ext.distributed.stats import BucketRecord

__all__ = [
    "BF16State",
    "BucketRecord",
    "CommHookState",
    "FP16State",
    "OneBitState",
    "PowerSGDHookState",
    "bf16_hook",
    "fp16_hook",
    "gather_state",
    "merge_states",
    "onebit_hook",
    "powersgd_hook",
]
