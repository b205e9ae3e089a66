"""Where one ``rllib-ext train`` segment writes, decided before Ray starts.

A *run* is everything under one run directory; a *segment* is one ``rllib-ext train`` process
that contributes to it (the first one, then one per ``--resume``). ``--resume`` without
``--run-dir`` continues in the run directory the checkpoint belongs to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rllib_ext.cli.checkpoints import RunState, read_run_state, scan
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.runconfig import TrainSettings

__all__ = ["RunPlan", "plan_run"]

SETTINGS_JSON = "settings.json"


@dataclass(frozen=True)
class RunPlan:
    run_dir: Path
    checkpoint_dir: Path
    resume: Path | None
    """The checkpoint this segment restores (absolute), or ``None`` for a fresh run."""
    base: RunState
    """The counters at ``resume`` (zeros for a fresh run)."""
    continues_here: bool
    """``resume`` lives in this run's checkpoint directory: the run's rows up to the restored
    iteration are kept (all rows are dropped otherwise)."""


def default_run_dir(env: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env).strip("_") or "env"
    base = Path("rllib_ext_runs") / f"{name}_{datetime.now():%Y%m%d-%H%M%S}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}_{n}")
    return path


def _run_dir_of(checkpoint: Path, state: RunState | None) -> Path | None:
    """The run directory ``checkpoint`` was written in, if it still exists."""
    parent = checkpoint.parent
    if parent.name == "checkpoints" and (parent.parent / SETTINGS_JSON).is_file():
        return parent.parent
    if state is not None and (Path(state.run_dir) / SETTINGS_JSON).is_file():
        return Path(state.run_dir)
    return None


def plan_run(settings: TrainSettings) -> RunPlan:
    """Run directory, checkpoint directory and what to restore.

    Raises:
        CLIError: the run directory is a file, or it holds complete checkpoints newer than
            the one to resume (continuing there would overwrite them).
    """
    resume = Path(settings.resume).resolve() if settings.resume else None
    state = read_run_state(resume) if resume is not None else None
    if settings.run_dir:
        run_dir = Path(settings.run_dir)
    elif resume is not None:
        run_dir = _run_dir_of(resume, state) or default_run_dir(settings.env)
    else:
        run_dir = default_run_dir(settings.env)
    if run_dir.exists() and not run_dir.is_dir():
        raise CLIError(
            f"--run-dir {str(run_dir)!r} is a file, not a directory. "
            "Fix: pass a new or existing directory."
        )
    run_dir = run_dir.resolve()
    checkpoint_dir = Path(settings.checkpoint_dir or run_dir / "checkpoints").resolve()
    found = scan(checkpoint_dir)
    newest = found.newest
    if newest is not None and newest != resume:
        what = f"--resume {resume}" if resume is not None else "a new run"
        raise CLIError(
            f"{what} would overwrite the checkpoints in {checkpoint_dir} (newest: "
            f"{newest.name}). Fix: --resume {run_dir} to continue from the newest, or "
            "--run-dir NEW_DIR to start a separate run."
        )
    if resume is None:
        base = RunState(0, 0, 0.0, 0.0, 0, str(run_dir))
    elif state is not None:
        base = state
    else:  # a checkpoint without counters (RLlib's own, or an older rllib-ext)
        base = RunState(0, 0, 0.0, 0.0, 0, str(run_dir))
    continues_here = resume is not None and resume.parent == checkpoint_dir
    return RunPlan(run_dir, checkpoint_dir, resume, base, continues_here)
