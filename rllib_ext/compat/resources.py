"""The 2023 resource settings (``.resources(num_gpus=...)``, ``num_workers``...) on today's stack.

RLlib's new API stack has no total-GPU or total-CPU setting: resources are asked per actor
(``.learners(num_learners=, num_gpus_per_learner=)``, ``.env_runners(num_env_runners=,
num_cpus_per_env_runner=)``). This module holds the one mapping from the old names to those,
the request a config makes of Ray (the same bundles RLlib's ``Algorithm.default_resource_request``
builds), the check of that request against what Ray has, and the opt-in fitting of the request
to the machine (``RLLIB_EXT_FIT_RESOURCES=1``).

Mapping of ``.resources(num_gpus=N)``:

* ``N == 0``: the local learner on CPU (``num_learners=0, num_gpus_per_learner=0``);
* ``0 < N <= 1``: the local learner (in the main process) on ``N`` GPU
  (``num_learners=0, num_gpus_per_learner=N``);
* integer ``N >= 2``: ``N`` learner actors with one GPU each (``num_learners=N,
  num_gpus_per_learner=1``), gradients averaged by DDP.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.util import log_once

__all__ = [
    "FIT_RESOURCES_ENV",
    "Machine",
    "ResourceRequest",
    "check_request",
    "fit_resources_enabled",
    "fit_to_machine",
    "learners_for_num_gpus",
    "machine",
    "resource_request",
]

logger = logging.getLogger("rllib_ext.compat")

FIT_RESOURCES_ENV = "RLLIB_EXT_FIT_RESOURCES"
"""Set to ``1`` to scale a config's resource request down to the machine (or Ray cluster)."""


def fit_resources_enabled() -> bool:
    """True when ``RLLIB_EXT_FIT_RESOURCES`` is ``1``/``true``/``yes``."""
    return os.environ.get(FIT_RESOURCES_ENV, "").strip().lower() in ("1", "true", "yes")


def learners_for_num_gpus(num_gpus: Any) -> dict[str, Any]:
    """The ``.learners()`` keywords that the old ``.resources(num_gpus=N)`` means today.

    Raises:
        ValueError: for a negative or a fractional ``N > 1``.
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0:
        raise ValueError(
            f"num_gpus={num_gpus!r} is not a GPU count; allowed: 0, a fraction up to 1, or an "
            "integer >= 2. Fix: e.g. .resources(num_gpus=1)."
        )
    if num_gpus <= 1:
        return {"num_learners": 0, "num_gpus_per_learner": num_gpus}
    if float(num_gpus) != int(num_gpus):
        raise ValueError(
            f"num_gpus={num_gpus!r}: more than one GPU must be a whole number (one learner per "
            "GPU). Fix: .resources(num_gpus=2) or .learners(num_learners=K, "
            "num_gpus_per_learner=F)."
        )
    return {"num_learners": int(num_gpus), "num_gpus_per_learner": 1}


@dataclass(frozen=True)
class ResourceRequest:
    """What a config asks of Ray, in Ray's units (CPU/GPU may be fractional)."""

    main_cpu: float
    main_gpu: float
    env_runner_cpu: float
    env_runner_gpu: float
    learner_cpu: float
    learner_gpu: float
    parts: dict[str, str] = field(default_factory=dict, compare=False)
    """A readable breakdown, e.g. ``{"env runners": "6 x 1 CPU"}``."""

    def cpu(self, *, include_main: bool = True) -> float:
        return self.env_runner_cpu + self.learner_cpu + (self.main_cpu if include_main else 0.0)

    def gpu(self, *, include_main: bool = True) -> float:
        return self.env_runner_gpu + self.learner_gpu + (self.main_gpu if include_main else 0.0)

    def as_tune_resources(self) -> dict[str, float]:
        """The whole request as Tune's ``resources_per_trial`` dict (``{"cpu": .., "gpu": ..}``)."""
        return {"cpu": self.cpu(), "gpu": self.gpu()}

    def describe(self, *, include_main: bool = True) -> str:
        items = [f"{k}: {v}" for k, v in self.parts.items() if include_main or k != "main process"]
        return (
            f"{_num(self.cpu(include_main=include_main))} CPUs and "
            f"{_num(self.gpu(include_main=include_main))} GPUs ({'; '.join(items)})"
        )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _fmt(x: Any) -> str:
    return _num(x) if isinstance(x, (int, float)) else repr(x)


