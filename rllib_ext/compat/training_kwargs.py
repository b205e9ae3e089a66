"""The 2023 tutorial's (and pre-2.10 RLlib's) ``.training()`` keywords, mapped onto today's.

:func:`split_extension_kwargs` is the one entry: ``rllib_ext.compat.PPOConfig.training()`` and the
command line's ``--training`` pass every keyword through it. Each old name maps to exactly one
current setting (:data:`TRAINING_ALIASES`); the tutorial's ``communication`` block becomes
``grad_compression``, ``communication_type`` and ``grad_clip``. No Ray or torch import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rllib_ext._validation import check_bool, check_choice, check_known_keys
from rllib_ext.settings import COMMUNICATION_TYPES, REMOVED_KEYS, extension_keys

__all__ = ["TRAINING_ALIASES", "check_communication_type", "split_extension_kwargs"]


def check_communication_type(value: Any) -> str:
    """The tutorial's ``communication.type`` (``"NCCL"``...), lower-cased.

    Raises:
        ValueError: for a value not in :data:`COMMUNICATION_TYPES` (any case).
    """
    lowered = value.lower() if isinstance(value, str) else value
    check_choice(
        "communication type",
        lowered,
        COMMUNICATION_TYPES,
        example='communication={"type": "nccl"}, or leave the type out (RLlib picks)',
    )
    return str(lowered)


def _communication_alias(block: Any) -> dict[str, Any]:
    """The tutorial's ``communication={"type": ..., "compression": ..., "grad_clip": ...}``."""
    if not isinstance(block, Mapping):
        raise ValueError(
            f"communication={block!r} must be a dict like "
            '{"type": "NCCL", "compression": True, "grad_clip": 0.5}.'
        )
    check_known_keys(
        sorted(block),
        ("type", "compression", "grad_clip"),
        what="communication key(s)",
        fix="use grad_compression=..., communication_type=..., grad_clip=... directly.",
    )
    out: dict[str, Any] = {}
    if "type" in block:
        out["communication_type"] = check_communication_type(block["type"])
    if "compression" in block:
        comp = block["compression"]
        # `compression: True` in the tutorial meant fp16 on the wire.
        out["grad_compression"] = "fp16" if comp is True else (None if comp is False else comp)
    if "grad_clip" in block:
        out["grad_clip"] = block["grad_clip"]
    return out


def _fp16_alias(value: Any) -> Any:
    check_bool("fp16", value, example=".training(amp='fp16') (fp16=True is its old name)")
    return "fp16" if value else False


# Old spellings accepted by `rllib_ext.compat.PPOConfig.training()` and `--training`.
# Each maps to exactly one current setting (the function converts the value).
TRAINING_ALIASES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "num_sgd_iter": ("num_epochs", lambda v: v),
    "sgd_minibatch_size": ("minibatch_size", lambda v: v),
    "fp16": ("amp", _fp16_alias),
    "fp16_loss_scaling": ("amp_init_scale", lambda v: v),
}


def split_extension_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Splits ``.training(**kwargs)`` into (extension flags, other kwargs), resolving aliases.

    The tutorial's ``communication`` block becomes ``grad_compression`` (a flag), ``grad_clip``
    and ``communication_type`` (``rllib_ext.compat.PPOConfig.training`` keywords).

    Raises:
        ValueError: an alias given together with its new name, a bad alias value, or a key of
            :data:`REMOVED_KEYS` (explicit code is told; stored settings are tolerated).
    """
    known = set(extension_keys())
    ext: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in REMOVED_KEYS:
            raise ValueError(
                f"{key}={value!r} is no longer a setting: {REMOVED_KEYS[key]}. Fix: drop it; the "
                'tutorial\'s communication={"type": ...} is still accepted and checked against '
                "the learners' resources."
            )
        if key == "communication":
            for new, converted in _communication_alias(value).items():
                if new in kwargs:
                    raise ValueError(
                        f"communication sets {new!r}, which was also given directly. "
                        f"Fix: pass {new}=... only once."
                    )
                (ext if new in known else rest)[new] = converted
            continue
        if key in TRAINING_ALIASES:
            new, convert = TRAINING_ALIASES[key]
            if new in kwargs:
                raise ValueError(
                    f"Both {key!r} and {new!r} were given; {key!r} is the old name of {new!r}. "
                    f"Fix: pass only {new}=..."
                )
            key, value = new, convert(value)
        (ext if key in known else rest)[key] = value
    return ext, rest
