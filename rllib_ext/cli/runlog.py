"""The run directory in Tune's trial format, written through Tune's own logger callbacks.

``rllib-ext train`` keeps its light in-process ``algo.train()`` loop (no ``tune.Tuner``) and
hands every result to the logger callbacks Tune runs for a trial, so a run directory looks like
a Tune trial directory and Tune's readers work on it (``ray.tune.Result.from_path(run_dir)``,
``pandas.read_csv(run_dir / "progress.csv")``, TensorBoard)::

    result.json     one JSON line per iteration   Tune's JsonLoggerCallback
    params.json     the algorithm config          Tune's JsonLoggerCallback (+ params.pkl)
    events.out.*    TensorBoard scalars           Tune's TBXLoggerCallback
    progress.csv    one row per iteration         ProgressCsvCallback (below)

``progress.csv`` has Tune's layout (the result flattened with ``/``, ``config`` dropped) but is
written by :class:`ProgressCsvCallback`: Tune's ``CSVLoggerCallback`` takes the columns of the
first result it sees, drops columns that appear later, and on a resumed file writes rows in the
new result's column order under the old header (misaligned columns). Ours keeps the file's
header, widens it when a column appears (rewriting the file through a temporary file and an
atomic rename), and otherwise only appends.

Kill safety: rows are appended and flushed per iteration; a resume first drops the rows after
the restored iteration (and a partial last line a kill may have left) by writing the kept rows
to a temporary file and renaming it over the original (:func:`trim_after`), so each iteration
is in the files exactly once. TensorBoard gets a purge marker at the restored iteration so it
hides the events of the lost iterations.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.logger import JsonLoggerCallback, LoggerCallback, TBXLoggerCallback
from ray.tune.utils import flatten_dict

__all__ = [
    "PROGRESS_FILE",
    "RESULT_FILE",
    "ProgressCsvCallback",
    "RunLog",
    "RunTrial",
    "run_trial_id",
    "trim_after",
]

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
_PURGE_SUFFIX = ".purge"


@dataclass(eq=False)
class RunTrial:
    """What Tune's logger callbacks read from a ``Trial``: where to write and the config.

    Tune hands its callbacks a ``ray.tune.experiment.Trial``, whose files go to a staging
    directory under ``/tmp/ray/session_*`` and are synced to storage later (not kill-safe);
    this handle points them at the run directory itself. ``checkpoint`` is ``None`` so the
    callbacks never try to download files from remote storage.
    """

    local_path: str
    config: dict[str, Any]
    evaluated_params: dict[str, Any] = field(default_factory=dict)
    checkpoint: None = None
    trial_id: str = "rllib_ext"
    """Names the run in trackers (the W&B run id, the MLflow run name); see :func:`run_trial_id`."""
    experiment_dir_name: str = "rllib_ext"
    """The W&B group."""

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)

    def __str__(self) -> str:
        return self.trial_id


def run_trial_id(run_dir: Path) -> str:
    """A tracker id for ``run_dir``: its name and a hash of its absolute path (letters, digits,
    ``_`` and ``-`` only, as W&B run ids need). Every segment of a run gets the same id."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", run_dir.name)[:48] or "run"
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def _replace_text(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    with temp.open("w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _complete_lines(text: str) -> list[str]:
    """Lines that end in a newline (a kill can leave the last one cut short)."""
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is partial (or empty)


def _trim_json(path: Path, iteration: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in _complete_lines(path.read_text()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(row.get("training_iteration", 0)) <= iteration:
            kept.append(line)
    _replace_text(path, "".join(f"{line}\n" for line in kept))


def _trim_csv(path: Path, iteration: int) -> None:
    if not path.exists():
        return
    lines = _complete_lines(path.read_text())
    if not lines:
        _replace_text(path, "")
        return
    rows = list(csv.reader(io.StringIO("".join(f"{line}\n" for line in lines))))
    header, body = rows[0], rows[1:]
    try:
        column = header.index("training_iteration")
    except ValueError:
        column = None
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for row in body:
        if len(row) != len(header) or column is None:
            continue
        try:
            if int(float(row[column])) <= iteration:
                writer.writerow(row)
        except ValueError:
            continue
    _replace_text(path, out.getvalue())


def trim_after(run_dir: Path, iteration: int) -> None:
    """Drops the rows after ``iteration`` from ``result.json`` and ``progress.csv``.

    Each file is rewritten through a temporary file and an atomic rename (never truncated in
    place), so a kill during the trim leaves the old file. TensorBoard gets a purge marker:
    events at steps after ``iteration`` written before now are hidden.
    """
    _trim_json(run_dir / RESULT_FILE, iteration)
    _trim_csv(run_dir / PROGRESS_FILE, iteration)
    if any(run_dir.glob("events.out.tfevents.*")):
        from tensorboardX import SummaryWriter  # lazy: optional, only for TensorBoard files

        # purge_step: TensorBoard drops earlier events whose step is >= it.
        SummaryWriter(
            logdir=str(run_dir), purge_step=iteration + 1, filename_suffix=_PURGE_SUFFIX
        ).close()


class ProgressCsvCallback(LoggerCallback):
    """Tune's ``progress.csv`` that stays rectangular when columns appear or a run resumes."""

    def __init__(self) -> None:
        self._columns: dict[RunTrial, list[str]] = {}

    def _columns_of(self, trial: RunTrial) -> list[str]:
        if trial not in self._columns:
            path = Path(trial.local_path, PROGRESS_FILE)
            header: list[str] = []
            if path.exists() and path.stat().st_size > 0:
                with path.open(newline="") as f:
                    header = next(csv.reader(f), [])
            self._columns[trial] = header
        return self._columns[trial]

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:  # noqa: D102
        row = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
        path = Path(trial.local_path, PROGRESS_FILE)
        columns = self._columns_of(trial)
        new = [k for k in row if k not in set(columns)]
        if new or not columns:
            # Rare (new metric names show up in the first iterations): rewrite wider, atomically.
            old_rows: list[dict[str, str]] = []
            if columns:
                with path.open(newline="") as f:
                    old_rows = list(csv.DictReader(f))
            columns.extend(new)
            out = io.StringIO()
            writer = csv.DictWriter(out, fieldnames=columns)
            writer.writeheader()
            writer.writerows(old_rows)
            writer.writerow(row)
            _replace_text(path, out.getvalue())
            return
        with path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=columns).writerow(row)
            f.flush()

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:  # noqa: D102
        self._columns.pop(trial, None)


class RunLog:
    """Tune's logger callbacks for one run directory, fed one result per iteration.

    Args:
        run_dir: the run directory (Tune's trial directory).
        config: the algorithm config dict (Tune's ``params.json``).
        tensorboard: write TensorBoard events (needs ``tensorboardX``).
    """

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        *,
        tensorboard: bool = True,
        trackers: Sequence[LoggerCallback] = (),
    ):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.trial = RunTrial(
            local_path=str(run_dir),
            config=dict(config),
            trial_id=run_trial_id(run_dir),
            experiment_dir_name=run_dir.name,
        )
        self.callbacks: list[LoggerCallback] = [JsonLoggerCallback(), ProgressCsvCallback()]
        if tensorboard:
            _after_purge_marker(run_dir)
            self.callbacks.append(TBXLoggerCallback())
        for tracker in trackers:  # W&B, MLflow (rllib_ext.cli.tracking): Tune runs setup() first
            tracker.setup()
            self.callbacks.append(tracker)
        for callback in self.callbacks:
            callback.log_trial_start(self.trial)

    def write(self, result: Mapping[str, Any]) -> None:
        """Logs one ``algo.train()`` result (all callbacks flush per call)."""
        result = dict(result)
        iteration = int(result.get("training_iteration", 0))
        for callback in self.callbacks:
            callback.log_trial_result(iteration, self.trial, result)

    def close(self) -> None:
        for callback in self.callbacks:
            callback.log_trial_end(self.trial, failed=False)
            # Tune's end of an experiment: W&B waits here for its uploads to finish.
            callback.on_experiment_end(trials=[self.trial])
        self.callbacks = []


def _after_purge_marker(run_dir: Path) -> None:
    """Waits until the clock second changes if a purge marker was written this second.

    tensorboardX names event files by the second they were opened; the logger's file must sort
    after the purge marker or TensorBoard would apply the purge to the new events too.
    """
    now = int(time.time())
    marked = [p for p in run_dir.glob(f"events.out.tfevents.*{_PURGE_SUFFIX}")]
    if any(p.name.split(".")[3] == str(now) for p in marked):
        time.sleep(now + 1.05 - time.time())
