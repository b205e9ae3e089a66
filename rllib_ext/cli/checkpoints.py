"""Crash-safe checkpoints of ``rllib-ext train``: atomic commit and the newest complete one.

A checkpoint is written into a hidden temporary sibling (``.iter_000012.tmp-<pid>-<token>``):
RLlib's own state (``Algorithm.save_to_path``), the rllib_ext settings
(:data:`SETTINGS_FILE`) and the run counters (:data:`RUN_STATE_FILE`).
Only then is the directory renamed to ``iter_000012``; a rename within one directory is atomic,
so a directory named ``iter_NNNNNN`` that this module wrote always holds everything a resume
needs. A kill at any moment leaves either the previous checkpoints untouched or one more
complete checkpoint, plus at worst a temporary directory that is reported and skipped.

Which checkpoint to resume is decided by looking at the directories (:func:`scan`), never at a
pointer in another file that a kill could leave stale.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rllib_ext.cli.errors import CLIError

__all__ = [
    "COMMIT_DELAY_ENV",
    "RUN_STATE_FILE",
    "SETTINGS_FILE",
    "CheckpointScan",
    "RunState",
    "commit_checkpoint",
    "find_checkpoint",
    "incomplete_reason",
    "read_run_state",
    "scan",
    "write_json_atomic",
]

logger = logging.getLogger("rllib_ext.cli")

SETTINGS_FILE = "rllib_ext_settings.json"
"""The rllib_ext settings of the run, inside every checkpoint; ``--resume`` starts from them."""
RUN_STATE_FILE = "rllib_ext_run.json"
"""The run counters (:class:`RunState`) at the checkpoint, inside every checkpoint."""
RLLIB_METADATA_FILE = "rllib_checkpoint.json"

COMMIT_DELAY_ENV = "RLLIB_EXT_TEST_CHECKPOINT_COMMIT_DELAY_S"
"""Test hook: seconds to sleep between RLlib's save and the rename (fault-injection tests use
it to kill a process while a checkpoint is half written). Unset in normal use."""

_NAME = re.compile(r"^iter_(\d{6,})$")
_TEMP_NAME = re.compile(r"^\.(iter_\d{6,})\.tmp-")


@dataclass(frozen=True)
class RunState:
    """Counters of the whole run (all segments up to this checkpoint)."""

    iteration: int
    env_steps: int
    """Lifetime env steps sampled (``num_env_steps_sampled_lifetime``)."""
    wall_time_s: float
    """Process time of all segments, each counted up to its last checkpoint."""
    train_time_s: float
    """``build_algo()`` to the last iteration, summed over segments."""
    segments: int
    """How many ``rllib-ext train`` processes contributed (1 for a run never resumed)."""
    run_dir: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_json_atomic(path: Path, data: Mapping[str, Any] | list[Any]) -> None:
    """Writes JSON to a temporary sibling, flushes it to disk and renames it over ``path``.

    A reader (or a process resumed after a kill) sees the old file or the new one, never a
    truncated one.
    """
    text = json.dumps(data, indent=2, default=str) + "\n"
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    with temp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def commit_checkpoint(
    algo: Any, checkpoint_dir: Path, *, settings: Mapping[str, Any], state: RunState
) -> Path:
    """Saves ``algo`` as ``checkpoint_dir/iter_NNNNNN`` in one atomic rename.

    If that name already exists (a checkpoint this run is about to replace, e.g. an old-format
    one), it is renamed to ``iter_NNNNNN.replaced-<time>`` and kept, never deleted.

    Returns:
        The absolute path of the committed checkpoint.
    """
    checkpoint_dir = checkpoint_dir.resolve()
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / checkpoint_name(state.iteration)
    temp = checkpoint_dir / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
    algo.save_to_path(str(temp))
    delay = float(os.environ.get(COMMIT_DELAY_ENV) or 0.0)
    if delay > 0:
        time.sleep(delay)
    write_json_atomic(temp / SETTINGS_FILE, settings)
    write_json_atomic(temp / RUN_STATE_FILE, state.to_dict())
    _fsync_tree(temp)
    if final.exists():
        aside = final.with_name(f"{final.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        logger.warning("checkpoint %s exists: moved to %s (kept)", final, aside.name)
        os.replace(final, aside)
    os.replace(temp, final)
    _fsync_dir(checkpoint_dir)
    logger.info("checkpoint saved: %s", final)
    return final


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete ``rllib-ext train`` checkpoint, or ``None`` if it is.

    Complete: RLlib's metadata and the settings file are present and parse. (Checkpoints of
    this version also hold :data:`RUN_STATE_FILE`; earlier versions wrote the settings file
    last, so its presence marks their checkpoints complete too.)
    """
    if _TEMP_NAME.match(path.name):
        return "an interrupted write (temporary directory)"
    for name in (RLLIB_METADATA_FILE, SETTINGS_FILE):
        file = path / name
        if not file.is_file():
            return f"no {name}: the write was interrupted"
        try:
            json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return f"{name} is truncated or corrupt"
    if (path / RUN_STATE_FILE).exists() and read_run_state(path) is None:
        return f"{RUN_STATE_FILE} is truncated or corrupt"
    return None


