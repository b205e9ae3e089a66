"""The option table of ``rllib-ext train``: one :class:`Option` row per setting.

A row names the key (the YAML key and, with dashes, the command-line flag), how to convert and
check a value, the default and the example used in the error message. Adding an rllib_ext
extension flag (``--amp``, ``--grad-compression``...) means adding one row to
:data:`EXTENSION_OPTIONS`; its value is passed to ``rllib_ext.PPOConfig.training(key=value)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rllib_ext.settings import BATCHING_IMPLS, GAE_IMPLS, STANDARDIZE_MODES

__all__ = ["ALL_OPTIONS", "CORE_OPTIONS", "DEFAULT_TRAINING", "EXTENSION_OPTIONS", "Option"]

# --------------------------------------------------------------------------------------------
# Value converters. Each takes a command-line string or a YAML value and returns the typed
# value or raises ValueError(reason); the caller adds where the value came from and the fix.


def _reject_bool(value: Any) -> None:
    # YAML `yes`/`true` load as bool, and bool is an int subclass: never a count.
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")


def _int_at_least(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        _reject_bool(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            number = int(value) if not isinstance(value, float) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(number, float) or number < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return number

    return convert


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return convert(value)

    return optional


def _float_value(*, positive: bool = False, minimum: float | None = None) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        _reject_bool(value)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("must be a number") from None
        if not math.isfinite(number):
            raise ValueError("must be a finite number")
        if positive and number <= 0:
            raise ValueError("must be > 0")
        if minimum is not None and number < minimum:
            raise ValueError(f"must be >= {minimum:g}")
        return number

    return convert


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def _json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a JSON object ({{...}}), got {type(value).__name__}")
    return dict(value)


def _named_choice(names: Mapping[str, Any]) -> Callable[[Any], Any]:
    """Like :func:`_choice`, for settings whose off value is not a string (``off`` -> False)."""

    def convert(value: Any) -> Any:
        if value in names.values() and not isinstance(value, str) or value is None:
            return value
        if value not in names:
            raise ValueError(f"is not supported; allowed values: {', '.join(names)}")
        return names[value]

    return convert


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"is not supported; allowed values: {', '.join(allowed)}")
        return value

    return convert


# --------------------------------------------------------------------------------------------
# The option table.


@dataclass(frozen=True)
class Option:
    """One setting of ``rllib-ext train``: a YAML key and a ``--flag``."""

    key: str
    """YAML key and :class:`TrainSettings` field; the flag is ``--`` + key with dashes."""
    convert: Callable[[Any], Any]
    """Turns a command-line string or YAML value into the setting; raises ``ValueError``."""
    default: Any
    help: str
    example: str
    """A good value, shown in the error message's fix (``--num-learners 0``)."""
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


CORE_OPTIONS: tuple[Option, ...] = (
    Option(
        "env",
        convert=_text,
        default="CartPole-v1",
        help="gymnasium id, 'module:EnvId-v0', a Ray-registered env name or a "
        "'pkg.module.Class' path",
        example="CartPole-v1",
        metavar="ENV",
    ),
    Option(
        "env_config",
        convert=_json_object,
        default={},
        help="env keyword arguments as a JSON object",
        example="'{\"max_episode_steps\": 200}'",
        metavar="JSON",
    ),
    Option(
        "stop_reward",
        convert=_optional(_float_value()),
        default=450.0,
        help="stop once env_runners/episode_return_mean reaches this ('none': never)",
        example="450",
        metavar="R",
    ),
    Option(
        "stop_timesteps",
        convert=_optional(_int_at_least(1)),
        default=None,
        help="stop after this many sampled env steps (lifetime, also across --resume)",
        example="100000",
        metavar="N",
    ),
    Option(
        "time_budget",
        convert=_optional(_float_value(positive=True)),
        default=None,
        help="stop after this many seconds of training (checked after each iteration)",
        example="600",
        metavar="SECONDS",
    ),
    Option(
        "num_env_runners",
        convert=_int_at_least(0),
        default=0,
        help="remote EnvRunner actors (0: sample in the driver process, best on 2 cores)",
        example="0",
        metavar="N",
    ),
    Option(
        "num_envs_per_env_runner",
        convert=_int_at_least(1),
        default=8,
        help="vectorized env copies per EnvRunner (cheap envs sample much faster batched)",
        example="8",
        metavar="N",
    ),
    Option(
        "num_learners",
        convert=_int_at_least(0),
        default=0,
        help="remote Learner actors (0: one learner in the driver process)",
        example="0",
        metavar="N",
    ),
    Option(
        "num_gpus_per_learner",
        convert=_float_value(minimum=0.0),
        default=0.0,
        help="GPUs per learner (with --num-learners 0: 1 means the driver's learner uses a GPU)",
        example="0",
        metavar="G",
    ),
    Option(
        "training",
        convert=_json_object,
        default={},
        help="extra PPOConfig.training() arguments as a JSON object, e.g. '{\"lr\": 1e-4}'; they "
        "override the CartPole-tuned defaults",
        example="'{\"lr\": 0.0003}'",
        metavar="JSON",
    ),
    Option(
        "checkpoint_dir",
        convert=_optional(_text),
        default=None,
        help="where checkpoints go (default: RUN_DIR/checkpoints)",
        example="checkpoints",
        metavar="DIR",
    ),
    Option(
        "checkpoint_freq",
        convert=_int_at_least(0),
        default=10,
        help="checkpoint every N iterations (0: only at the end); always once at the end",
        example="10",
        metavar="N",
    ),
    Option(
        "resume",
        convert=_optional(_text),
        default=None,
        help="restore this checkpoint (or run directory) and continue training",
        example="PATH",
        metavar="PATH",
    ),
    Option(
        "address",
        convert=_optional(_text),
        default=None,
        help="join this Ray cluster (ray.init(address=...)) instead of starting a local Ray",
        example="auto",
        metavar="ADDRESS",
    ),
    Option(
        "seed",
        convert=_optional(_int_at_least(0)),
        default=None,
        help="random seed (default: drawn at start and recorded in summary.json)",
        example="0",
        metavar="N",
    ),
    Option(
        "run_dir",
        convert=_optional(_text),
        default=None,
        help="output directory (default: ./rllib_ext_runs/ENV_YYYYmmdd-HHMMSS)",
        example="runs/cartpole",
        metavar="DIR",
    ),
)

