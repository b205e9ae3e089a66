"""``SMAXVectorEnvRunner``: RLlib's ``MultiAgentEnvRunner`` over one :class:`SMAXVectorEnv`.

Selected by the runner table (:mod:`rllib_ext.runner_table`, rule ``smax_batched``) when the env
is SMAC on the SMAX backend and ``num_envs_per_env_runner > 1``: the runner's
``num_envs_per_env_runner`` battles are stepped by one jitted, vmapped call instead of RLlib's
``SyncVectorMultiAgentEnv`` loop over ``SMACEnv`` copies. Everything else (episodes,
connectors, callbacks, metrics) is RLlib's. StarCraft II backends keep RLlib's runner.

Visible in the results as ``env_runners/rllib_ext/smax_batched_envs`` (battles per compiled call)
and ``env_runners/rllib_ext/smax_fused_groups`` (groups of battles the fused loop alternates between).
``amp_inference=True`` keeps this runner: it derives from
:class:`~rllib_ext.env_runners.AMPMultiAgentEnvRunner` and holds its features (``features``: the
forward runs under the learner's autocast dtype, its outputs cast back to float32 before actions
and ``action_logp`` are computed).
"""

from __future__ import annotations

from typing import Any, Literal

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override

from rllib_ext import _rllib_private as private
from rllib_ext.env_runners import AMPMultiAgentEnvRunner
from rllib_ext.envs.smac.factory import smax_env_config
from rllib_ext.envs.smac.sampling import SMAXFusedSampler, gc_paused, smax_rule
from rllib_ext.envs.smac.vector import SMAXVectorEnv
from rllib_ext.fused.dispatch import FusedDispatch

__all__ = [
    "SMAX_BATCHED_METRIC",
    "SMAXVectorEnvRunner",
    "smax_env_config",
]

SMAX_BATCHED_METRIC = "rllib_ext/smax_batched_envs"
"""``env_runners/<this>``: battles stepped per compiled call (0: not the batched path)."""
SMAX_FUSED_METRIC = "rllib_ext/smax_fused_sampling"
"""``env_runners/<this>``: 1 when the last ``sample()`` ran the array-speed path."""
SMAX_GROUPS_METRIC = "rllib_ext/smax_fused_groups"
"""``env_runners/<this>``: groups of battles the fused loop alternates between."""


class SMAXVectorEnvRunner(AMPMultiAgentEnvRunner):
    """``MultiAgentEnvRunner`` whose vector env is one :class:`SMAXVectorEnv` (holding
    :class:`rllib_ext.env_runners.AMPMultiAgentEnvRunner`'s features).

    With ``fused_sampling`` (default on; the setting, or a runner attribute) time-step
    sampling runs as arrays (:class:`~rllib_ext.envs.smac.sampling.SMAXFusedSampler`) wherever
    :func:`~rllib_ext.envs.smac.sampling.smax_rule` finds no reason against it; otherwise,
    and for episode-count sampling (evaluation), RLlib's own loop runs over the same vector env,
    with one warning per runner and reason (``FusedSamplingFallback``).
    ``env_runners/rllib_ext/smax_fused_sampling`` is 1 when the last ``sample()`` took the fused path.
    Holds its fused loop (``fused``) and the per-call choice between it and RLlib's
    (``dispatch``).
    """

    fused_sampling: bool = True
    """False: always RLlib's loop (class or instance attribute; the ``fused_sampling`` setting
    applies too)."""

    fused_fallback_message = (
        "SMAX batched stepping: sampling with RLlib's MultiAgentEnvRunner loop "
        "(array-speed sampling is off: %s)."
    )
    pause_gc: bool = True
    """The fused loop runs with Python's cyclic garbage collector paused (``gc_paused``): its
    collections would scan the call's live episode tracks. False: the collector runs as
    configured."""
    fused_groups: int | Literal["auto"] = "auto"
    """Groups of battles the fused loop alternates between (:class:`SMAXVectorEnv`'s
    ``num_groups``): while JAX steps one group, the policy runs for the next. ``"auto"``: 2 for
    large batches (:data:`rllib_ext.envs.smac.battles.AUTO_GROUP_ROWS`), else 1. Set before the
    env is built (class or instance attribute; ``make_env()`` rebuilds)."""
    env: SMAXVectorEnv | None
    fused: SMAXFusedSampler
    dispatch: FusedDispatch

    @override(MultiAgentEnvRunner)
    def __init__(self, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.fused = SMAXFusedSampler(self)
        self.dispatch = FusedDispatch(
            self, self.fused, fallback_message=self.fused_fallback_message
        )

    @property
    def fused_last(self) -> bool:
        """Whether the last ``sample()`` ran the fused loop."""
        return self.dispatch.last

    @property
    def vector_env(self) -> SMAXVectorEnv:
        """The runner's :class:`SMAXVectorEnv`."""
        if self.env is None:
            raise ValueError("The SMAX vector env is not built (or closed). Fix: make_env().")
        return self.env

    @override(MultiAgentEnvRunner)
    def make_env(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
        env_config = smax_env_config(self.config.env, self.config.env_config)
        if env_config is None:
            raise ValueError(
                f"SMAXVectorEnvRunner needs a SMAC env on the SMAX backend, got env="
                f"{self.config.env!r} with env_config={dict(self.config.env_config)!r}. Fix: "
                "use env 'smax' (or backend='smax'), or leave env_runner_cls unset so "
                "rllib_ext picks RLlib's MultiAgentEnvRunner for StarCraft II."
            )
        self.env = SMAXVectorEnv(
            env_config,
            num_envs=self.config.num_envs_per_env_runner,
            worker_index=self.worker_index or 0,
            num_groups=self.fused_groups,
        )
        self.num_envs = self.env.num_envs
        private.set_needs_initial_reset(self, True)
        env_ctx = EnvContext(
            env_config,
            worker_index=self.worker_index,
            num_workers=self.config.num_env_runners,
            remote=self.config.remote_worker_envs,
        )
        make_callback(
            "on_environment_created",
            callbacks_objects=private.runner_callbacks(self),
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs=dict(
                env_runner=self,
                metrics_logger=self.metrics,
                env=self.env,
                env_context=env_ctx,
            ),
        )

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        episodes = super().sample(*args, **kwargs)
        self.metrics.log_value(SMAX_BATCHED_METRIC, self.num_envs, window=1)
        self.metrics.log_value(SMAX_FUSED_METRIC, float(self.fused_last), window=1)
        self.metrics.log_value(SMAX_GROUPS_METRIC, self.vector_env.battles.num_groups, window=1)
        return episodes

    @override(MultiAgentEnvRunner)
    def _sample(self, **kwargs: Any) -> list[Any]:
        """RLlib's ``_sample`` arguments, handed to :attr:`dispatch` with RLlib's own."""
        return self.dispatch.sample(super()._sample, **kwargs)

    def fused_rule(
        self, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
    ) -> str | None:
        return smax_rule(
            self, num_timesteps=num_timesteps, random_actions=random_actions, explore=explore
        )

    def fused_sample(
        self, *, num_timesteps: int | None, explore: bool, force_reset: bool, **kwargs: Any
    ) -> list[MultiAgentEpisode]:
        assert num_timesteps is not None  # smax_rule: time-step sampling only
        with gc_paused(self.pause_gc):
            return self.fused.sample(num_timesteps, explore=explore, force_reset=force_reset)
