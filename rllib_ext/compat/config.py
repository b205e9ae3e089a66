"""The 2023 config API of :class:`rllib_ext.compat.PPOConfig`, mapped onto RLlib's new API stack.

:class:`LegacyAPIMixin` sits in ``rllib_ext.compat.PPOConfig``'s bases before
:class:`rllib_ext.PPOConfig`:

* ``.rollouts(num_rollout_workers=, num_envs_per_worker=, rollout_fragment_length=,
  batch_mode=)`` -> ``.env_runners(num_env_runners=, num_envs_per_env_runner=, ...)``;
* ``.resources(num_gpus=, num_cpus=, num_gpus_per_worker=, num_cpus_per_worker=,
  placement_strategy=)`` -> ``.learners(...)`` / ``.env_runners(...)`` (mapping in
  :mod:`rllib_ext.compat.resources`, logged once);
* old top-level dict keys in ``from_dict`` / ``update_from_dict`` (what Tune hands the ``PPO``
  trainable): ``num_workers``, ``num_gpus``, ``num_cpus_per_worker``, ``num_gpus_per_worker``,
  ``num_envs_per_worker``, ``horizon``, ``"training": {...}``, ``"communication": {...}``,
  ``"model"`` and the ``.training()`` aliases (``num_sgd_iter``...); the training keys go through
  ``.training()``, where the aliases live (:mod:`rllib_ext.settings`);
* ``communication={"type": "NCCL", ...}``: the type is kept as :attr:`LegacyAPIMixin.communication_type`
  and checked against the learners' resources by ``validate()``; it chooses nothing, RLlib picks
  NCCL between GPU learners and gloo between CPU learners;
* ``policy_mapping_fn=lambda agent_id: ...`` (one argument, as RLlib 1.x called it);
* :attr:`resources_total`: what the run asks of Ray, in Tune's ``resources_per_trial`` form;
* the old result names (``episode_reward_mean``...) via ``callbacks_on_train_result``.

With ``RLLIB_EXT_FIT_RESOURCES=1`` every resource setting is scaled to the machine when it is
set; without it, ``validate()`` (once Ray runs) raises one line naming what was asked and
what exists instead of letting Ray wait forever.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ray
from ray.rllib.algorithms.algorithm_config import DEPRECATED_VALUE, AlgorithmConfig, NotProvided
from ray.rllib.utils.annotations import override
from ray.util import log_once

from rllib_ext.compat.metrics import legacy_metrics_on_train_result
from rllib_ext.compat.resources import (
    check_request,
    fit_resources_enabled,
    fit_to_machine,
    learners_for_num_gpus,
    resource_request,
)
from rllib_ext.compat.training_kwargs import TRAINING_ALIASES, check_communication_type

__all__ = ["AgentIdMapping", "LegacyAPIMixin"]

logger = logging.getLogger("rllib_ext.compat")

# Old `.rollouts()` / top-level dict names -> today's `.env_runners()` names.
ROLLOUT_RENAMES: dict[str, str] = {
    "num_rollout_workers": "num_env_runners",
    "num_workers": "num_env_runners",
    "num_envs_per_worker": "num_envs_per_env_runner",
    "num_cpus_per_worker": "num_cpus_per_env_runner",
    "num_gpus_per_worker": "num_gpus_per_env_runner",
}


def _log_mapping(old: str, new: str) -> None:
    if log_once(f"rllib_ext_compat_{old}"):
        logger.warning("2023 API: %s -> %s", old, new)


def _keyword_names(method: Callable[..., Any]) -> frozenset[str]:
    params = inspect.signature(method).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


_ENV_RUNNER_KEYS = _keyword_names(AlgorithmConfig.env_runners) - set(ROLLOUT_RENAMES)


class AgentIdMapping:
    """Adapts a one-argument ``policy_mapping_fn(agent_id)`` to ``fn(agent_id, episode, **kw)``."""

    def __init__(self, fn: Callable[[Any], str]) -> None:
        self.fn = fn

    def __call__(self, agent_id: Any, *args: Any, **kwargs: Any) -> str:
        return self.fn(agent_id)


def _takes_only_agent_id(fn: Any) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.VAR_KEYWORD in kinds:
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 1


if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig as _ConfigBase
else:
    _ConfigBase = object


class LegacyAPIMixin(_ConfigBase):
    """The 2023 API for an RLlib ``AlgorithmConfig`` subclass (``rllib_ext.compat.PPOConfig``)."""

    callbacks_on_train_result: Any
    """RLlib's attribute (set in ``AlgorithmConfig.__init__``), declared for the type checker."""

    communication_type: str | None
    """The tutorial's ``communication={"type": ...}``, lower-cased; ``None`` when not given.

    Not a backend choice: RLlib 2.58's learner group picks NCCL between GPU learners and gloo
    between CPU learners. ``validate()`` checks the type against the learners' resources
    (:func:`rllib_ext.config_checks.check_comm_resources`); with ``RLLIB_EXT_FIT_RESOURCES=1``
    ``"nccl"`` on CPU learners becomes ``"gloo"``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.communication_type = None
        if self.callbacks_on_train_result is None:
            # A stock "PPO" trainable built from this config's dict reports the old names too.
            self.callbacks_on_train_result = legacy_metrics_on_train_result

    @override(AlgorithmConfig)
    def rollouts(
        self,
        *,
        num_rollout_workers: Any = NotProvided,
        num_envs_per_worker: Any = NotProvided,
        rollout_fragment_length: Any = NotProvided,
        batch_mode: Any = NotProvided,
        **kwargs: Any,
    ) -> Any:
        """RLlib 2.0-2.9's ``.rollouts()``: ``.env_runners()`` with the old worker names.

        Raises:
            ValueError: for a keyword ``.env_runners()`` does not take either.
        """
        unknown = sorted(set(kwargs) - _ENV_RUNNER_KEYS)
        if unknown:
            raise ValueError(
                f".rollouts() got {unknown}, which .env_runners() does not take either. Allowed: "
                "num_rollout_workers, num_envs_per_worker, rollout_fragment_length, batch_mode "
                "and the .env_runners() keywords. Fix: drop them or see RLlib's env_runners()."
            )
        mapped = dict(kwargs)
        for old, value in (
            ("num_rollout_workers", num_rollout_workers),
            ("num_envs_per_worker", num_envs_per_worker),
        ):
            if value is not NotProvided:
                mapped[ROLLOUT_RENAMES[old]] = value
                _log_mapping(f".rollouts({old}=)", f".env_runners({ROLLOUT_RENAMES[old]}=)")
        if rollout_fragment_length is not NotProvided:
            mapped["rollout_fragment_length"] = rollout_fragment_length
        if batch_mode is not NotProvided:
            mapped["batch_mode"] = batch_mode
        return self.env_runners(**mapped)

    @override(AlgorithmConfig)
    def resources(
        self,
        *,
        num_gpus: Any = NotProvided,
        num_cpus: Any = NotProvided,
        num_gpus_per_worker: Any = NotProvided,
        num_cpus_per_worker: Any = NotProvided,
        placement_strategy: Any = NotProvided,
        **kwargs: Any,
    ) -> Any:
        """RLlib's ``.resources()`` plus the 2023 keywords, mapped onto learners/env runners.

        * ``num_gpus=N`` -> ``.learners(...)`` by
          :func:`rllib_ext.compat.resources.learners_for_num_gpus`;
        * ``num_cpus``: the new stack has no total; Ray gives each env runner and learner its
          own CPUs (``num_cpus_per_env_runner``, ``num_cpus_per_learner``), summed in
          :attr:`resources_total`. The value is checked to be a count and logged;
        * ``num_gpus_per_worker`` / ``num_cpus_per_worker`` -> ``.env_runners(
          num_gpus_per_env_runner=, num_cpus_per_env_runner=)``;
        * ``placement_strategy`` and every other keyword: RLlib's ``.resources()``.
        """
        if num_gpus is not NotProvided:
            learners = learners_for_num_gpus(num_gpus)
            _log_mapping(
                f".resources(num_gpus={num_gpus})",
                ".learners(" + ", ".join(f"{k}={v}" for k, v in learners.items()) + ")",
            )
            self.learners(**learners)
        if num_cpus is not NotProvided:
            if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
                raise ValueError(
                    f"num_cpus={num_cpus!r} is not a CPU count; allowed: a number >= 0. "
                    "Fix: e.g. .resources(num_cpus=8)."
                )
            _log_mapping(
                f".resources(num_cpus={num_cpus})",
                "no new-stack setting: Ray gives each env runner and learner its own CPUs "
                "(num_cpus_per_env_runner, num_cpus_per_learner); config.resources_total sums them",
            )
        runners = {}
        for old, value in (
            ("num_gpus_per_worker", num_gpus_per_worker),
            ("num_cpus_per_worker", num_cpus_per_worker),
        ):
            if value is not NotProvided:
                runners[ROLLOUT_RENAMES[old]] = value
                _log_mapping(f".resources({old}=)", f".env_runners({ROLLOUT_RENAMES[old]}=)")
        if runners:
            self.env_runners(**runners)
        if placement_strategy is not NotProvided:
            kwargs["placement_strategy"] = placement_strategy
        if kwargs:
            super().resources(**kwargs)
        return self

    @override(AlgorithmConfig)
    def training(self, *, communication_type: Any = NotProvided, **kwargs: Any) -> Any:
        """RLlib's ``training()`` plus ``communication_type`` (see the attribute).

        Raises:
            ValueError: for a type other than ``"auto"``, ``"nccl"``, ``"gloo"`` (any case).
        """
        if communication_type is NotProvided:
            return super().training(**kwargs)
        checked = (
            None if communication_type is None else check_communication_type(communication_type)
        )
        super().training(**kwargs)
        self.communication_type = checked
        if checked is not None:
            _log_mapping(
                f"communication type {checked!r}",
                "RLlib picks nccl on GPU learners, gloo on CPU (the type is checked against the "
                "learners' resources)",
            )
        self._fit_resources_if_asked()
        return self

    @override(AlgorithmConfig)
    def env_runners(self, *args: Any, **kwargs: Any) -> Any:
        super().env_runners(*args, **kwargs)
        self._fit_resources_if_asked()
        return self

    @override(AlgorithmConfig)
    def learners(self, *args: Any, **kwargs: Any) -> Any:
        super().learners(*args, **kwargs)
        self._fit_resources_if_asked()
        return self

    @override(AlgorithmConfig)
    def multi_agent(self, *args: Any, policy_mapping_fn: Any = NotProvided, **kwargs: Any) -> Any:
        if callable(policy_mapping_fn) and _takes_only_agent_id(policy_mapping_fn):
            # RLlib 1.x called fn(agent_id); the new stack calls fn(agent_id, episode).
            policy_mapping_fn = AgentIdMapping(policy_mapping_fn)
        super().multi_agent(*args, policy_mapping_fn=policy_mapping_fn, **kwargs)
        return self

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: Any) -> Any:
        """RLlib's ``update_from_dict`` plus the old top-level keys (see the module docstring).

        Raises:
            ValueError: for ``horizon`` (no new-stack equivalent) or a bad old value.
        """
        rest = dict(config_dict.items())
        training: dict[str, Any] = {}
        block = rest.pop("training", None)
        if block is not None:
            if not isinstance(block, Mapping):
                raise ValueError(
                    f'"training": {block!r} must be a dict of .training() keywords, e.g. '
                    '{"kl_coeff": 0.3}. Fix: pass a dict.'
                )
            training.update(block)
        if "communication" in rest:
            training["communication"] = rest.pop("communication")
        if rest.get("communication_type", None) is not None:
            # Our own attribute in a to_dict() round trip: checked like the tutorial's block.
            training["communication_type"] = rest.pop("communication_type")
        for key in TRAINING_ALIASES:
            if key in rest:
                value = rest.pop(key)
                if value != DEPRECATED_VALUE and value is not None:
                    training[key] = value
        horizon = rest.pop("horizon", None)
        if horizon not in (None, 0, DEPRECATED_VALUE):
            raise ValueError(
                f"horizon={horizon!r}: RLlib's new API stack has no horizon; episodes end where "
                "the env ends or truncates them. Fix: register the env with a step limit, e.g. "
                "register_env(name, lambda cfg: gymnasium.wrappers.TimeLimit(make(cfg), "
                f"max_episode_steps={horizon})), and drop the key."
            )
        num_gpus = rest.pop("num_gpus", 0)
        for old, new in ROLLOUT_RENAMES.items():
            if old in rest:
                value = rest.pop(old)
                if new in rest and rest[new] != value:
                    raise ValueError(
                        f"{old!r}={value!r} and {new!r}={rest[new]!r} disagree; {old!r} is the "
                        f"old name of {new!r}. Fix: give only {new!r}."
                    )
                rest[new] = value
                _log_mapping(f'"{old}"', f'"{new}"')
        super().update_from_dict(rest)
        if num_gpus:
            self.resources(num_gpus=num_gpus)
        if training:
            self.training(**training)
        self._fit_resources_if_asked()
        return self

    @property
    def resources_total(self) -> dict[str, float]:
        """What a run of this config reserves in Ray: ``{"cpu": .., "gpu": ..}``.

        The main process, the env runners and the learners, as Tune's ``resources_per_trial``
        would state them (``rllib_ext.tune.run`` accepts it and lets the trainable reserve
        exactly this).
        """
        return resource_request(self).as_tune_resources()

    @override(AlgorithmConfig)
    def validate(self) -> None:
        super().validate()
        if ray.is_initialized():
            # Only once Ray runs is it known what exists. The main process is Tune's to
            # count (rllib_ext.compat.PPO.default_resource_request); here only Ray's actors.
            check_request(self, include_main=False)

    def _fit_resources_if_asked(self) -> None:
        if fit_resources_enabled():
            fit_to_machine(self)
