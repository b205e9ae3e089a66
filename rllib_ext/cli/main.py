"""The ``rllib-ext`` command: ``train``, ``evaluate``, ``profile``, ``presets`` and ``doctor``.

Bad input never reaches Ray: it ends as one ``rllib-ext: error: ...`` line on stderr that names
the value, the allowed values and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

from rllib_ext._validation import is_allowed
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.inputs import one_line_error
from rllib_ext.cli.options import ALL_OPTIONS, GROUPS
from rllib_ext.cli.presets import preset_names, render_presets
from rllib_ext.cli.profile import profile, render
from rllib_ext.cli.runconfig import CORE_OPTIONS, EXTENSION_OPTIONS, Option, resolve_settings

__all__ = ["main"]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

logger = logging.getLogger("rllib_ext.cli")


class _Parser(argparse.ArgumentParser):
    """``argparse`` that raises instead of printing usage plus a message and exiting."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{message}. Fix: see '{self.prog} --help'.")


def _version() -> str:
    # From the installed metadata: `import rllib_ext.__version__` would not import Ray, but the
    # package's public names do, and --help must stay fast.
    try:
        return version("rllib-ext")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _build_parser() -> _Parser:
    parser = _Parser(prog="rllib-ext", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"rllib-ext {_version()}")
    commands = parser.add_subparsers(
        dest="command", metavar="{train,evaluate,profile,presets,doctor}"
    )

    train = commands.add_parser(
        "train",
        help="train PPO (default: CartPole-v1 until the mean return reaches 450)",
        description="Train PPO with rllib_ext.PPOConfig. Precedence, highest first: flags, "
        "--set, --training, --config YAML keys, --preset, the settings saved with a --resume "
        "checkpoint, defaults (CartPole's; SMAC envs without --preset get their map's SMAX preset, 'smax' or, on StarCraft II, 'smac'). rllib_ext keys (amp, gae, ...) follow the same order wherever they are given, "
        "also inside --training or a YAML 'training:' mapping.",
        allow_abbrev=False,
    )
    groups = _add_run_options(train, command="train")
    groups["run"].add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live progress bar (default: only when stderr is a terminal)",
    )
    groups["run"].add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # like the table's flags: in the namespace only when given
        help="also show Ray's and RLlib's own warnings (default: only rllib-ext's lines, "
        "progress, the summary and errors)",
    )
    train.set_defaults(handler=_cmd_train)

    profile = commands.add_parser(
        "profile",
        help="where a training iteration's time goes (breakdown, PyTorch profiler trace)",
        description="Run warm-up, timed and one traced training iteration with the train "
        "flags that shape an iteration (env, resources, PPO, rllib_ext components); write "
        "breakdown.json, breakdown.txt, trace/learner.pt.trace.json.gz and top_ops.txt.",
        allow_abbrev=False,
    )
    run = _add_run_options(profile, command="profile")["run"]
    run.add_argument("--iterations", default="3", metavar="N", help="timed iterations (default: 3)")
    run.add_argument(
        "--warmup", default="1", metavar="N", help="untimed iterations first (default: 1)"
    )
    run.add_argument(
        "--out", default=None, metavar="DIR", help="output directory (default: rllib_ext_runs/)"
    )
    run.add_argument(
        "--stock",
        action="store_true",
        help="profile RLlib's own PPOConfig and learner (no rllib_ext component)",
    )
    run.add_argument(
        "--no-trace", action="store_true", help="skip the PyTorch profiler trace iteration"
    )
    profile.set_defaults(handler=_cmd_profile)

    evaluate = commands.add_parser(
        "evaluate",
        help="play episodes with a trained checkpoint (greedy, or --explore)",
        description="Play episodes with the policy of a 'rllib-ext train' checkpoint (or run "
        "directory, its newest checkpoint) in one local process, no Ray cluster: the "
        "checkpoint's env, connectors and trained RLModule. Greedy actions by default; "
        "prints the mean return (and the win rate on SMAC envs), or one JSON object with --json.",
        allow_abbrev=False,
    )
    evaluate.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="checkpoint directory or rllib-ext train run directory",
    )
    evaluate.add_argument("--episodes", default="10", metavar="N", help="episodes (default: 10)")
    evaluate.add_argument("--env", default=None, help="override the checkpoint's env")
    evaluate.add_argument(
        "--env-config",
        default=None,
        metavar="JSON",
        help="override the checkpoint's env_config (JSON object)",
    )
    evaluate.add_argument("--seed", default=None, metavar="N", help="env seed")
    evaluate.add_argument(
        "--num-envs",
        default=None,
        metavar="N",
        help="SMAX checkpoints: battles played at once by one compiled step (default: "
        "min(episodes, 256)); 1 plays one at a time on RLlib's env runner, as other envs do",
    )
    evaluate.add_argument(
        "--explore",
        action="store_true",
        help="sample actions from the policy's distribution, as in training (default: greedy)",
    )
    evaluate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (returns, mean, win rate...) on stdout instead of text",
    )
    evaluate.add_argument(
        "--video",
        default=None,
        metavar="DIR",
        help="record one MP4 per episode into DIR with gymnasium's RecordVideo (gymnasium "
        'envs; needs moviepy: pip install "rllib-ext[video]") (default: no video)',
    )
    evaluate.set_defaults(handler=_cmd_evaluate)

    presets = commands.add_parser(
        "presets",
        help="list the per-env presets of 'train --preset'",
        description="The per-env presets shipped with rllib_ext (rllib_ext/presets/*.yaml): "
        "name and what it is for.",
    )
    presets.set_defaults(handler=_cmd_presets)

    doctor = commands.add_parser(
        "doctor", help="versions, CUDA/NCCL/bf16 support and optional backends"
    )
    doctor.set_defaults(handler=_cmd_doctor)
    return parser


