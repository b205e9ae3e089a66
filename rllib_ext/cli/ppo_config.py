"""The RLlib side of ``rllib-ext train`` settings: the PPO config, the checks that run
before ``ray.init`` and the ``ray.init`` arguments.
"""

from __future__ import annotations

import logging
from typing import Any

from rllib_ext.cli.envs import check_env, configure_env
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.inputs import check_inputs
from rllib_ext.cli.runconfig import DEFAULT_TRAINING, TrainSettings
from rllib_ext.cli.tracking import check_tracking, load_callbacks

__all__ = [
    "build_algo_config",
    "check_cluster_resources",
    "check_settings",
    "custom_resources_needed",
    "ray_init_kwargs",
]


def check_settings(settings: TrainSettings) -> None:
    """Everything that can be checked before ``ray.init``.

    Raises:
        CLIError: unknown env, env_config the env rejects, GPUs requested without CUDA,
            or PPO settings RLlib rejects.
    """
    check_inputs(settings)
    check_env(settings.env, settings.env_config)
    check_tracking(settings)
    if settings.num_gpus_per_learner > 0 and settings.address is None:
        import torch  # lazy: keeps torch out of --help

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


COMPAT_TRAINING_KEYS = ("communication_type", "model")
"""``training`` keys (after the old names are resolved) that only the 2023 layer reads: the
tutorial's ``communication={"type": ...}`` and its ``model={...}`` dict. A run with one of them
is built on ``rllib_ext.compat.PPOConfig``."""


def build_algo_config(settings: TrainSettings, *, config_cls: type | None = None) -> Any:
    """The PPO config ``rllib-ext train`` runs.

    Args:
        config_cls: ``rllib_ext.PPOConfig`` (default; ``rllib_ext.compat.PPOConfig`` where
            ``--training`` holds a key of :data:`COMPAT_TRAINING_KEYS`) or RLlib's own
            ``PPOConfig`` (benchmark); extension flags are only passed to rllib_ext's classes.

    Raises:
        CLIError: a ``--training`` key or value that RLlib or rllib_ext rejects.
    """
    from rllib_ext.config import PPOConfig  # lazy: keeps Ray out of --help

    if config_cls is None:
        config_cls = PPOConfig
        if any(key in settings.training for key in COMPAT_TRAINING_KEYS):
            from rllib_ext import compat  # lazy: keeps Ray out of --help

            config_cls = compat.PPOConfig
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
                custom_resources_per_env_runner=dict(settings.custom_resources_per_env_runner),
            )
            .learners(
                num_learners=settings.num_learners,
                num_gpus_per_learner=settings.num_gpus_per_learner,
                custom_resources_per_learner=dict(settings.custom_resources_per_learner),
            )
            .training(**training)
            .debugging(seed=settings.seed)
        )
        if settings.model_config:
            config.rl_module(model_config=dict(settings.model_config))
    except (TypeError, ValueError) as exc:
        raise CLIError(f"PPO rejected the settings: {exc}") from None
    if issubclass(config_cls, PPOConfig):
        configure_env(config, settings)
    if settings.callbacks:
        from rllib_ext.callbacks import add_callback  # lazy: keeps Ray out of --help

        for callback in load_callbacks(settings.callbacks):
            add_callback(config, callback)
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
    resources = custom_resources_needed(settings)
    if resources:  # a local Ray has exactly what the actors ask for
        kwargs["resources"] = resources
    # "local": a new Ray even when /tmp/ray/ray_current_cluster names another (or a dead)
    # cluster, which a bare ray.init() would join (and refuse num_cpus for).
    return {"address": "local", "num_cpus": max(1, needed), "include_dashboard": False, **kwargs}


def custom_resources_needed(settings: TrainSettings) -> dict[str, float]:
    """The custom Ray resources all remote learners and env runners ask for together.

    Learners (env runners) in the driver, ``--num-learners 0`` (``--num-env-runners 0``), are
    no Ray actors and ask for nothing.
    """
    total: dict[str, float] = {}
    for count, per_actor in (
        (settings.num_learners, settings.custom_resources_per_learner),
        (settings.num_env_runners, settings.custom_resources_per_env_runner),
    ):
        for name, amount in per_actor.items():
            total[name] = total.get(name, 0.0) + count * amount
    return {name: amount for name, amount in total.items() if amount > 0}


def check_cluster_resources(settings: TrainSettings, available: dict[str, float]) -> None:
    """Fails in one line when the Ray cluster lacks a custom resource the actors ask for.

    RLlib would otherwise wait forever for actors that no node can host.

    Args:
        available: ``ray.cluster_resources()`` of the joined cluster.

    Raises:
        CLIError: a resource the cluster has less of than the actors need in total.
    """
    for name, needed in custom_resources_needed(settings).items():
        have = float(available.get(name, 0.0))
        if have < needed:
            raise CLIError(
                f"the actors ask for {needed:g} of the custom resource {name!r} "
                "(--custom-resources-per-learner/--custom-resources-per-env-runner times "
                f"--num-learners/--num-env-runners) but the Ray cluster has {have:g}. Fix: start "
                f"nodes with e.g. ray start --address ADDRESS --resources '{{\"{name}\": 1}}', or "
                "lower the counts."
            )
