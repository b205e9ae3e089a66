"""One rule for adding an RLlib callback class to a config next to the user's callbacks.

:func:`add_callback` is how every feature of rllib_ext that needs a callback (SMAC metrics, the
env guard, profiling, the CLI's ``--callbacks``) installs it: idempotent, the user's callbacks
kept, RLlib's do-nothing default dropped.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.callbacks import RLlibCallback

__all__ = ["add_callback"]


def add_callback(config: Any, callback: type, *, replaces: type | None = None) -> None:
    """Adds ``callback`` to ``config.callbacks_class`` unless it (or a subclass) is there.

    Keeps the user's callbacks; RLlib's do-nothing default ``RLlibCallback`` is replaced, and
    so is any subclass of ``replaces`` (an earlier configuration of the same callback).
    """
    existing = config.callbacks_class
    classes = list(existing) if isinstance(existing, (list, tuple)) else [existing]
    if replaces is not None:
        classes = [c for c in classes if not (isinstance(c, type) and issubclass(c, replaces))]
    if any(isinstance(c, type) and issubclass(c, callback) for c in classes):
        return
    classes = [c for c in classes if c not in (None, RLlibCallback)] + [callback]
    # RLlib's own setter, not rllib_ext.PPOConfig's (which would fill in its defaults again).
    AlgorithmConfig.callbacks(config, classes if len(classes) > 1 else classes[0])