EXTENSION_OPTIONS: tuple[Option, ...] = (
    Option(
        "gae",
        convert=_choice(GAE_IMPLS),
        default="vectorized",
        help="advantage estimation: rllib_ext's loop-free kernel or RLlib's own connector",
        example="vectorized",
    ),
    Option(
        "batching",
        convert=_choice(BATCHING_IMPLS),
        default="vectorized",
        help="episodes -> train batch: rllib_ext's fused pass or RLlib's own connector pieces",
        example="vectorized",
    ),
    Option(
        "standardize_advantages",
        convert=_choice(STANDARDIZE_MODES),
        default="all",
        help="advantage standardization over 'all' rows (RLlib), only 'masked' rows, or 'none'",
        example="all",
    ),
    Option(
        "amp",
        convert=_named_choice({"off": False, "fp16": "fp16", "bf16": "bf16", "auto": "auto"}),
        default=False,
        help="mixed precision for the learner update: fp16 (loss scaling), bf16, auto or off",
        example="auto",
    ),
    Option(
        "grad_compression",
        convert=_named_choice(
            {
                "none": None,
                "fp16": "fp16",
                "bf16": "bf16",
                "powersgd": "powersgd",
                "onebit": "onebit",
            }
        ),
        default=None,
        help="compress gradients exchanged between learners (needs --num-learners >= 2)",
        example="powersgd",
    ),
    Option(
        "powersgd_rank",
        convert=_int_at_least(1),
        default=4,
        help="PowerSGD approximation rank (with --grad-compression powersgd)",
        example="4",
        metavar="N",
    ),
)
"""rllib_ext flags: each becomes ``PPOConfig.training(<key>=<value>)``. Add new flags here."""

ALL_OPTIONS: tuple[Option, ...] = CORE_OPTIONS + EXTENSION_OPTIONS

DEFAULT_TRAINING: dict[str, Any] = {
    "lr": 3e-4,
    "train_batch_size": 2000,
    "minibatch_size": 250,
    "num_epochs": 10,
}
"""PPO hyper-parameters of ``rllib-ext train`` (``--training`` overrides single keys; the rest
are RLlib's PPO defaults).

Chosen for CartPole-v1 on 2 CPU cores, where the learner dominates an iteration: its cost is
``num_epochs * train_batch_size / minibatch_size`` SGD steps, 940 with RLlib's defaults
(4000 / 128 * 30, lr 5e-5) against 80 here. With 8 vectorized envs in the driver this reached
450 in 13-25 s of training over seeds 0-5 (12-24 iterations of about 1 s), against about
155 s (11 iterations of 14 s) for RLlib's defaults on the same machine. lr 3e-4 is also the
2023 tutorial's value; lambda_=0.95 and 4000-step batches were slower here.
"""
