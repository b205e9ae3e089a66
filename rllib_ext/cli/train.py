"""``rllib-ext train``: PPO with ``rllib_ext.PPOConfig``, ``build_algo()`` and an ``algo.train()``
loop until a stop criterion; checkpoints (:mod:`~rllib_ext.cli.checkpoints`), Tune-format
metrics (:mod:`~rllib_ext.cli.runlog`) and a summary under the run directory.

A run survives any kill: ``--resume RUN_DIR`` continues from the newest complete checkpoint,
and SIGTERM / Ctrl-C stop it with a final checkpoint (:mod:`~rllib_ext.cli.interrupts`).

:func:`train` is the whole command and is what ``benchmarks/train_cartpole.py`` times.
It accepts an already-initialized Ray (tests, notebooks) and leaves it running; a Ray it
started itself is shut down at the end. This module is the setup and teardown around the loop
(:mod:`~rllib_ext.cli.loop`); the PPO config comes from :mod:`~rllib_ext.cli.ppo_config`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray
from ray.train.constants import DEFAULT_STORAGE_PATH
from tqdm.contrib.logging import logging_redirect_tqdm

from rllib_ext.cli.checkpoints import write_json_atomic
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.interrupts import Signals
from rllib_ext.cli.loop import (
    LoopOutcome,
    Segment,
    env_steps_of,
    episode_return_of,
    interrupt_reason,
    run_training_loop,
    win_rate_of,
)
from rllib_ext.cli.ppo_config import (
    build_algo_config,
    check_cluster_resources,
    check_settings,
    ray_init_kwargs,
)
from rllib_ext.cli.presets import env_backend, log_preset
from rllib_ext.cli.progress import ProgressReporter
from rllib_ext.cli.ray_auth import init_ray
from rllib_ext.cli.runconfig import TrainSettings
from rllib_ext.cli.rundir import SETTINGS_JSON, RunPlan, plan_run
from rllib_ext.cli.runlog import RunLog, trim_after
from rllib_ext.cli.sinks import TrainResult, summary_table, write_summary
from rllib_ext.cli.tracking import tracker_callbacks
from rllib_ext.cli.watchdog import start_learner_watchdog

__all__ = [
    "Segment",
    "TrainResult",
    "build_algo_config",
    "check_settings",
    "env_steps_of",
    "episode_return_of",
    "ray_init_kwargs",
    "run_training_loop",
    "summary_table",
    "train",
]

logger = logging.getLogger("rllib_ext.cli")


def _log_settings(settings: TrainSettings, config: Any, init_kwargs: Mapping[str, Any]) -> None:
    ppo = {
        k: getattr(config, k)
        for k in (
            "lr",
            "train_batch_size",
            "minibatch_size",
            "num_epochs",
            "gamma",
            "lambda_",
            "vf_loss_coeff",
        )
    }
    logger.info(
        "settings: %s", {k: v for k, v in settings.to_dict().items() if v not in ({}, None)}
    )
    logger.info("PPO: %s", ppo)
    logger.info("ray.init: %s", dict(init_kwargs))


def train(
    settings: TrainSettings,
    *,
    progress: bool | None = None,
    config_cls: type | None = None,
    verbose: bool = True,
) -> TrainResult:
    """Runs ``rllib-ext train`` with resolved settings.

    Args:
        settings: from :func:`rllib_ext.cli.runconfig.resolve_settings`.
        progress: ``True`` bar, ``False`` log lines, ``None`` bar on a terminal only.
        config_cls: see :func:`build_algo_config`.
        verbose: ``False``: Ray's and RLlib's warnings are hidden (errors still show), see
            :func:`quiet_console`.

    Raises:
        CLIError: bad settings (checked before Ray starts).
    """
    started = time.perf_counter()
    quiet_ray = quiet_console(settings, verbose=verbose)
    if settings.seed is None:
        settings = dataclasses.replace(settings, seed=secrets.randbelow(2**31))
    check_settings(settings)
    config = build_algo_config(settings, config_cls=config_cls)
    log_preset(settings)  # "preset: NAME (why)"
    backend = env_backend(settings.env, settings.env_config)
    if backend is not None:
        logger.info(
            "env %s: backend %s, map %s%s",
            settings.env,
            backend,
            settings.env_config.get("map_name", "(default)"),
            f", preset {settings.preset}" if settings.preset else "",
        )
    plan = plan_run(settings)
    settings = dataclasses.replace(
        settings,
        run_dir=str(plan.run_dir),
        resume=str(plan.resume) if plan.resume else None,
    )
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    plan.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(plan.run_dir / SETTINGS_JSON, settings.to_dict())
    segment = Segment(base=plan.base, started=started)
    signals = Signals()
    with signals.installed():
        outcome = _run(settings, config, plan, segment, signals, progress, quiet_ray)
        signals.stopping()
        result = TrainResult(
            run_dir=plan.run_dir,
            checkpoint=outcome.checkpoint or plan.resume,
            episode_return_mean=episode_return_of(outcome.last_result or {}),
            env_steps=outcome.state.env_steps,
            iterations=outcome.state.iteration,
            wall_time_s=outcome.state.wall_time_s,
            train_time_s=outcome.state.train_time_s,
            stop_reason=outcome.stop_reason,
            settings=settings,
            win_rate=win_rate_of(outcome.last_result or {}),
            segments=outcome.state.segments,
            backend=backend,
        )
        write_summary(result)
    return result


def _run(
    settings: TrainSettings,
    config: Any,
    plan: RunPlan,
    segment: Segment,
    signals: Signals,
    progress: bool | None,
    quiet_ray: Mapping[str, Any],
) -> LoopOutcome:
    init_kwargs = {**ray_init_kwargs(settings), **quiet_ray}
    owns_ray = not ray.is_initialized()
    _log_settings(settings, config, init_kwargs if owns_ray else {"reused": True})
    algo = run_log = reporter = watchdog = None
    failure: CLIError | None = None
    try:
        if owns_ray:
            init_ray(init_kwargs)  # --address: under Ray's token auth (cli/ray_auth.py)
        signals.reclaim()
        check_cluster_resources(settings, ray.cluster_resources())
        segment.build_started = time.perf_counter()
        algo = config.build_algo()
        signals.reclaim()
        _drop_empty_tune_logdir(algo)
        if plan.resume is not None:
            algo.restore_from_path(str(plan.resume))
            logger.info("resumed from %s at iteration %d", plan.resume, algo.iteration)
            if plan.base.iteration != algo.iteration:  # a checkpoint without rllib_ext counters
                segment.base = dataclasses.replace(segment.base, iteration=int(algo.iteration))
        watchdog = start_learner_watchdog(algo, settings, plan.checkpoint_dir, signals)
        with signals.deferred():
            trim_after(plan.run_dir, segment.base.iteration if plan.continues_here else 0)
            run_log = RunLog(plan.run_dir, config.to_dict(), trackers=tracker_callbacks(settings))
        reporter = ProgressReporter(
            stop_reward=settings.stop_reward,
            stop_timesteps=settings.stop_timesteps,
            time_budget=settings.time_budget,
            initial_env_steps=segment.base.env_steps,
            enabled=progress,
        )
        redirect = contextlib.nullcontext()
        if reporter.uses_bar:
            redirect = logging_redirect_tqdm(loggers=[logger])
        with redirect:
            return run_training_loop(
                algo,
                settings,
                checkpoint_dir=plan.checkpoint_dir,
                run_log=run_log,
                progress=reporter,
                segment=segment,
                signals=signals,
            )
    except KeyboardInterrupt as exc:  # before the loop: nothing trained in this segment
        signals.stopping()
        reason = interrupt_reason(exc)
        logger.warning("%s before training started", reason)
        return LoopOutcome(None, reason, None, plan.base)
    except CLIError as exc:
        # Raised after the cleanup below: inside `finally` the error would still be "in
        # flight", and Ray's shutdown logging (exc_info=True) would print it as a traceback.
        failure = exc
    finally:
        signals.stopping()
        if reporter is not None:
            reporter.close()
        if run_log is not None:
            run_log.close()
        if watchdog is not None:  # before algo.stop(): stopped learners fall silent
            watchdog.stop()
        if algo is not None:
            algo.stop()
        if owns_ray:
            ray.shutdown()
    assert failure is not None  # every other path returned or raised above
    raise failure


_GPUTIL_HINT = "Install gputil for GPU system monitoring."


class _DropGPUtilHint(logging.Filter):
    """Drops Tune's GPUtil hint: ``UtilMonitor`` (RLlib's ``log_sys_usage``, on by default)
    gives it whenever GPUtil is missing, also on CPU runs, and still records CPU and RAM use
    (``perf`` in ``result.json``), which is why ``log_sys_usage`` stays on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _GPUTIL_HINT


