"""Distributed-training pieces: DDP communication hooks for compressed gradient exchange.

See :mod:`rllib_ext.distributed.comm_hooks`. Importing this package does not import Ray.
"""

from __future__ import annotations

from rllib_ext.distributed._base import CommHookState, gather_state, merge_states
from rllib_ext.distributed.comm_hooks import (
    HOOKS,
    STATE_CLASSES,
    BF16State,
    FP16State,
    OneBitState,
    PowerSGDHookState,
    bf16_hook,
    fp16_hook,
    make_comm_hook,
    onebit_hook,
    powersgd_hook,
)

__all__ = [
    "HOOKS",
    "STATE_CLASSES",
    "BF16State",
    "CommHookState",
    "FP16State",
    "OneBitState",
    "PowerSGDHookState",
    "bf16_hook",
    "fp16_hook",
    "gather_state",
    "make_comm_hook",
    "merge_states",
    "onebit_hook",
    "powersgd_hook",
]