def _add_run_options(
    parser: argparse.ArgumentParser, *, command: str
) -> dict[str, argparse._ArgumentGroup]:
    """The option table's flags in ``--help`` groups; ``profile`` gets no train-only flag.

    Every flag defaults to "not given" (``argparse.SUPPRESS``) so that YAML keys and
    ``--training`` values are only overridden by flags the user typed; the help line shows the
    one effective default.
    """
    titles = {**GROUPS, "run": GROUPS["run"] if command == "train" else "profile run"}
    groups = {key: parser.add_argument_group(title) for key, title in titles.items()}
    groups["run"].add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML file with the flags' keys (e.g. 'num_env_runners: 1', 'training: {lr: 1e-4}'); "
        "command-line flags win",
    )
    groups["run"].add_argument(
        "--preset",
        metavar="NAME",
        help="per-env settings shipped with rllib_ext, below --config/--training/--set/flags: "
        f"{', '.join(preset_names())} ('rllib-ext presets' describes them) (default: none; "
        "'smac' for SMAC envs)",
    )
    for option in ALL_OPTIONS:
        if option.train_only and command != "train":
            continue
        groups[option.group].add_argument(
            option.flag,
            dest=option.key,
            metavar=option.metavar or option.key.upper(),
            default=argparse.SUPPRESS,
            help=option.help_text,
        )
    groups["ppo"].add_argument(
        "--set",
        dest="set_values",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one PPOConfig.training() key (repeatable), e.g. --set lr=1e-4 --set amp=bf16; the "
        "value is read as JSON (numbers, true/false, null, lists) or else as text; beats "
        "--training (default: none)",
    )
    return groups


def _option_values(args: argparse.Namespace) -> dict[str, str]:
    return {o.key: getattr(args, o.key) for o in ALL_OPTIONS if hasattr(args, o.key)}


def _cmd_train(args: argparse.Namespace) -> int:
    # lazy: imports Ray; keeps it out of --help
    from rllib_ext.cli.train import summary_table, train

    settings = resolve_settings(
        _option_values(args),
        config_file=args.config,
        set_values=args.set_values,
        preset=args.preset,
    )
    result = train(settings, progress=args.progress, verbose=getattr(args, "verbose", False))
    print(summary_table(result))
    return result.exit_code  # 0, or 130 (SIGINT) / 143 (SIGTERM)