def quiet_console(settings: TrainSettings, *, verbose: bool) -> dict[str, Any]:
    """Keeps Ray's and RLlib's warnings off the console unless ``verbose``; returns the
    ``ray.init`` arguments that do the same for Ray's side and its workers (``{}`` if verbose).

    Ray's loggers are ``"ray"`` (its level set by ``ray.init(logging_level=...)``) and
    ``"ray.rllib"`` (own handler; RLlib warns before ``ray.init`` while the config is built),
    both raised to ``ERROR`` in this process (the driver) for the rest of it, and in every
    worker by :func:`quiet_worker`, since Ray shows the workers' output on this console. With
    no GPU requested, the GPUtil hint is dropped even when ``verbose``: it only concerns GPUs.
    Ray, imported by this module, has set up its loggers already (which would reset these levels).
    """
    tune_util = logging.getLogger("ray.tune.utils.util")
    for old in [f for f in tune_util.filters if isinstance(f, _DropGPUtilHint)]:
        tune_util.removeFilter(old)
    if settings.num_gpus_per_learner == 0:
        tune_util.addFilter(_DropGPUtilHint())
    if verbose:
        return {}
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    return {
        "logging_level": logging.ERROR,
        "runtime_env": {"worker_process_setup_hook": f"{__name__}.quiet_worker"},
    }


def quiet_worker() -> None:
    """Ray's ``worker_process_setup_hook`` of a run without ``--verbose``: the driver's levels
    of :func:`quiet_console` in each worker process."""
    for name in ("ray", "ray.rllib"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _drop_empty_tune_logdir(algo: Any) -> None:
    """Removes the empty ``~/ray_results/<date>...`` directory every ``Algorithm`` creates.

    Outside Tune, RLlib's ``Trainable`` base makes a log directory under ``~/ray_results`` that
    nothing writes to; this run's results go to its run directory instead.
    """
    logdir = Path(algo.logdir)
    if logdir.parent == Path(DEFAULT_STORAGE_PATH) and logdir.is_dir():
        with contextlib.suppress(OSError):  # not empty, or already gone: leave it
            logdir.rmdir()
