"""Where a run reports besides its run directory: the tools RLlib and Tune ship.

* ``--wandb-project NAME``: Tune's ``WandbLoggerCallback`` (``ray.air.integrations.wandb``);
* ``--mlflow-tracking-uri URI``: Tune's ``MLflowLoggerCallback`` (``ray.air.integrations.mlflow``);
* ``--callbacks pkg.module:Class``: the user's ``RLlibCallback`` subclasses, added to the
  algorithm config next to rllib_ext's own (``config.callbacks_class``).

The two trackers are Tune logger callbacks like the ones that write the run directory
(:class:`rllib_ext.cli.runlog.RunLog` feeds them the same results, once per iteration). Their
packages are optional: a missing one fails the run in one line, before Ray starts, naming the
``pip install`` that fixes it. All checks here run before ``ray.init``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any

from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.runconfig import TrainSettings

__all__ = ["MLFLOW_EXPERIMENT", "check_tracking", "load_callbacks", "tracker_callbacks"]

MLFLOW_EXPERIMENT = "rllib-ext"
"""The MLflow experiment the runs go to (each run directory is one MLflow run in it)."""

_PACKAGES = {
    "wandb_project": ("wandb", "--wandb-project"),
    "mlflow_tracking_uri": ("mlflow", "--mlflow-tracking-uri"),
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # imported without a spec (a stand-in module): there it is
        return sys.modules.get(package) is not None


def _require(package: str, flag: str) -> None:
    if not _installed(package):
        raise CLIError(
            f"{flag} needs the {package!r} package, which is not installed. Fix: pip install "
            f"{package} (or drop {flag})."
        )


def load_callbacks(paths: Sequence[str]) -> list[type]:
    """Imports the ``--callbacks`` classes (``pkg.module:Class``).

    Raises:
        CLIError: a module that does not import, a missing name, or a class that is not an
            RLlib callback (``ray.rllib.callbacks.callbacks.RLlibCallback`` subclass).
    """
    from ray.rllib.callbacks.callbacks import RLlibCallback  # lazy: keeps Ray out of --help

    fix = (
        "Fix: pass 'pkg.module:Class' with a subclass of "
        "ray.rllib.callbacks.callbacks.RLlibCallback, importable from where you run."
    )
    classes = []
    for path in paths:
        module_name, _, name = path.partition(":")
        if os.getcwd() not in sys.path:  # the console script's sys.path lacks it
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CLIError(
                f"--callbacks {path!r}: cannot import module {module_name!r} "
                f"({type(exc).__name__}: {first}). {fix}"
            ) from None
        callback = getattr(module, name, None)
        if callback is None:
            raise CLIError(f"--callbacks {path!r}: module {module_name!r} has no {name!r}. {fix}")
        if not (isinstance(callback, type) and issubclass(callback, RLlibCallback)):
            what = callback.__name__ if isinstance(callback, type) else type(callback).__name__
            raise CLIError(f"--callbacks {path!r} is {what}, not an RLlib callback class. {fix}")
        classes.append(callback)
    return classes


def check_tracking(settings: TrainSettings) -> None:
    """The packages of the requested trackers and the ``--callbacks`` classes, before Ray.

    Raises:
        CLIError: see :func:`load_callbacks`; a tracker whose package is missing.
    """
    for key, (package, flag) in _PACKAGES.items():
        if getattr(settings, key) is not None:
            _require(package, flag)
    load_callbacks(settings.callbacks)


def tracker_callbacks(settings: TrainSettings) -> list[Any]:
    """Tune logger callbacks for the trackers ``settings`` asks for (empty by default).

    A resumed segment continues the same W&B run (the run directory's trial id, ``resume=
    "allow"``) and, for MLflow, logs into the same experiment.
    """
    trackers: list[Any] = []
    if settings.wandb_project is not None:
        _require("wandb", "--wandb-project")
        from ray.air.integrations.wandb import WandbLoggerCallback  # lazy: optional (wandb)

        trackers.append(WandbLoggerCallback(project=settings.wandb_project, resume="allow"))
    if settings.mlflow_tracking_uri is not None:
        _require("mlflow", "--mlflow-tracking-uri")
        from ray.air.integrations.mlflow import MLflowLoggerCallback  # lazy: optional (mlflow)

        trackers.append(
            MLflowLoggerCallback(
                tracking_uri=settings.mlflow_tracking_uri, experiment_name=MLFLOW_EXPERIMENT
            )
        )
    return trackers