def _cpus_per_learner(config: Any) -> float:
    # RLlib's "auto": one CPU for a CPU learner, none beside a GPU.
    if config.num_cpus_per_learner != "auto":
        return float(config.num_cpus_per_learner)
    return 1.0 if config.num_gpus_per_learner == 0 else 0.0


def resource_request(config: Any) -> ResourceRequest:
    """The resources ``config`` makes Ray reserve: main process, env runners, learners.

    The same bundles as RLlib's ``Algorithm.default_resource_request`` (evaluation env runners
    and aggregator actors aside), which a test compares against.
    """
    n_runners = int(config.num_env_runners)
    n_learners = int(config.num_learners)
    gpl = float(config.num_gpus_per_learner)
    cpl = _cpus_per_learner(config)
    if n_learners == 0:
        main_cpu = max(cpl, float(config.num_cpus_for_main_process))
        main_gpu = gpl
        learners = f"the local learner in the main process{f' on {_num(gpl)} GPU' if gpl else ''}"
    else:
        main_cpu, main_gpu = float(config.num_cpus_for_main_process), 0.0
        learners = f"{n_learners} x ({_num(cpl)} CPU, {_num(gpl)} GPU)"
    cpr, gpr = float(config.num_cpus_per_env_runner), float(config.num_gpus_per_env_runner)
    runners = f"{n_runners} x ({_num(cpr)} CPU, {_num(gpr)} GPU)"
    return ResourceRequest(
        main_cpu=main_cpu,
        main_gpu=main_gpu,
        env_runner_cpu=n_runners * cpr,
        env_runner_gpu=n_runners * gpr,
        learner_cpu=n_learners * cpl,
        learner_gpu=n_learners * gpl,
        parts={
            "main process": f"{_num(main_cpu)} CPU, {_num(main_gpu)} GPU",
            "env runners": runners,
            "learners": learners,
        },
    )


@dataclass(frozen=True)
class Machine:
    """The CPUs/GPUs a run can get: the Ray cluster's totals, or this machine's before ``ray.init``."""

    cpu: float
    gpu: float
    where: str