def read_run_state(checkpoint: Path) -> RunState | None:
    """The counters saved with ``checkpoint`` (``None`` for checkpoints without them)."""
    try:
        data = json.loads((checkpoint / RUN_STATE_FILE).read_text())
        return RunState(**data)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
        return None


def _iteration_of(name: str) -> int | None:
    match = _NAME.match(name) or _TEMP_NAME.match(name)
    if match is None:
        return None
    digits = match.group(1)
    return int(digits.removeprefix("iter_"))


@dataclass(frozen=True)
class CheckpointScan:
    """What a checkpoint directory holds, oldest first."""

    complete: tuple[Path, ...]
    incomplete: tuple[tuple[Path, str], ...]
    """``(path, reason)`` of every checkpoint-like directory that cannot be resumed."""

    @property
    def newest(self) -> Path | None:
        return self.complete[-1] if self.complete else None

    def skipped_line(self, *, after: Path | None = None) -> str | None:
        """One line naming the incomplete checkpoints newer than ``after`` (``None`` if none)."""
        limit = _iteration_of(after.name) if after is not None else None
        limit = -1 if limit is None else limit
        skipped = [(p, why) for p, why in self.incomplete if (_iteration_of(p.name) or 0) > limit]
        if not skipped:
            return None
        names = ", ".join(f"{p.name} ({why})" for p, why in skipped)
        return f"skipped {len(skipped)} incomplete checkpoint(s), kept for inspection: {names}"


def scan(checkpoint_dir: Path) -> CheckpointScan:
    """Sorts the ``iter_*`` directories under ``checkpoint_dir`` into complete and incomplete."""
    complete: list[tuple[int, Path]] = []
    incomplete: list[tuple[int, Path, str]] = []
    if not checkpoint_dir.is_dir():
        return CheckpointScan((), ())
    for path in checkpoint_dir.iterdir():
        iteration = _iteration_of(path.name)
        if iteration is None or not path.is_dir():
            continue
        reason = incomplete_reason(path)
        if reason is None:
            complete.append((iteration, path.resolve()))
        else:
            incomplete.append((iteration, path.resolve(), reason))
    complete.sort()
    incomplete.sort()
    return CheckpointScan(
        tuple(p for _, p in complete), tuple((p, why) for _, p, why in incomplete)
    )


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Where a run directory's checkpoints may be: ``checkpoints/``, its ``--checkpoint-dir``
    (from the run's ``settings.json``) and the directory itself."""
    dirs = [run_dir / "checkpoints"]
    try:
        saved = json.loads((run_dir / "settings.json").read_text()).get("checkpoint_dir")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        saved = None
    if saved:
        dirs.append(Path(saved))
    return [*dirs, run_dir]


def find_checkpoint(path: str | Path, *, flag: str) -> Path:
    """The checkpoint ``path`` names, as an absolute path.

    * A checkpoint directory: itself. One that ``rllib-ext train`` was still writing when it
      was killed is refused with the reason.
    * A run directory (or a directory of checkpoints): the newest complete checkpoint; the
      incomplete ones after it are reported in one log line and skipped (kept on disk).

    Raises:
        CLIError: nothing usable at ``path``.
    """
    original = Path(path).expanduser()
    fix = (
        "Fix: pass a checkpoint written by 'rllib-ext train' (RUN_DIR/checkpoints/iter_NNNNNN) "
        f"or its run directory, e.g. {flag} rllib_ext_runs/<run>."
    )
    if not original.exists():
        raise CLIError(f"{flag} {str(path)!r}: no such file or directory. {fix}")
    original = original.resolve()
    if (original / RLLIB_METADATA_FILE).is_file() or _TEMP_NAME.match(original.name):
        ours = _iteration_of(original.name) is not None or (original / SETTINGS_FILE).exists()
        reason = incomplete_reason(original) if ours else None
        if reason is not None:
            raise CLIError(
                f"{flag} {str(path)!r} is an incomplete checkpoint ({reason}). Fix: pass its "
                f"run directory to use the newest complete checkpoint, e.g. {flag} "
                f"{original.parent.parent}."
            )
        return original
    skipped: list[str] = []
    for directory in _checkpoint_dirs(original):
        found = scan(directory)
        line = found.skipped_line(after=found.newest)
        if found.newest is not None:
            if line:
                logger.warning("%s: %s", directory, line)
            return found.newest
        if line:
            skipped.append(line)
    detail = f" ({'; '.join(skipped)})" if skipped else ""
    raise CLIError(f"{flag} {str(path)!r} holds no complete checkpoint{detail}. {fix}")
