"""Checks that an env name resolves, before Ray starts (one clear line instead of a worker crash).

RLlib resolves ``config.env`` in this order (``Algorithm._get_env_id_and_creator``): a name
registered with ``ray.tune.register_env``, a ``"pkg.module.Class"`` path, then ``gym.make``.
:func:`check_env` follows the same order.
"""

from __future__ import annotations

import difflib
import importlib
import json
from typing import Any, Literal

from rllib_ext.cli.runconfig import CLIError

__all__ = ["EnvKind", "check_env"]

EnvKind = Literal["registered", "classpath", "gymnasium"]

_FIX = (
    "Fix: pass a gymnasium id such as CartPole-v1, 'module:EnvId-v0' (imports module), a name "
    "registered with ray.tune.register_env before training, or a 'pkg.module.Class' path."
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import_class(path: str) -> bool:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        return False
    try:
        return hasattr(importlib.import_module(module_name), attr)
    except ImportError:
        return False


def check_env(env: str, env_config: dict[str, Any], *, flag: str = "--env") -> EnvKind:
    """Resolves ``env`` like RLlib does; for gymnasium ids also builds it once with ``env_config``.

    Returns:
        How RLlib will create the env.

    Raises:
        CLIError: the name resolves nowhere, or the env cannot be built with ``env_config``.
    """
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if _global_registry.contains(ENV_CREATOR, env):
        return "registered"
    import gymnasium as gym

    try:
        gym.spec(env)
    except (gym.error.Error, ImportError, ValueError) as exc:
        if "." in env and ":" not in env and _import_class(env):
            return "classpath"
        close = difflib.get_close_matches(env, list(gym.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CLIError(
            f"{flag} {env!r} is not a known environment ({_first_line(exc)}).{hint} {_FIX}"
        ) from None
    try:
        # Classic-control sized envs build in milliseconds; this catches bad --env-config
        # keys and missing extras (box2d, ale) before any Ray worker tries the same.
        instance = gym.make(env, **env_config)
        instance.close()
    except Exception as exc:  # noqa: BLE001 - any construction failure is user input here
        what = f"with --env-config {json.dumps(env_config)}" if env_config else ""
        raise CLIError(
            f"{flag} {env!r} cannot be created {what} ({_first_line(exc)}). Fix: pass keyword "
            "arguments the env accepts in --env-config, or install the env's extra."
        ) from None
    return "gymnasium"
