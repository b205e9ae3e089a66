"""The ``algo.train()`` loop of ``rllib-ext train``: one result per iteration to the run log
and the progress line, stop criteria, periodic and final checkpoints, signals.

:func:`run_training_loop` works on an algorithm that is already built (and restored); building
it and tearing it down is :func:`rllib_ext.cli.train.train`'s job.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.exceptions

from rllib_ext.cli.checkpoints import RunState, commit_checkpoint, scan
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.interrupts import RunInterrupted, Signals
from rllib_ext.cli.progress import IterationStats, ProgressReporter
from rllib_ext.cli.runconfig import TrainSettings
from rllib_ext.envs.smac.callbacks import WIN_RATE

__all__ = [
    "LoopOutcome",
    "Segment",
    "env_steps_of",
    "episode_return_of",
    "interrupt_reason",
    "lost_cluster_member",
    "run_training_loop",
    "win_rate_of",
]

logger = logging.getLogger("rllib_ext.cli")


def env_steps_of(result: Mapping[str, Any]) -> int:
    steps = result.get("num_env_steps_sampled_lifetime")
    if steps is None:
        steps = result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0)
    return int(steps)


def episode_return_of(result: Mapping[str, Any]) -> float:
    value = result.get("env_runners", {}).get("episode_return_mean")
    return float(value) if value is not None else math.nan


def _iteration_env_steps(result: Mapping[str, Any], progress: ProgressReporter) -> int:
    """Env steps sampled in this iteration (not the lifetime count: a resumed run starts high)."""
    this_iteration = result.get("env_runners", {}).get("num_env_steps_sampled")
    if this_iteration is not None:
        return int(this_iteration)
    previous = progress.history[-1].env_steps if progress.history else None
    return env_steps_of(result) - previous if previous is not None else 0


def win_rate_of(result: Mapping[str, Any]) -> float | None:
    """``env_runners/rllib_ext/win_rate`` (SMAC envs, :class:`rllib_ext.envs.smac.SMACMetricsCallback`)."""
    value = result.get("env_runners", {}).get(WIN_RATE)
    return float(value) if value is not None else None


def _stop_reason(
    settings: TrainSettings,
    episode_return: float,
    env_steps: int,
    elapsed: float,
    win_rate: float | None = None,
) -> str | None:
    if settings.stop_reward is not None and episode_return >= settings.stop_reward:
        return "stop_reward"
    if (
        settings.stop_win_rate is not None
        and win_rate is not None
        and win_rate >= settings.stop_win_rate
    ):
        return "stop_win_rate"
    if settings.stop_timesteps is not None and env_steps >= settings.stop_timesteps:
        return "stop_timesteps"
    if settings.time_budget is not None and elapsed >= settings.time_budget:
        return "time_budget"
    return None


@dataclass
class Segment:
    """This process's share of the run: the counters it started from and its clocks."""

    base: RunState
    started: float
    """``time.perf_counter()`` at the start of :func:`train` (the time budget counts from it)."""
    build_started: float | None = None

    def state(self, *, iteration: int, env_steps: int, run_dir: Path) -> RunState:
        now = time.perf_counter()
        return RunState(
            iteration=iteration,
            env_steps=max(env_steps, self.base.env_steps),
            wall_time_s=self.base.wall_time_s + (now - self.started),
            train_time_s=self.base.train_time_s
            + (now - self.build_started if self.build_started is not None else 0.0),
            segments=self.base.segments + 1,
            run_dir=str(run_dir),
        )


@dataclass
class LoopOutcome:
    last_result: Mapping[str, Any] | None
    stop_reason: str
    checkpoint: Path | None
    state: RunState


