"""Settings of ``rllib-ext train``: the layers merged, over the option table of
:mod:`rllib_ext.cli.options` (values converted by :mod:`rllib_ext.cli.conversion`).

Precedence, lowest first:

1. defaults (the option table, :data:`DEFAULT_TRAINING`);
2. the settings saved with the ``--resume`` checkpoint;
3. ``--preset NAME`` (:mod:`rllib_ext.cli.presets`; SMAC envs without one get the preset
   :func:`~rllib_ext.cli.presets.choose_preset` picks for their backend and map, between 1.
   and 2.);
4. ``--config FILE.yaml``: its ``training:`` mapping, then its top-level keys;
5. ``--training JSON``, then ``--set key=value`` (repeatable, later wins);
6. flags given on the command line (``--amp bf16``).

``training`` and ``model_config`` merge key by key across the layers.

rllib_ext keys (``amp``, ``gae``...) may appear in every layer, also inside ``training``; they
are converted and checked like their flags and follow the same order, so an explicit flag beats
``--set``/``--training``/YAML, which beat the defaults. Old names (``fp16``, ``num_sgd_iter``)
are resolved as in ``rllib_ext.compat.PPOConfig.training()``.

Everything here runs before ``ray.init``, so bad input fails with one line and no Ray traceback.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllib_ext.cli.checkpoints import SETTINGS_FILE, find_checkpoint
from rllib_ext.cli.conversion import BY_KEY, convert_option, load_yaml
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.options import (
    ALL_OPTIONS,
    CORE_OPTIONS,
    DEFAULT_TRAINING,
    EXTENSION_OPTIONS,
    Option,
    parse_set_value,
)
from rllib_ext.cli.presets import EXPLICIT_REASON, choose_preset, load_preset
from rllib_ext.compat.training_kwargs import split_extension_kwargs
from rllib_ext.envs import is_smac_env

__all__ = [
    "ALL_OPTIONS",
    "CORE_OPTIONS",
    "DEFAULT_TRAINING",
    "EXTENSION_OPTIONS",
    "Option",
    "TrainSettings",
    "resolve_checkpoint",
    "resolve_settings",
    "saved_settings",
]


@dataclass
class TrainSettings:
    """The resolved settings of one ``rllib-ext train`` run (see :data:`ALL_OPTIONS`)."""

    env: str = "CartPole-v1"
    env_config: dict[str, Any] = field(default_factory=dict)
    stop_reward: float | None = 450.0
    stop_win_rate: float | None = None
    stop_timesteps: int | None = None
    time_budget: float | None = None
    num_env_runners: int = 0
    num_envs_per_env_runner: int = 8
    num_learners: int = 0
    num_gpus_per_learner: float = 0.0
    custom_resources_per_learner: dict[str, float] = field(default_factory=dict)
    custom_resources_per_env_runner: dict[str, float] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    """The ``--preset`` applied, or the one SMAC envs get without it (:mod:`~rllib_ext.cli.presets`)."""
    preset_reason: str | None = None
    """Why :attr:`preset` applies: ``"--preset"``, or the reason of
    :func:`~rllib_ext.cli.presets.choose_preset` (e.g. ``"SMAX backend, map 3m"``)."""
    checkpoint_dir: str | None = None
    checkpoint_freq: int = 10
    resume: str | None = None
    address: str | None = None
    seed: int | None = None
    run_dir: str | None = None
    restart_failed_env_runners: bool = True
    non_finite: str = "warn"
    learner_timeout: float = 600.0
    wandb_project: str | None = None
    mlflow_tracking_uri: str | None = None
    callbacks: list[str] = field(default_factory=list)
    """``pkg.module:Class`` paths of the user's RLlib callbacks (:mod:`~rllib_ext.cli.tracking`)."""
    extensions: dict[str, Any] = field(
        default_factory=lambda: {o.key: o.default for o in EXTENSION_OPTIONS}
    )
    """rllib_ext keys (:data:`EXTENSION_OPTIONS`), passed to ``PPOConfig.training()`` after
    :attr:`training`, which holds no rllib_ext key."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> TrainSettings:
        """Builds settings from flat option keys (defaults fill the rest)."""
        core = {o.key: values.get(o.key, _copy_default(o)) for o in CORE_OPTIONS}
        ext = {o.key: values.get(o.key, o.default) for o in EXTENSION_OPTIONS}
        return cls(**core, extensions=ext)


def _copy_default(option: Option) -> Any:
    if isinstance(option.default, (dict, list)):
        return type(option.default)(option.default)
    return option.default


def resolve_checkpoint(path: str | Path, *, flag: str) -> Path:
    """Finds the RLlib algorithm checkpoint that ``path`` names (absolute path).

    Accepts a checkpoint directory or a run directory (its newest *complete* checkpoint, see
    :func:`rllib_ext.cli.checkpoints.find_checkpoint`).

    Raises:
        CLIError: nothing usable at ``path``.
    """
    return find_checkpoint(path, flag=flag)


def _checkpoint_values(checkpoint: Path) -> dict[str, Any]:
    file = checkpoint / SETTINGS_FILE
    if not file.is_file():
        return {}
    saved = json.loads(file.read_text())
    values = {k: v for k, v in saved.items() if k in BY_KEY and k != "extensions"}
    values.update(saved.get("extensions", {}))
    # Where this run writes and what it resumes are never inherited.
    for key in ("resume", "run_dir", "checkpoint_dir", "address"):
        values.pop(key, None)
    return {k: v for k, v in values.items() if k in BY_KEY}


def saved_settings(checkpoint: Path) -> TrainSettings | None:
    """The settings ``rllib-ext train`` ran with when it wrote ``checkpoint`` (``None`` for a
    checkpoint without :data:`SETTINGS_FILE`, e.g. RLlib's own ``Algorithm.save_to_path``)."""
    if not (checkpoint / SETTINGS_FILE).is_file():
        return None
    return TrainSettings.from_values(_checkpoint_values(checkpoint))


def parse_set(pairs: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` pairs -> ``{key: value}`` (values as :func:`parse_set_value`).

    Raises:
        CLIError: a pair without ``=`` or with an empty key.
    """
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise CLIError(
                f"--set {pair!r} is not KEY=VALUE. Fix: e.g. --set lr=0.0001 --set amp=bf16."
            )
        values[key.strip()] = parse_set_value(text)
    return values


@dataclass
class _Layer:
    """One source of settings, split by where its values go."""

    core: dict[str, Any] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)


def _training_layer(training: Mapping[str, Any], source: str) -> _Layer:
    """Splits a ``training`` mapping into rllib_ext keys (converted) and PPO arguments."""
    try:
        ext, rest = split_extension_kwargs(training)
    except ValueError as exc:
        raise CLIError(f"{source}: {exc}") from None
    converted = {}
    for key, value in ext.items():
        option = BY_KEY[key]
        try:
            converted[key] = option.convert(value)
        except ValueError as exc:
            raise CLIError(
                f"{source}: {key}={value!r} {exc}. Fix: e.g. {option.flag} {option.example} "
                f"or --set {key}={option.example}"
            ) from None
    return _Layer(extensions=converted, training=rest)


def _layer(values: Mapping[str, Any], source: str) -> _Layer:
    """A source's converted option values; its top-level rllib_ext keys beat its ``training``."""
    layer = _training_layer(values.get("training", {}), f"{source} training")
    ext_keys = {o.key for o in EXTENSION_OPTIONS}
    for key, value in values.items():
        if key in ext_keys:
            layer.extensions[key] = value
        elif key != "training":
            layer.core[key] = value
    return layer


def resolve_settings(
    cli_values: Mapping[str, Any],
    *,
    config_file: str | None = None,
    set_values: Iterable[str] = (),
    preset: str | None = None,
) -> TrainSettings:
    """Merges defaults, the resumed checkpoint's settings, the preset, ``--config`` YAML,
    ``--training``, ``--set`` and flags (that order, see the module docstring).

    Args:
        cli_values: only the flags given on the command line, as raw strings, by option key.
        config_file: the ``--config`` path, if any.
        set_values: the ``--set KEY=VALUE`` pairs, in command-line order.
        preset: the ``--preset`` name, if any; without it a SMAC env gets the preset
            :func:`rllib_ext.cli.presets.choose_preset` picks from the env and ``env_config``
            that win among the other layers, just above the defaults. The result's
            ``preset_reason`` says why.

    Raises:
        CLIError: for any bad key or value, with the fix.
    """
    flags = {k: convert_option(BY_KEY[k], v, BY_KEY[k].flag) for k, v in cli_values.items()}
    from_yaml = load_yaml(config_file) if config_file else {}
    resume = flags.get("resume", from_yaml.get("resume"))
    inherited: dict[str, Any] = {}
    if resume:
        checkpoint = resolve_checkpoint(resume, flag="--resume")
        inherited = _checkpoint_values(checkpoint)
        inherited["resume"] = str(checkpoint)
    cli_training = flags.pop("training", {})
    user = [
        _layer(from_yaml, f"--config {config_file!r}"),
        _training_layer(cli_training, "--training"),
        _training_layer(parse_set(set_values), "--set"),
        _layer(flags, "the command line"),
    ]
    layers = [_layer(inherited, "the resumed checkpoint's settings"), *user]
    reason: str | None = None
    if preset:
        at, reason = 1, EXPLICIT_REASON
    else:
        # Chosen on what the run would be without a preset: the winning env and env_config.
        choice = choose_preset(
            _top(layers, "env", BY_KEY["env"].default), _top(layers, "env_config", {})
        )
        preset, reason, at = choice.name, choice.reason, 0
    preset_layer = None
    if preset is not None:
        preset_layer = _layer(load_preset(preset).values, f"preset {preset!r}")
        layers.insert(at, preset_layer)
    merged: dict[str, Any] = {}
    extensions: dict[str, Any] = {}
    training: dict[str, Any] = {}
    model_config: dict[str, Any] = {}
    for layer in layers:
        model_config.update(layer.core.pop("model_config", {}))
        merged.update(layer.core)
        extensions.update(layer.extensions)
        training.update(layer.training)
    if preset_layer is not None and "env_config" in preset_layer.core:
        above = _top(layers[layers.index(preset_layer) + 1 :], "env_config", {})
        preset_env = preset_layer.core.get("env", merged.get("env"))
        if _shares_env_config(merged.get("env"), preset_env):
            # The user's env_config updates the preset's key by key (the user's map wins).
            merged["env_config"] = {**preset_layer.core["env_config"], **above}
        else:  # another env: none of the preset's keys
            others = [lay for lay in layers if lay is not preset_layer]
            merged["env_config"] = dict(_top(others, "env_config", {}))
    if resume:
        merged["resume"] = inherited["resume"]
    values = {**merged, **extensions, "training": training, "model_config": model_config}
    settings = TrainSettings.from_values(values)
    return dataclasses.replace(settings, preset=preset, preset_reason=reason if preset else None)


def _top(layers: Iterable[_Layer], key: str, default: Any) -> Any:
    """The value of core ``key`` in the highest of ``layers`` that sets it, else ``default``."""
    return next((lay.core[key] for lay in reversed(list(layers)) if key in lay.core), default)


def _shares_env_config(env: Any, preset_env: Any) -> bool:
    """Whether a preset's ``env_config`` fits ``env``: the same env, or two SMAC envs (one
    ``env_config`` schema, :class:`rllib_ext.envs.smac.SMACEnvSettings`)."""
    if env == preset_env:
        return True
    return is_smac_env(env) and is_smac_env(preset_env)
