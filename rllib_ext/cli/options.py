"""The option table of ``rllib-ext train``: one :class:`Option` row per setting.

A row names the key (the YAML key and, with dashes, the command-line flag), how to convert and
check a value, the default and the example used in the error message, and the ``--help`` group.

:data:`CORE_OPTIONS` are written here by hand. :data:`EXTENSION_OPTIONS` are generated from the
fields of :class:`rllib_ext.settings.ExtensionSettings` (type, choices, default, range, help from
the field's docstring), so every extension key has a flag and a new setting needs no edit here;
their values are passed to ``rllib_ext.PPOConfig.training(key=value)``.

No Ray or torch import: ``rllib-ext --help`` builds its parser from this table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rllib_ext._validation import Bounds, SettingSpec, is_allowed
from rllib_ext.settings import setting_specs

__all__ = [
    "ALL_OPTIONS",
    "CORE_OPTIONS",
    "DEFAULT_TRAINING",
    "EXTENSION_OPTIONS",
    "GROUPS",
    "Option",
    "display",
    "parse_set_value",
]

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


def _fraction(value: Any) -> float:
    number = _float_value()(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("must be a fraction between 0 and 1")
    return number


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


def display(value: Any) -> str:
    """How a setting value is spelled on the command line (``False`` -> ``off``, ``None`` ->
    ``none``, booleans ``true``/``false``)."""
    if value is None:
        return "none"
    if value is False:
        return "false"
    if value is True:
        return "true"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _choice_names(spec: SettingSpec) -> dict[str, Any]:
    # `amp`'s off value is False: spelled "off" there, like "none" for grad_compression.
    return {("off" if c is False else display(c)): c for c in spec.choices}


def _choice(spec: SettingSpec) -> Callable[[Any], Any]:
    names = _choice_names(spec)

    def convert(value: Any) -> Any:
        if isinstance(value, str) and value in names:
            return names[value]
        if not isinstance(value, str) and is_allowed(value, spec.choices):
            return value
        raise ValueError(f"is not supported; allowed values: {', '.join(names)}")

    return convert


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ValueError("must be true or false")


def _number(bounds: Bounds) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        _reject_bool(value)
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value) if bounds.integer else float(value)
            except ValueError:
                number = math.nan
        elif bounds.integer and isinstance(value, float) and value.is_integer():
            number = int(value)
        if not bounds.contains(number):
            raise ValueError(f"must be {bounds.describe()}")
        return number

    return convert


def parse_set_value(text: str) -> Any:
    """The value of ``--set key=VALUE``: JSON (numbers, true/false/null, lists, objects) or
    else the text itself (``--set amp=bf16``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
    group: str = "run"
    """The ``--help`` section, a key of :data:`GROUPS`."""
    default_text: str | None = None
    """The default as ``--help`` shows it, when ``display(default)`` would not say it."""
    train_only: bool = False
    """Only ``rllib-ext train`` takes it (stop criteria, checkpoints, run directory)."""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def help_text(self) -> str:
        """The help line with exactly one default."""
        return f"{self.help} (default: {self.default_text or display(self.default)})"


GROUPS: dict[str, str] = {
    "run": "run: stop criteria, checkpoints, output",
    "env": "environment",
    "resources": "resources: Ray, env runners, learners",
    "ppo": "PPO hyper-parameters (any PPOConfig.training() key)",
    "rllib_ext": "rllib_ext components (PPOConfig.training() flags of rllib_ext)",
}
"""``--help`` sections, in order."""


CORE_OPTIONS: tuple[Option, ...] = (
    Option(
        "env",
        convert=_text,
        default="CartPole-v1",
        help="gymnasium id, 'module:EnvId-v0', a Ray-registered env name or a "
        "'pkg.module.Class' path",
        example="CartPole-v1",
        metavar="ENV",
        group="env",
    ),
    Option(
        "env_config",
        convert=_json_object,
        default={},
        help="env keyword arguments as a JSON object",
        example="'{\"max_episode_steps\": 200}'",
        metavar="JSON",
        group="env",
    ),
    Option(
        "stop_reward",
        convert=_optional(_float_value()),
        default=450.0,
        help="stop once env_runners/episode_return_mean reaches this ('none': never)",
        example="450",
        metavar="R",
        train_only=True,
        default_text="450, CartPole's; none for SMAC envs",
    ),
    Option(
        "stop_win_rate",
        convert=_optional(_fraction),
        default=None,
        help="SMAC envs: stop once env_runners/win_rate (battles won by the training policy "
        "over RLlib's smoothing window of episodes) reaches this fraction",
        example="0.9",
        metavar="W",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "stop_timesteps",
        convert=_optional(_int_at_least(1)),
        default=None,
        help="stop after this many sampled env steps (lifetime, also across --resume)",
        example="100000",
        metavar="N",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "time_budget",
        convert=_optional(_float_value(positive=True)),
        default=None,
        help="stop after this many seconds of training (checked after each iteration)",
        example="600",
        metavar="SECONDS",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "num_env_runners",
        convert=_int_at_least(0),
        default=0,
        help="remote EnvRunner actors (0: sample in the driver process, best on 2 cores)",
        example="0",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_envs_per_env_runner",
        convert=_int_at_least(1),
        default=8,
        help="vectorized env copies per EnvRunner (cheap envs sample much faster batched)",
        example="8",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_learners",
        convert=_int_at_least(0),
        default=0,
        help="remote Learner actors (0: one learner in the driver process)",
        example="0",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_gpus_per_learner",
        convert=_float_value(minimum=0.0),
        default=0.0,
        help="GPUs per learner (with --num-learners 0: 1 means the driver's learner uses a GPU)",
        example="0",
        metavar="G",
        group="resources",
    ),
    Option(
        "training",
        convert=_json_object,
        default={},
        help="PPOConfig.training() arguments as a JSON object, e.g. '{\"lr\": 1e-4}', over the "
        "CartPole-tuned defaults (lr 3e-4, train_batch_size 2000, minibatch_size 250, num_epochs "
        "10) or a preset's; rllib_ext keys are allowed here too",
        example="'{\"lr\": 0.0003}'",
        metavar="JSON",
        group="ppo",
    ),
    Option(
        "model_config",
        convert=_json_object,
        default={},
        help="RLModule model_config as a JSON object (merged over a preset's), e.g. "
        '\'{"fcnet_hiddens": [256, 256]}\'; SMAC envs also take "central_critic": true',
        example="'{\"fcnet_hiddens\": [256, 256]}'",
        metavar="JSON",
        group="ppo",
        default_text="RLlib's; the SMAC preset's for SMAC envs",
    ),
    Option(
        "checkpoint_dir",
        convert=_optional(_text),
        default=None,
        help="where checkpoints go",
        example="checkpoints",
        metavar="DIR",
        train_only=True,
        default_text="RUN_DIR/checkpoints",
    ),
    Option(
        "checkpoint_freq",
        convert=_int_at_least(0),
        default=10,
        help="checkpoint every N iterations (0: only at the end); always once at the end",
        example="10",
        metavar="N",
        train_only=True,
    ),
    Option(
        "resume",
        convert=_optional(_text),
        default=None,
        help="restore this checkpoint (or run directory) and continue training",
        example="PATH",
        metavar="PATH",
        train_only=True,
        default_text="start fresh",
    ),
    Option(
        "address",
        convert=_optional(_text),
        default=None,
        help="join this Ray cluster (ray.init(address=...)) instead of starting a local Ray",
        example="auto",
        metavar="ADDRESS",
        group="resources",
        default_text="start a local Ray",
    ),
    Option(
        "seed",
        convert=_optional(_int_at_least(0)),
        default=None,
        help="random seed, recorded in summary.json",
        example="0",
        metavar="N",
        group="env",
        default_text="drawn at start",
    ),
    Option(
        "run_dir",
        convert=_optional(_text),
        default=None,
        help="output directory",
        example="runs/cartpole",
        metavar="DIR",
        train_only=True,
        default_text="./rllib_ext_runs/ENV_YYYYmmdd-HHMMSS",
    ),
    # Fault handling (rllib_ext.envs.guard, rllib_ext.learners.health).
    Option(
        "restart_failed_env_runners",
        convert=_bool,
        default=True,
        help="a crashing env costs only its episode: the env copy is re-created (and a dead "
        "env runner restarted); false: an env error fails the run",
        example="false",
        metavar="BOOL",
        group="resources",
    ),
    Option(
        "non_finite",
        convert=lambda value: _one_of(value, ("warn", "drop")),
        default="warn",
        help="nan/inf env rewards or observations: 'warn' (one line per episode) or 'drop' "
        "(warn and drop the episode)",
        example="drop",
        metavar="{warn,drop}",
        group="env",
    ),
    Option(
        "learner_timeout",
        convert=_float_value(positive=True),
        default=600.0,
        help="fail the run when a learner shows no sign of life for this many seconds",
        example="600",
        metavar="SECONDS",
        group="resources",
        train_only=True,
    ),
)


def _one_of(value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"is not supported; allowed values: {', '.join(allowed)}")
    return str(value)


def _extension_option(spec: SettingSpec) -> Option:
    if spec.kind == "choice":
        names = _choice_names(spec)
        convert, metavar = _choice(spec), "{" + ",".join(names) + "}"
        default_text = next(n for n, c in names.items() if is_allowed(c, (spec.default,)))
        example = next(n for n, c in names.items() if is_allowed(c, (spec.example,)))
    elif spec.kind == "bool":
        convert, metavar, default_text = _bool, "{true,false}", display(spec.default)
        example = display(spec.example)
    else:
        bounds = spec.bounds or Bounds(integer=spec.kind == "int")
        convert, metavar = _number(bounds), "N" if bounds.integer else "X"
        default_text, example = display(spec.default), display(spec.example)
    return Option(
        spec.name,
        convert=convert,
        default=spec.default,
        help=spec.summary.rstrip("."),
        example=example,
        metavar=metavar,
        group="rllib_ext",
        default_text=default_text,
    )


EXTENSION_OPTIONS: tuple[Option, ...] = tuple(_extension_option(s) for s in setting_specs())
"""One option per ``ExtensionSettings`` field; each becomes ``PPOConfig.training(<key>=...)``."""

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