def run_training_loop(
    algo: Any,
    settings: TrainSettings,
    *,
    checkpoint_dir: Path,
    run_log: Any,
    progress: ProgressReporter,
    segment: Segment,
    signals: Signals,
) -> LoopOutcome:
    """Calls ``algo.train()`` until a stop criterion or a signal, then commits a final checkpoint.

    Each result is logged (``run_log.write``) before the next iteration starts; checkpoints
    every ``checkpoint_freq`` iterations and at the end. A first SIGINT/SIGTERM stops the loop
    at once (it only waits for a metrics row or a checkpoint commit in progress).
    """
    run_dir = Path(settings.run_dir or ".")
    result: Mapping[str, Any] | None = None
    checkpoint: Path | None = None
    saved_iteration = segment.base.iteration
    logged_iteration = segment.base.iteration
    env_steps = segment.base.env_steps
    reason = "interrupted"

    def commit() -> Path:
        state = segment.state(iteration=algo.iteration, env_steps=env_steps, run_dir=run_dir)
        with _lost_member_ends_run(f"saving checkpoint {algo.iteration}", checkpoint_dir, run_dir):
            return commit_checkpoint(algo, checkpoint_dir, settings=settings.to_dict(), state=state)

    try:
        while True:
            with _lost_member_ends_run(f"iteration {algo.iteration + 1}", checkpoint_dir, run_dir):
                result = algo.train()
            elapsed = time.perf_counter() - segment.started
            steps = env_steps_of(result)
            episode_return = episode_return_of(result)
            with signals.deferred():
                run_log.write(result)
                logged_iteration = int(result.get("training_iteration", algo.iteration))
                env_steps = steps
            iteration_s = float(result.get("time_this_iter_s") or 0.0)
            new_steps = _iteration_env_steps(result, progress)
            progress.update(
                IterationStats(
                    iteration=logged_iteration,
                    env_steps=steps,
                    episode_return_mean=episode_return,
                    steps_per_s=new_steps / iteration_s if iteration_s > 0 else 0.0,
                    elapsed_s=elapsed,
                    win_rate=win_rate_of(result),
                )
            )
            stop = _stop_reason(settings, episode_return, steps, elapsed, win_rate_of(result))
            if stop is not None:
                reason = stop
                break
            if settings.checkpoint_freq and algo.iteration % settings.checkpoint_freq == 0:
                with signals.deferred():
                    checkpoint = commit()
                    saved_iteration = algo.iteration
    except KeyboardInterrupt as exc:
        progress.close()
        reason = interrupt_reason(exc)
        logger.warning(
            "%s: saving a checkpoint before exit (a second signal exits at once)",
            "SIGTERM" if reason == "terminated" else "interrupted",
        )
    signals.stopping()
    if algo.iteration != logged_iteration:
        # Interrupted after RLlib counted an iteration but before its result was logged:
        # a checkpoint now would hold an iteration the metrics files never see.
        logger.warning(
            "the interrupted iteration %d was not logged; not checkpointing it", algo.iteration
        )
    elif saved_iteration != algo.iteration and algo.iteration > 0:
        checkpoint = commit()
    state = segment.state(iteration=logged_iteration, env_steps=env_steps, run_dir=run_dir)
    return LoopOutcome(result, reason, checkpoint, state)


@contextmanager
def _lost_member_ends_run(phase: str, checkpoint_dir: Path, run_dir: Path) -> Iterator[None]:
    """Turns a lost node or actor (:func:`lost_cluster_member`) during ``phase`` into the run's
    one-line :class:`CLIError` naming the last complete checkpoint; any other error passes as is.

    A checkpoint commit interrupted this way leaves only its temporary directory, so "last
    complete" is read after the failure.
    """
    try:
        yield
    except Exception as exc:
        lost = lost_cluster_member(exc)
        if lost is None:
            raise
        raise CLIError(
            f"a Ray node or actor of this run was lost in {phase} "
            f"({lost}). Last complete checkpoint: {scan(checkpoint_dir).newest or 'none'}. "
            "Fix: bring the node back (ray start --address ...) or lower --num-learners/"
            f"--num-env-runners, then continue with --resume {run_dir}."
        ) from None


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer")
"""gloo's words for a collective whose peer learner died (its node or process was lost)."""


def lost_cluster_member(exc: BaseException) -> str | None:
    """``"TYPE: first line"`` when ``exc`` says an actor of the run died, else ``None``.

    The dead actor's own call raises ``RayActorError`` (``NodeDiedError`` for its node); the
    learners that survive fail in their all-reduce with the peer gone, which Ray hands over as a
    ``RayTaskError``. Any other error is a bug to show in full.
    """
    cause: BaseException = exc
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause if exc.cause is not None else exc
        if not any(marker in str(cause) for marker in _PEER_LOST):
            return None
    elif not isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError)):
        return None
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first[:160]}"


def interrupt_reason(exc: BaseException) -> str:
    if isinstance(exc, RunInterrupted) and exc.signum == signal.SIGTERM:
        return "terminated"
    return "interrupted"