def _cmd_profile(args: argparse.Namespace) -> int:
    settings = resolve_settings(
        _option_values(args),
        config_file=args.config,
        set_values=args.set_values,
        preset=args.preset,
    )
    if args.stock:
        # Flags, --set, --training or YAML: any rllib_ext key off its default would be ignored.
        given = [
            o.flag
            for o in EXTENSION_OPTIONS
            if not is_allowed(settings.extensions[o.key], [o.default])
        ]
        if given:
            raise CLIError(
                f"--stock profiles RLlib's own PPO, which has no {', '.join(given)} (given as a "
                "flag, --set, --training or in --config). Fix: drop --stock to profile rllib_ext, "
                "or leave those keys at their defaults."
            )
    result = profile(
        settings,
        iterations=args.iterations,
        warmup=args.warmup,
        out_dir=args.out,
        stock=args.stock,
        trace=not args.no_trace,
    )
    print(render(result))
    return EXIT_OK


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from rllib_ext.cli.evaluate import evaluate  # lazy: keeps numpy out of --help

    def convert(key: str, flag: str, value: str | None) -> Any:
        if value is None:
            return None
        option: Option = next(o for o in CORE_OPTIONS if o.key == key)
        try:
            return option.convert(value)
        except ValueError as exc:
            raise CLIError(f"{flag} {value!r} {exc}. Fix: e.g. {flag} {option.example}") from None

    def count(flag: str, value: str, example: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise CLIError(
                f"{flag} {value!r} must be an integer >= 1. Fix: e.g. {flag} {example}."
            ) from None

    episodes = count("--episodes", args.episodes, "10")
    num_envs = None if args.num_envs is None else count("--num-envs", args.num_envs, "200")
    result = evaluate(
        args.checkpoint,
        episodes=episodes,
        env=convert("env", "--env", args.env),
        env_config=convert("env_config", "--env-config", args.env_config),
        seed=convert("seed", "--seed", args.seed),
        explore=args.explore,
        video_dir=args.video,
        num_envs=num_envs,
    )
    if args.json:
        print(json.dumps(result.to_dict()))
        return EXIT_OK
    returns = result.returns
    print(f"checkpoint: {result.checkpoint}")
    policy = "stochastic (--explore)" if result.explore else "greedy (deterministic)"
    print(f"env: {result.env}  episodes: {len(returns)}  policy: {policy}")
    if result.battles_at_once > 1:
        print(
            f"batched: {result.battles_at_once} battles at once, "
            f"{result.checked_actions:,} actions mask-checked"
        )
    print(
        f"mean return: {result.mean:.2f} +/- {result.std:.2f} "
        f"(min {min(returns):.2f}, max {max(returns):.2f})"
    )
    if result.win_rate is not None:
        print(
            f"win rate: {result.win_rate:.3f} ({sum(result.wins)}/{len(result.wins)} battles won)"
        )
    if result.video_dir is not None:
        print(f"videos: {result.video_dir}")
    return EXIT_OK


def _cmd_presets(args: argparse.Namespace) -> int:
    print(render_presets())
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rllib_ext.cli import doctor  # lazy: keeps numpy out of --help

    print(doctor.render(doctor.collect()), end="")
    return EXIT_OK


def _configure_logging() -> None:
    # Our own handler (no root logger changes: Ray configures its own loggers).
    for handler in list(logger.handlers):
        if getattr(handler, "_rllib_ext_cli", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[rllib-ext] %(message)s"))
    handler._rllib_ext_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _error(message: str) -> int:
    one_line = " ".join(str(message).split())
    print(f"rllib-ext: error: {one_line}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rllib-ext`` console script; returns the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as exc:
        return _error(str(exc))
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return _error(
            "choose a command: train, evaluate, profile, presets or doctor. Fix: e.g. 'rllib-ext train'."
        )
    _configure_logging()
    try:
        return args.handler(args)
    except CLIError as exc:
        return _error(str(exc))
    except Exception as exc:  # bad input found late (corrupt checkpoint, non-UTF-8 file)
        message = one_line_error(
            exc,
            checkpoint=getattr(args, "resume", None) or getattr(args, "checkpoint", None),
            config_file=getattr(args, "config", None),
        )
        if message is None:
            raise
        return _error(message)
    except KeyboardInterrupt:
        print("rllib-ext: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
