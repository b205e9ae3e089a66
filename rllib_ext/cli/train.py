"""``rllib-ext train``: PPO with ``rllib_ext.PPOConfig``, ``build_algo()`` and an ``algo.train()``
loop until a stop criterion; checkpoints, metrics and a summary under the run directory.

:func:`train` is the whole command and is what ``benchmarks/train_cartpole.py`` times.
It accepts an already-initialized Ray (tests, notebooks) and leaves it running; a Ray it
started itself is shut down at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rllib_ext.cli.progress import IterationStats, ProgressReporter
from rllib_ext.cli.runconfig import DEFAULT_TRAINING, SETTINGS_FILE, CLIError, TrainSettings
from rllib_ext.cli.sinks import MetricsWriter, flatten_metrics, format_summary, write_json

__all__ = [
    "TrainResult",
    "build_algo_config",
    "check_settings",
    "env_steps_of",
    "episode_return_of",
    "ray_init_kwargs",
    "run_training_loop",
    "train",
]

logger = logging.getLogger("rllib_ext.cli")

RETURN_KEY = "env_runners/episode_return_mean"


@dataclass
class TrainResult:
    """What one ``rllib-ext train`` run ended with (also written to ``summary.json``)."""

    run_dir: Path
    checkpoint: Path | None
    episode_return_mean: float
    env_steps: int
    iterations: int
    wall_time_s: float
    """From the start of :func:`train` (Ray start-up included) to the end."""
    train_time_s: float
    """From ``build_algo()`` to the iteration that met the stop criterion."""
    stop_reason: str
    """``stop_reward``, ``stop_timesteps``, ``time_budget`` or ``interrupted``."""
    settings: TrainSettings
    win_rate: float | None = None
    """SMAC envs: ``env_runners/win_rate`` of the last iteration (``None`` otherwise)."""
    backend: str | None = None
    """SMAC envs: the backend that ran (``smacv2``, ``smac`` or ``smax``); ``None`` otherwise."""

    @property
    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"


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
    return {"num_cpus": max(1, needed), "include_dashboard": False, **kwargs}


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


def _default_run_dir(env: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env).strip("_") or "env"
    base = Path("rllib_ext_runs") / f"{name}_{datetime.now():%Y%m%d-%H%M%S}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}_{n}")
    return path


def _save_checkpoint(algo: Any, checkpoint_dir: Path, settings: TrainSettings) -> Path:
    path = (checkpoint_dir / f"iter_{int(algo.iteration):06d}").resolve()
    algo.save_to_path(str(path))
    write_json(path / SETTINGS_FILE, settings.to_dict())
    logger.info("checkpoint saved: %s", path)
    return path


@dataclass
class _LoopOutcome:
    last_result: Mapping[str, Any] | None
    stop_reason: str
    checkpoint: Path | None
    stopped_at: float


def run_training_loop(
    algo: Any,
    settings: TrainSettings,
    *,
    checkpoint_dir: Path,
    writer: MetricsWriter,
    progress: ProgressReporter,
    started: float,
) -> _LoopOutcome:
    """Calls ``algo.train()`` until a stop criterion or Ctrl-C, then saves a final checkpoint.

    ``started`` is the ``time.perf_counter()`` the time budget counts from. On Ctrl-C
    (``KeyboardInterrupt``) the loop stops at once and the final checkpoint is still written.
    """
    result: Mapping[str, Any] | None = None
    checkpoint: Path | None = None
    saved_iteration: int | None = None
    reason = "interrupted"
    try:
        while True:
            result = algo.train()
            elapsed = time.perf_counter() - started
            steps = env_steps_of(result)
            episode_return = episode_return_of(result)
            metrics = flatten_metrics(result)
            metrics["wall_time_s"] = elapsed
            writer.write(metrics, step=steps)
            iteration_s = float(result.get("time_this_iter_s") or 0.0)
            new_steps = _iteration_env_steps(result, progress)
            progress.update(
                IterationStats(
                    iteration=int(result.get("training_iteration", algo.iteration)),
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
                checkpoint = _save_checkpoint(algo, checkpoint_dir, settings)
                saved_iteration = algo.iteration
    except KeyboardInterrupt:
        progress.close()
        logger.warning("interrupted: saving a checkpoint before exit (Ctrl-C again aborts it)")
    stopped_at = time.perf_counter()
    if saved_iteration != algo.iteration and algo.iteration > 0:
        checkpoint = _save_checkpoint(algo, checkpoint_dir, settings)
    return _LoopOutcome(result, reason, checkpoint, stopped_at)


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
    run_dir = Path(settings.run_dir) if settings.run_dir else _default_run_dir(settings.env)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(settings, run_dir=str(run_dir))
    checkpoint_dir = Path(settings.checkpoint_dir or run_dir / "checkpoints")
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "settings.json", settings.to_dict())

    import ray

    init_kwargs = ray_init_kwargs(settings)
    owns_ray = not ray.is_initialized()
    _log_settings(settings, config, init_kwargs if owns_ray else {"reused": True})
    if owns_ray:
        ray.init(**init_kwargs)
    writer = MetricsWriter(run_dir)
    algo = None
    try:
        build_started = time.perf_counter()
        algo = config.build_algo()
        if settings.resume:
            algo.restore_from_path(str(Path(settings.resume).resolve()))
            logger.info("resumed from %s at iteration %d", settings.resume, algo.iteration)
        reporter = ProgressReporter(
            stop_reward=settings.stop_reward,
            stop_timesteps=settings.stop_timesteps,
            time_budget=settings.time_budget,
            enabled=progress,
        )
        redirect = contextlib.nullcontext()
        if reporter.uses_bar:
            from tqdm.contrib.logging import logging_redirect_tqdm

            redirect = logging_redirect_tqdm(loggers=[logger])
        with redirect:
            outcome = run_training_loop(
                algo,
                settings,
                checkpoint_dir=checkpoint_dir,
                writer=writer,
                progress=reporter,
                started=started,
            )
        reporter.close()
    finally:
        writer.close()
        if algo is not None:
            algo.stop()
        if owns_ray:
            ray.shutdown()
    last = outcome.last_result or {}
    result = TrainResult(
        run_dir=run_dir,
        checkpoint=outcome.checkpoint,
        episode_return_mean=episode_return_of(last),
        env_steps=env_steps_of(last) if last else 0,
        iterations=int(last.get("training_iteration", 0)),
        wall_time_s=time.perf_counter() - started,
        train_time_s=outcome.stopped_at - build_started,
        stop_reason=outcome.stop_reason,
        settings=settings,
        win_rate=win_rate_of(last),
        backend=backend,
    )
    _write_summary(result, config)
    return result


def _write_summary(result: TrainResult, config: Any) -> None:
    import ray

    from rllib_ext import __version__

    summary = {
        "episode_return_mean": result.episode_return_mean,
        "win_rate": result.win_rate,
        "backend": result.backend,
        "env_steps": result.env_steps,
        "iterations": result.iterations,
        "wall_time_s": round(result.wall_time_s, 3),
        "train_time_s": round(result.train_time_s, 3),
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "stop_reason": result.stop_reason,
        "settings": result.settings.to_dict(),
        "ppo": {**DEFAULT_TRAINING, **result.settings.training},
        "versions": {"rllib_ext": __version__, "ray": ray.__version__},
    }
    write_json(result.run_dir / "summary.json", summary)


_STOP_TEXT = {
    "stop_reward": "reached --stop-reward",
    "stop_win_rate": "reached --stop-win-rate",
    "stop_timesteps": "reached --stop-timesteps",
    "time_budget": "used up --time-budget",
    "interrupted": "interrupted (Ctrl-C)",
}


def summary_table(result: TrainResult) -> str:
    """The table ``rllib-ext train`` prints at the end."""
    title = f"rllib-ext train: {result.settings.env}, {_STOP_TEXT[result.stop_reason]}"
    return format_summary(
        [
            ("episode_return_mean", result.episode_return_mean),
            *([("win_rate", result.win_rate)] if result.win_rate is not None else []),
            *([("backend", result.backend)] if result.backend is not None else []),
            ("env_steps", result.env_steps),
            ("iterations", result.iterations),
            ("train_time_s", result.train_time_s),
            ("wall_time_s", result.wall_time_s),
            ("checkpoint", result.checkpoint),
            ("run_dir", result.run_dir),
            ("summary", result.run_dir / "summary.json"),
        ],
        title=title,
    )
