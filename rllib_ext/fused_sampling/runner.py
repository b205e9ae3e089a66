"""``FusedSingleAgentEnvRunner``: RLlib's ``SingleAgentEnvRunner`` with the fused loop.

Selected by the runner table (:mod:`rllib_ext.runner_table`, rule ``fused_single_agent``) for
single-agent configs with ``fused_sampling=True`` (the default) where the user chose no
env-runner class. Each ``sample()`` goes to the runner's ``dispatch``
(:class:`~rllib_ext.fused.dispatch.FusedDispatch`), which runs
:class:`~.sampler.SingleAgentFusedSampler` where :func:`~.rules.single_agent_rule` finds no
reason against it, else RLlib's own loop over the same vector env, with one warning per runner
and reason (``FusedSamplingFallback``); ``env_runners/rllib_ext/fused_sampling`` is 1 when the last
``sample()`` ran fused. It derives from
:class:`~rllib_ext.env_runners.AMPSingleAgentEnvRunner`, so it holds that runner's features
(``features``: ``amp_inference``) around the whole call. Switching between the two loops resets the envs
(each keeps its own episodes).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.annotations import override

from rllib_ext.env_runners import AMPSingleAgentEnvRunner
from rllib_ext.fused.dispatch import FusedDispatch
from rllib_ext.fused_sampling.rules import single_agent_rule
from rllib_ext.fused_sampling.sampler import SingleAgentFusedSampler

__all__ = ["FUSED_METRIC", "FusedSingleAgentEnvRunner"]

FUSED_METRIC = "rllib_ext/fused_sampling"
"""``env_runners/<this>``: 1 when the last ``sample()`` ran the fused loop, else 0."""


class FusedSingleAgentEnvRunner(AMPSingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` whose time-step and episode sampling runs as one batched
    forward per step where exact (see the module docstring). Holds its fused loop (``fused``)
    and the per-call choice between it and RLlib's (``dispatch``); its features (``features``)
    wrap both."""

    fused_sampling: bool = True
    """False: always RLlib's loop (class or instance attribute; the ``fused_sampling`` setting
    applies too)."""
    fused: SingleAgentFusedSampler
    dispatch: FusedDispatch

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.fused = SingleAgentFusedSampler(self)
        self.dispatch = FusedDispatch(self, self.fused)

    @property
    def fused_last(self) -> bool:
        """Whether the last ``sample()`` ran the fused loop."""
        return self.dispatch.last

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        episodes = super().sample(*args, **kwargs)
        self.metrics.log_value(FUSED_METRIC, float(self.fused_last), window=1)
        return episodes

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        super().make_env()
        fused = getattr(self, "fused", None)  # None while RLlib's __init__ builds the env
        if fused is not None:
            fused.drop()

    @override(SingleAgentEnvRunner)
    def _sample(self, **kwargs: Any) -> list[Any]:
        """RLlib's ``_sample`` arguments, handed to :attr:`dispatch` with RLlib's own."""
        return self.dispatch.sample(super()._sample, **kwargs)

    def fused_rule(
        self, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
    ) -> str | None:
        return single_agent_rule(self, random_actions=random_actions)

    def fused_sample(self, **kwargs: Any) -> list[SingleAgentEpisode]:
        return self.fused.sample(**kwargs)
