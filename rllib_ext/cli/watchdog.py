"""``rllib-ext train --learner-timeout``: the learner watchdog wired to the run's checkpoints
and signals (the mechanism is :mod:`rllib_ext.learners.health`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rllib_ext.cli.checkpoints import scan
from rllib_ext.learners.health import LearnerWatchdog

__all__ = ["start_learner_watchdog"]


def start_learner_watchdog(algo: Any, settings: Any, checkpoint_dir: Path, signals: Any) -> Any:
    """Starts a :class:`~rllib_ext.learners.health.LearnerWatchdog` for ``algo``'s learners.

    Args:
        settings: the run's ``TrainSettings`` (``learner_timeout``).
        checkpoint_dir: where the run's checkpoints go (the message names the newest one).
        signals: the run's ``Signals``; once one arrived, a silent learner ends the run at once.
    """
    watchdog = LearnerWatchdog(
        algo,
        timeout_s=settings.learner_timeout,
        last_checkpoint=lambda: scan(checkpoint_dir).newest,
        interrupted=lambda: signals.signum is not None,
    ).start()
    if watchdog.num_learners:
        logging.getLogger("rllib_ext.cli").info(
            "learner watchdog: %d learners, --learner-timeout %g s (%s)",
            watchdog.num_learners,
            settings.learner_timeout,
            watchdog.describe(),
        )
    return watchdog