def machine() -> Machine:
    """The running Ray cluster's resources, else this machine's (what ``ray.init()`` would see)."""
    if ray.is_initialized():
        total = ray.cluster_resources()
        return Machine(
            cpu=float(total.get("CPU", 0)), gpu=float(total.get("GPU", 0)), where="this Ray cluster"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Machine(cpu=float(os.cpu_count() or 1), gpu=float(gpus), where="this machine")


def check_request(config: Any, *, include_main: bool, have: Machine | None = None) -> None:
    """Raises one line when ``config`` asks for more CPUs/GPUs than ``have`` holds.

    Args:
        include_main: count the main process's bundle (Tune reserves it; a plain
            ``build_algo()`` runs it in the driver, outside Ray's accounting, but a local
            learner's GPU is always counted).

    Raises:
        ValueError: what was asked, what exists and the flag that scales it; Ray would
            otherwise wait for the missing resources forever.
    """
    have = have or machine()
    req = resource_request(config)
    cpu = req.cpu(include_main=include_main)
    gpu = req.gpu(include_main=include_main) + (0.0 if include_main else req.main_gpu)
    if cpu <= have.cpu + 1e-9 and gpu <= have.gpu + 1e-9:
        return
    raise ValueError(
        f"This config asks for {_num(cpu)} CPUs and {_num(gpu)} GPUs "
        f"({'; '.join(f'{k}: {v}' for k, v in req.parts.items())}) but {have.where} has "
        f"{_num(have.cpu)} CPUs and {_num(have.gpu)} GPUs, so Ray would wait for them forever. "
        f"Fix: set {FIT_RESOURCES_ENV}=1 to scale the request to this machine, or lower "
        ".env_runners(num_env_runners=...) / .learners(num_learners=..., num_gpus_per_learner=...)."
    )


def fit_to_machine(config: Any, *, have: Machine | None = None) -> dict[str, Any]:
    """Scales ``config``'s learners and env runners down to ``have`` (never up); idempotent.

    Rules: learners that want more GPUs than exist become the local learner (on the one GPU, or
    on CPU); CPU learners are cut to the CPUs left after the main process; env runners take the
    CPUs that are left, where one would be left it samples in the main process instead (0 env
    runners); env runners' GPUs are
    dropped when they do not fit; the tutorial's ``communication_type="nccl"`` becomes
    ``"gloo"`` (what RLlib runs between CPU learners). One CPU always stays with the main process.

    Returns:
        The changed settings, ``{name: (old, new)}`` (empty when the config already fits).
        The changes are applied through RLlib's own ``.learners()`` / ``.env_runners()``.
    """
    have = have or machine()
    changes: dict[str, Any] = {}
    n_learners, gpl = int(config.num_learners), float(config.num_gpus_per_learner)
    learner_gpus = gpl * max(n_learners, 1)
    if learner_gpus > have.gpu + 1e-9:
        new_n: int
        new_gpl: float
        if have.gpu < 1e-9:
            new_n, new_gpl = 0, 0
        elif have.gpu < 2 or gpl > have.gpu:
            new_n, new_gpl = 0, min(gpl, 1.0, have.gpu)
        else:
            new_n, new_gpl = int(have.gpu // gpl), gpl
        if new_n != n_learners:
            changes["num_learners"] = (n_learners, new_n)
        changes["num_gpus_per_learner"] = (gpl, new_gpl)
        n_learners, gpl = new_n, new_gpl
    main_cpu = max(float(config.num_cpus_for_main_process), 1.0)
    cpl = (
        float(config.num_cpus_per_learner)
        if config.num_cpus_per_learner != "auto"
        else (1.0 if gpl == 0 else 0.0)
    )
    if n_learners and cpl and main_cpu + n_learners * cpl > have.cpu:
        fit = int((have.cpu - main_cpu) // cpl)
        new_n = fit if fit >= 2 else 0  # one remote learner is no faster than the local one
        changes["num_learners"] = (changes.get("num_learners", (n_learners,))[0], new_n)
        n_learners = new_n
    gpu_left = have.gpu - gpl * max(n_learners, 1) * (1 if gpl else 0)
    n_runners, cpr = int(config.num_env_runners), float(config.num_cpus_per_env_runner)
    gpr = float(config.num_gpus_per_env_runner)
    if gpr and n_runners * gpr > gpu_left + 1e-9:
        changes["num_gpus_per_env_runner"] = (gpr, 0)
    cpu_left = have.cpu - main_cpu - n_learners * cpl
    max_runners = max(0, int(math.floor(cpu_left / cpr))) if cpr > 0 else n_runners
    if max_runners == 1:
        # One remote env runner samples no faster than the main process (RLLIB_NOTES §7), and
        # only a remote one can time out (sample_timeout_s) while a slow env compiles.
        max_runners = 0
    if n_runners > max_runners:
        changes["num_env_runners"] = (n_runners, max_runners)
    learner_keys = ("num_learners", "num_gpus_per_learner")
    if any(k in changes for k in learner_keys):
        AlgorithmConfig.learners(config, **{k: changes[k][1] for k in learner_keys if k in changes})
    runner_keys = ("num_env_runners", "num_gpus_per_env_runner")
    if any(k in changes for k in runner_keys):
        AlgorithmConfig.env_runners(
            config, **{k: changes[k][1] for k in runner_keys if k in changes}
        )
    if getattr(config, "communication_type", None) == "nccl" and gpl == 0:
        # NCCL only runs between GPUs; RLlib's learner group uses gloo for CPU learners.
        config.communication_type = "gloo"
        changes["communication_type"] = ("nccl", "gloo")
    if changes:
        summary = ", ".join(f"{k} {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in changes.items())
        if log_once(f"rllib_ext_fit_{summary}_{have}"):
            logger.warning(
                "%s=1: scaled the resource request to %s (%s CPUs, %s GPUs): %s.",
                FIT_RESOURCES_ENV,
                have.where,
                _num(have.cpu),
                _num(have.gpu),
                summary,
            )
    return changes
