"""``rllib-ext train``: PPO with ``rllib_ext.PPOConfig``, ``build_algo()`` and an ``algo.train()``
loop until a stop criterion; checkpoints (:mod:`~rllib_ext.cli.checkpoints`), Tune-format
metrics (:mod:`~rllib_ext.cli.runlog`) and a summary under the run directory.

A run survives any kill: ``--resume RUN_DIR`` continues from the newest complete checkpoint,
and SIGTERM / Ctrl-C stop it with a final checkpoint (:mod:`~rllib_ext.cli.interrupts`).

:func:`train` is the whole command and is what ``benchmarks/train_cartpole.py`` times.
It accepts an already-initialized Ray (tests, notebooks) and leaves it running; a Ray it
started itself is shut down at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllib_ext.cli.checkpoints import RunState, commit_checkpoint, write_json_atomic
from rllib_ext.cli.interrupts import RunInterrupted, Signals
from rllib_ext.cli.progress import IterationStats, ProgressReporter
from rllib_ext.cli.runconfig import DEFAULT_TRAINING, CLIError, TrainSettings
from rllib_ext.cli.rundir import SETTINGS_JSON, RunPlan, plan_run
from rllib_ext.cli.runlog import RunLog, trim_after
from rllib_ext.cli.sinks import TrainResult, summary_table, write_summary

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

RETURN_KEY = "env_runners/episode_return_mean"


def check_settings(settings: TrainSettings) -> None:
    """Everything that can be checked before ``ray.init``.

    Raises:
        CLIError: unknown env, env_config the env rejects, GPUs requested without CUDA,
            or PPO settings RLlib rejects.
    """
    from rllib_ext.cli.envs import check_env
    from rllib_ext.cli.inputs import check_inputs

    check_inputs(settings)
    check_env(settings.env, settings.env_config)
    if settings.num_gpus_per_learner > 0 and settings.address is None:
        import torch

        if not torch.cuda.is_available():
            raise CLIError(
                f"--num-gpus-per-learner {settings.num_gpus_per_learner:g} but no CUDA device is "
                "visible (torch.cuda.is_available() is False). Fix: drop the flag (CPU learner), "
                "run on a GPU machine, or join a GPU cluster with --address."
            )
    try:
        build_algo_config(settings).validate()
    except ValueError as exc:
        raise CLIError(f"PPO rejected the settings: {exc}") from None


def build_algo_config(settings: TrainSettings, *, config_cls: type | None = None) -> Any:
    """The PPO config ``rllib-ext train`` runs.

    Args:
        config_cls: ``rllib_ext.PPOConfig`` (default) or RLlib's own ``PPOConfig`` (benchmark);
            extension flags are only passed to rllib_ext's class.

    Raises:
        CLIError: a ``--training`` key or value that RLlib or rllib_ext rejects.
    """
    from rllib_ext.config import PPOConfig

    config_cls = config_cls or PPOConfig
    training = {**DEFAULT_TRAINING, **settings.training}
    if issubclass(config_cls, PPOConfig):
        training.update(settings.extensions)
    try:
        config = (
            config_cls()
            .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
            .environment(settings.env, env_config=dict(settings.env_config))
            .env_runners(
                num_env_runners=settings.num_env_runners,
                num_envs_per_env_runner=settings.num_envs_per_env_runner,
            )
            .learners(
                num_learners=settings.num_learners,
                num_gpus_per_learner=settings.num_gpus_per_learner,
            )
            .training(**training)
            .debugging(seed=settings.seed)
        )
        if settings.model_config:
            config.rl_module(model_config=dict(settings.model_config))
    except (TypeError, ValueError) as exc:
        raise CLIError(f"PPO rejected the settings: {exc}") from None
    if issubclass(config_cls, PPOConfig):
        from rllib_ext.cli.envs import configure_env

        configure_env(config, settings)
    return config


def ray_init_kwargs(settings: TrainSettings) -> dict[str, Any]:
    """``ray.init`` arguments sized to what the config asks Ray for.

    The algorithm itself and a local learner (``num_learners=0``) live in the driver and take
    no Ray CPU; each EnvRunner and each remote Learner actor takes one logical CPU.
    """
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
    if settings.address is not None:
        return {"address": settings.address, **kwargs}
    needed = settings.num_env_runners + settings.num_learners
    # "local": a new Ray even when /tmp/ray/ray_current_cluster names another (or a dead)
    # cluster, which a bare ray.init() would join (and refuse num_cpus for).
    return {"address": "local", "num_cpus": max(1, needed), "include_dashboard": False, **kwargs}


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
    """``env_runners/win_rate`` (SMAC envs, :class:`rllib_ext.envs.smac.SMACMetricsCallback`)."""
    value = result.get("env_runners", {}).get("win_rate")
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
class _LoopOutcome:
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
) -> _LoopOutcome:
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
        return commit_checkpoint(algo, checkpoint_dir, settings=settings.to_dict(), state=state)

    try:
        while True:
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
        reason = _interrupt_reason(exc)
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
    return _LoopOutcome(result, reason, checkpoint, state)


def _interrupt_reason(exc: BaseException) -> str:
    if isinstance(exc, RunInterrupted) and exc.signum == signal.SIGTERM:
        return "terminated"
    return "interrupted"


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
) -> TrainResult:
    """Runs ``rllib-ext train`` with resolved settings.

    Args:
        settings: from :func:`rllib_ext.cli.runconfig.resolve_settings`.
        progress: ``True`` bar, ``False`` log lines, ``None`` bar on a terminal only.
        config_cls: see :func:`build_algo_config`.

    Raises:
        CLIError: bad settings (checked before Ray starts).
    """
    started = time.perf_counter()
    if settings.seed is None:
        settings = dataclasses.replace(settings, seed=secrets.randbelow(2**31))
    check_settings(settings)
    config = build_algo_config(settings, config_cls=config_cls)
    from rllib_ext.cli.presets import env_backend

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
        outcome = _run(settings, config, plan, segment, signals, progress)
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
) -> _LoopOutcome:
    import ray

    init_kwargs = ray_init_kwargs(settings)
    owns_ray = not ray.is_initialized()
    _log_settings(settings, config, init_kwargs if owns_ray else {"reused": True})
    algo = run_log = reporter = watchdog = None
    try:
        if owns_ray:
            ray.init(**init_kwargs)
        signals.reclaim()
        segment.build_started = time.perf_counter()
        algo = config.build_algo()
        signals.reclaim()
        _drop_empty_tune_logdir(algo)
        if plan.resume is not None:
            algo.restore_from_path(str(plan.resume))
            logger.info("resumed from %s at iteration %d", plan.resume, algo.iteration)
            if plan.base.iteration != algo.iteration:  # a checkpoint without rllib_ext counters
                segment.base = dataclasses.replace(segment.base, iteration=int(algo.iteration))
        from rllib_ext.cli.watchdog import start_learner_watchdog

        watchdog = start_learner_watchdog(algo, settings, plan.checkpoint_dir, signals)
        with signals.deferred():
            trim_after(plan.run_dir, segment.base.iteration if plan.continues_here else 0)
            run_log = RunLog(plan.run_dir, config.to_dict())
        reporter = ProgressReporter(
            stop_reward=settings.stop_reward,
            stop_timesteps=settings.stop_timesteps,
            time_budget=settings.time_budget,
            initial_env_steps=segment.base.env_steps,
            enabled=progress,
        )
        redirect = contextlib.nullcontext()
        if reporter.uses_bar:
            from tqdm.contrib.logging import logging_redirect_tqdm

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
        reason = _interrupt_reason(exc)
        logger.warning("%s before training started", reason)
        return _LoopOutcome(None, reason, None, plan.base)
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


def _drop_empty_tune_logdir(algo: Any) -> None:
    """Removes the empty ``~/ray_results/<date>...`` directory every ``Algorithm`` creates.

    Outside Tune, RLlib's ``Trainable`` base makes a log directory under ``~/ray_results`` that
    nothing writes to; this run's results go to its run directory instead.
    """
    from ray.train.constants import DEFAULT_STORAGE_PATH

    logdir = Path(algo.logdir)
    if logdir.parent == Path(DEFAULT_STORAGE_PATH) and logdir.is_dir():
        with contextlib.suppress(OSError):  # not empty, or already gone: leave it
            logdir.rmdir()
