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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rllib_ext._validation import Bounds, SettingSpec, is_allowed
from rllib_ext.cli.values import (
    as_bool,
    choice,
    choice_names,
    class_paths,
    display,
    float_value,
    fraction,
    int_at_least,
    json_object,
    number,
    one_of,
    optional,
    parse_set_value,
    resource_map,
    text,
)
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
    "logging": "logging: experiment trackers and your RLlib callbacks",
}
"""``--help`` sections, in order."""


CORE_OPTIONS: tuple[Option, ...] = (
    Option(
        "env",
        convert=text,
        default="CartPole-v1",
        help="gymnasium id, 'module:EnvId-v0', a Ray-registered env name or a "
        "'pkg.module.Class' path",
        example="CartPole-v1",
        metavar="ENV",
        group="env",
    ),
    Option(
        "env_config",
        convert=json_object,
        default={},
        help="env keyword arguments as a JSON object",
        example="'{\"max_episode_steps\": 200}'",
        metavar="JSON",
        group="env",
    ),
    Option(
        "stop_reward",
        convert=optional(float_value()),
        default=450.0,
        help="stop once env_runners/episode_return_mean reaches this ('none': never)",
        example="450",
        metavar="R",
        train_only=True,
        default_text="450, CartPole's; none for SMAC envs",
    ),
    Option(
        "stop_win_rate",
        convert=optional(fraction),
        default=None,
        help="SMAC envs: stop once env_runners/rllib_ext/win_rate (battles won by the training policy "
        "over RLlib's smoothing window of episodes) reaches this fraction",
        example="0.9",
        metavar="W",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "stop_timesteps",
        convert=optional(int_at_least(1)),
        default=None,
        help="stop after this many sampled env steps (lifetime, also across --resume)",
        example="100000",
        metavar="N",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "time_budget",
        convert=optional(float_value(positive=True)),
        default=None,
        help="stop after this many seconds of training (checked after each iteration)",
        example="600",
        metavar="SECONDS",
        train_only=True,
        default_text="no limit",
    ),
    Option(
        "num_env_runners",
        convert=int_at_least(0),
        default=0,
        help="remote EnvRunner actors (0: sample in the driver process, best on 2 cores)",
        example="0",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_envs_per_env_runner",
        convert=int_at_least(1),
        default=8,
        help="vectorized env copies per EnvRunner (cheap envs sample much faster batched)",
        example="8",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_learners",
        convert=int_at_least(0),
        default=0,
        help="remote Learner actors (0: one learner in the driver process)",
        example="0",
        metavar="N",
        group="resources",
    ),
    Option(
        "num_gpus_per_learner",
        convert=float_value(minimum=0.0),
        default=0.0,
        help="GPUs per learner (with --num-learners 0: 1 means the driver's learner uses a GPU)",
        example="0",
        metavar="G",
        group="resources",
    ),
    Option(
        "custom_resources_per_learner",
        convert=resource_map,
        default={},
        help="custom Ray resources per remote learner as a JSON object, e.g. "
        "'{\"learner_node\": 1}': learners go only to nodes started with "
        "'ray start --resources' naming them (a local Ray, no --address, provides them)",
        example="'{\"learner_node\": 1}'",
        metavar="JSON",
        group="resources",
        default_text="none",
    ),
    Option(
        "custom_resources_per_env_runner",
        convert=resource_map,
        default={},
        help="custom Ray resources each remote env runner needs, as a JSON object (see "
        "--custom-resources-per-learner)",
        example="'{\"sampler_node\": 1}'",
        metavar="JSON",
        group="resources",
        default_text="none",
    ),
    Option(
        "training",
        convert=json_object,
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
        convert=json_object,
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
        convert=optional(text),
        default=None,
        help="where checkpoints go",
        example="checkpoints",
        metavar="DIR",
        train_only=True,
        default_text="RUN_DIR/checkpoints",
    ),
    Option(
        "checkpoint_freq",
        convert=int_at_least(0),
        default=10,
        help="checkpoint every N iterations (0: only at the end); always once at the end",
        example="10",
        metavar="N",
        train_only=True,
    ),
    Option(
        "resume",
        convert=optional(text),
        default=None,
        help="restore this checkpoint (or run directory) and continue training",
        example="PATH",
        metavar="PATH",
        train_only=True,
        default_text="start fresh",
    ),
    Option(
        "address",
        convert=optional(text),
        default=None,
        help="join this Ray cluster (ray.init(address=...)) instead of starting a local Ray",
        example="auto",
        metavar="ADDRESS",
        group="resources",
        default_text="start a local Ray",
    ),
    Option(
        "seed",
        convert=optional(int_at_least(0)),
        default=None,
        help="random seed, recorded in summary.json",
        example="0",
        metavar="N",
        group="env",
        default_text="drawn at start",
    ),
    Option(
        "run_dir",
        convert=optional(text),
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
        convert=as_bool,
        default=True,
        help="a crashing env costs only its episode: the env copy is re-created (and a dead "
        "env runner restarted); false: an env error fails the run",
        example="false",
        metavar="BOOL",
        group="resources",
    ),
    Option(
        "non_finite",
        convert=lambda value: one_of(value, ("warn", "drop")),
        default="warn",
        help="nan/inf env rewards or observations: 'warn' (one line per episode) or 'drop' "
        "(warn and drop the episode)",
        example="drop",
        metavar="{warn,drop}",
        group="env",
    ),
    # Trackers and callbacks (rllib_ext.cli.tracking).
    Option(
        "wandb_project",
        convert=optional(text),
        default=None,
        help="also log each iteration to this Weights & Biases project with Tune's "
        "WandbLoggerCallback (needs 'pip install wandb' and 'wandb login' or WANDB_API_KEY)",
        example="my-project",
        metavar="NAME",
        group="logging",
        train_only=True,
        default_text="off",
    ),
    Option(
        "mlflow_tracking_uri",
        convert=optional(text),
        default=None,
        help="also log each iteration to MLflow (experiment 'rllib-ext') with Tune's "
        "MLflowLoggerCallback, e.g. http://host:5000 or sqlite:///mlflow.db (needs 'pip "
        "install mlflow')",
        example="http://localhost:5000",
        metavar="URI",
        group="logging",
        train_only=True,
        default_text="off",
    ),
    Option(
        "callbacks",
        convert=class_paths,
        default=[],
        help="your RLlibCallback subclasses as 'pkg.module:Class' (comma-separated for "
        "several; a list in YAML), added to rllib_ext's own callbacks",
        example="mypkg.callbacks:MyCallbacks",
        metavar="MODULE:CLASS",
        group="logging",
        train_only=True,
        default_text="none",
    ),
    Option(
        "learner_timeout",
        convert=float_value(positive=True),
        default=600.0,
        help="fail the run when a learner shows no sign of life for this many seconds",
        example="600",
        metavar="SECONDS",
        group="resources",
        train_only=True,
    ),
)


def _extension_option(spec: SettingSpec) -> Option:
    if spec.kind == "choice":
        names = choice_names(spec)
        convert, metavar = choice(spec), "{" + ",".join(names) + "}"
        default_text = next(n for n, c in names.items() if is_allowed(c, (spec.default,)))
        example = next(n for n, c in names.items() if is_allowed(c, (spec.example,)))
    elif spec.kind == "bool":
        convert, metavar, default_text = as_bool, "{true,false}", display(spec.default)
        example = display(spec.example)
    else:
        bounds = spec.bounds or Bounds(integer=spec.kind == "int")
        convert, metavar = number(bounds), "N" if bounds.integer else "X"
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

Chosen for CartPole-v1 on a 2-core laptop, where the learner dominates an iteration: its cost
is ``num_epochs * train_batch_size / minibatch_size`` SGD steps, 80 here against 940 with
RLlib's defaults (4000 / 128 * 30, lr 5e-5); lr 3e-4 is also the 2023 tutorial's value
(timings: benchmarks/README.md, "CartPole").
"""
