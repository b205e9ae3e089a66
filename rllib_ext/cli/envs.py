"""``--env`` before Ray starts: resolve the name, check it, and set up the env for RLlib.

The forms ``rllib-ext train --env`` takes, in RLlib's lookup order
(``Algorithm._get_env_id_and_creator``):

* a name registered with ``ray.tune.register_env`` (``smac_v2``, ``smac``, ``smax``, yours);
* ``module:EnvId-v0``: ``module`` is imported (it registers ``EnvId-v0`` with gymnasium);
* ``pkg.module.Class``: a ``gymnasium.Env`` or RLlib ``MultiAgentEnv`` subclass, built as
  ``Class(env_config)``;
* a gymnasium id (``CartPole-v1``).

:func:`check_env` refuses anything else in one line that lists these forms. SMAC names are
checked without starting the game: the backend is installed and knows the map.
:func:`configure_env` registers class paths and ``module:`` ids with Ray Tune (RLlib's env
runners only look ids up in gymnasium's registry, where neither is) and applies
:mod:`rllib_ext.envs.guard`.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import sys
from typing import Any, Literal

from rllib_ext import _rllib_private as private
from rllib_ext.cli.errors import CLIError
from rllib_ext.envs import SMAC_ENV_DEFAULTS

__all__ = ["EnvKind", "check_env", "configure_env"]

EnvKind = Literal["registered", "classpath", "module", "gymnasium"]

_FIX = (
    "Fix: pass a gymnasium id such as CartPole-v1, 'module:EnvId-v0' (the module registers "
    "EnvId-v0 with gymnasium), 'pkg.module.Class' (a gymnasium.Env or MultiAgentEnv subclass), "
    "or a name registered with ray.tune.register_env before training."
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import_module(name: str, env: str, flag: str) -> Any:
    # The `rllib-ext` console script's sys.path lacks the working directory that
    # `python -m` has; a user's env package next to where they run is found either way.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise CLIError(
            f"{flag} {env!r}: cannot import module {name!r} ({_first_line(exc)}; install its "
            f"package or run from the directory that holds it). {_FIX}"
        ) from None


def _env_class(env: str, flag: str) -> type:
    """The class a ``pkg.module.Class`` path names; refuses anything but an env class."""
    # lazy: keeps gymnasium and Ray out of --help
    import gymnasium as gym
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    module_name, _, attr = env.rpartition(".")
    module = _import_module(module_name, env, flag)
    cls = getattr(module, attr, None)
    if cls is None:
        raise CLIError(f"{flag} {env!r}: module {module_name!r} has no {attr!r}. {_FIX}")
    if not (isinstance(cls, type) and issubclass(cls, (gym.Env, MultiAgentEnv))):
        raise CLIError(
            f"{flag} {env!r} is {type(cls).__name__} {cls!r}, not a gymnasium.Env or "
            f"MultiAgentEnv subclass. {_FIX}"
        )
    return cls


def _check_gymnasium(env: str, env_config: dict[str, Any], flag: str) -> None:
    import gymnasium as gym  # lazy: keeps gymnasium out of --help

    name = env.split(":", 1)[1] if ":" in env else env
    try:
        gym.spec(name)
    except (gym.error.Error, ImportError, ValueError) as exc:
        close = difflib.get_close_matches(name, list(gym.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CLIError(
            f"{flag} {env!r} is not a known environment ({_first_line(exc)}).{hint} {_FIX}"
        ) from None
    try:
        # Classic-control sized envs build in milliseconds; this catches bad --env-config
        # keys and missing extras (box2d, ale) before any Ray worker tries the same.
        gym.make(name, **env_config).close()
    except Exception as exc:  # noqa: BLE001 - any construction failure is user input here
        what = f"with --env-config {json.dumps(env_config)} " if env_config else ""
        raise CLIError(
            f"{flag} {env!r} cannot be created {what}({_first_line(exc)}). Fix: pass keyword "
            "arguments the env accepts in --env-config, or install the env's extra."
        ) from None


def _check_smac(env: str, env_config: dict[str, Any], flag: str) -> None:
    """SMAC names: settings valid, backend installed, map known; the game is not started."""
    # lazy: rllib_ext.envs.smac imports Ray; keeps it out of --help
    from rllib_ext.envs.smac import sc2
    from rllib_ext.envs.smac.settings import SMACEnvSettings

    try:
        settings = SMACEnvSettings.from_env_config({**SMAC_ENV_DEFAULTS[env], **env_config})
    except (TypeError, ValueError) as exc:
        raise CLIError(f"{flag} {env!r} --env-config: {_first_line(exc)}") from None
    backend, map_name = settings.backend, settings.map_name
    if backend == "auto":
        if settings.game_factory is not None or any(
            sc2.availability(p, map_name)[0] for p in ("smacv2", "smac")
        ):
            return
        backend = "smax"
    if backend != "smax":
        if settings.game_factory is not None:
            return
        ok, why = sc2.availability(backend, map_name)
        if not ok:
            raise CLIError(
                f"{flag} {env!r} with backend {backend!r} cannot run map {map_name!r}: {why}. "
                f"{sc2.install_steps(backend)} Or use the SMAX backend (no game): "
                '--env-config \'{"backend": "smax"}\'.'
            )
        return
    from rllib_ext.envs.smac.smax import smax_map_names  # lazy: keeps Ray out of --help

    try:
        maps = smax_map_names()
    except ImportError as exc:
        raise CLIError(f"{flag} {env!r} needs the SMAX backend: {_first_line(exc)}") from None
    if map_name not in maps:
        close = difflib.get_close_matches(map_name, maps, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CLIError(
            f"{flag} {env!r}: map_name {map_name!r} is not a SMAX scenario.{hint} SMAX maps: "
            f'{", ".join(maps)}. Fix: --env-config \'{{"map_name": "3m"}}\'.'
        )


def _guarded(env: str) -> bool:
    """True if ``env`` is registered only because an earlier run guarded it (same process)."""
    from rllib_ext.envs.guard import GuardedCreator  # lazy: keeps Ray out of --help

    return isinstance(private.registered_env_creator(env), GuardedCreator)


def check_env(env: str, env_config: dict[str, Any], *, flag: str = "--env") -> EnvKind:
    """Resolves ``env`` like RLlib does and checks it can be built (see the module docstring).

    Returns:
        Which form ``env`` is.

    Raises:
        CLIError: the name resolves nowhere, its module does not import, the class is not an
            env, the env cannot be built with ``env_config``, or a SMAC backend/map is missing.
    """
    if env in SMAC_ENV_DEFAULTS:
        _check_smac(env, env_config, flag)
        return "registered"
    if private.registered_env_creator(env) is not None and not _guarded(env):
        return "registered"
    if ":" in env:
        module_name, _, name = env.partition(":")
        if not module_name or not name or ":" in name:
            raise CLIError(f"{flag} {env!r} is not of the form 'module:EnvId-v0'. {_FIX}")
        _import_module(module_name, env, flag)
        _check_gymnasium(env, env_config, flag)
        return "module"
    import gymnasium as gym  # lazy: keeps gymnasium out of --help

    if "." in env and env not in gym.registry:
        _env_class(env, flag)
        return "classpath"
    _check_gymnasium(env, env_config, flag)
    return "gymnasium"


def configure_env(config: Any, settings: Any) -> None:
    """Sets ``config`` up for ``settings.env`` (an ``rllib_ext.PPOConfig`` of the CLI).

    Class paths and ``module:`` ids are registered with Ray Tune under their own name; a
    ``MultiAgentEnv`` class trains one shared policy (like SMAC); then the env guard
    (fault isolation unless ``--restart-failed-env-runners false``, ``--non-finite``) and
    RLlib's ``restart_failed_env_runners`` follow the settings.
    """
    # lazy: keeps gymnasium and Ray out of --help
    import gymnasium as gym
    from ray.rllib.env.multi_agent_env import MultiAgentEnv
    from ray.tune.registry import register_env

    from rllib_ext.envs.guard import base_env_creator, guard_env

    env = settings.env
    if private.registered_env_creator(env) is None or _guarded(env):
        kind = check_env(env, dict(settings.env_config))
        if kind in ("classpath", "module"):
            if kind == "module":
                importlib.import_module(env.partition(":")[0])
            register_env(env, base_env_creator(env))
    # Decided on the name, not on the registry: a class path registered earlier in this
    # process (an earlier run, the pre-Ray check) must still get its shared policy.
    is_class_path = ":" not in env and "." in env and env not in gym.registry
    if is_class_path and issubclass(_env_class(env, "--env"), MultiAgentEnv):
        # lazy: keeps Ray out of --help
        from rllib_ext.smac_config import SHARED_POLICY_ID, shared_policy_mapping

        if not config.is_multi_agent:
            config.multi_agent(policies={SHARED_POLICY_ID}, policy_mapping_fn=shared_policy_mapping)
    config.fault_tolerance(restart_failed_env_runners=settings.restart_failed_env_runners)
    guard_env(
        config,
        isolate_faults=settings.restart_failed_env_runners,
        non_finite=settings.non_finite,
    )
