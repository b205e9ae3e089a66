"""``FusedSingleAgentEnvRunner``: RLlib's ``SingleAgentEnvRunner`` with the fused loop.

Selected by :func:`use_fused_single_agent_runner` (from ``rllib_ext.PPOConfig``'s derived
settings) for single-agent configs with ``fused_sampling=True`` (the default) where the user
chose no env-runner class. Each ``sample()`` runs :class:`~.sampler.FusedSampler` where
:func:`~.rules.why_not_fused` finds no reason against it, else RLlib's own loop over the same
vector env, with one warning per runner and reason (``FusedSamplingFallback``);
``env_runners/fused_sampling`` is 1 when the last ``sample()`` ran fused. ``amp_inference`` is supported (:class:`~rllib_ext.env_runners.
AMPInference`). Switching between the two loops resets the envs (each keeps its own episodes).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.annotations import override

from rllib_ext.env_runners import AMPInference, replaceable
from rllib_ext.fused_sampling.common import FusedDispatch
from rllib_ext.fused_sampling.rules import why_not_fused
from rllib_ext.fused_sampling.sampler import FusedSampler
from rllib_ext.settings import SamplingSettings

__all__ = ["FUSED_METRIC", "FusedSingleAgentEnvRunner", "use_fused_single_agent_runner"]

FUSED_METRIC = "fused_sampling"
"""``env_runners/<this>``: 1 when the last ``sample()`` ran the fused loop, else 0."""


def use_fused_single_agent_runner(config: AlgorithmConfig) -> bool:
    """Sets ``config.env_runner_cls`` to :class:`FusedSingleAgentEnvRunner` where it applies.

    Applies to single-agent configs with ``fused_sampling=True`` whose env-runner class is
    RLlib's default or one rllib_ext may swap (:func:`~rllib_ext.env_runners.replaceable`);
    an earlier automatic choice is undone when the config no longer qualifies (back to the
    ``amp_inference`` runner or RLlib's default). Idempotent; returns whether it is selected.
    """
    chosen = config.env_runner_cls
    if chosen is not FusedSingleAgentEnvRunner and not replaceable(chosen):
        return False
    # Read leniently (as amp_inference is): validate() reports a bad value in one line.
    flag = config.learner_config_dict.get("fused_sampling", SamplingSettings.fused_sampling)
    wanted = flag is True and not config.is_multi_agent
    if wanted:
        config.env_runner_cls = FusedSingleAgentEnvRunner
    elif chosen is FusedSingleAgentEnvRunner:
        config.env_runner_cls = None  # the amp_inference rule picks its runner afterwards
    return wanted


class FusedSingleAgentEnvRunner(FusedDispatch, AMPInference, SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` whose time-step and episode sampling runs as one batched
    forward per step where exact (see the module docstring)."""

    # REPLACEABLE: RLlib's default runner plus protocols (the same episodes), so a config that
    # turns multi-agent on SMAX gets the batched SMAX runner instead.
    rllib_ext_replaceable_runner = True
    fused: FusedSampler

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.init_fused(FusedSampler(self))

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

    @override(FusedDispatch)
    def fused_rule(
        self, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
    ) -> str | None:
        return why_not_fused(self, random_actions=random_actions)

    @override(FusedDispatch)
    def fused_sample(self, **kwargs: Any) -> list[SingleAgentEpisode]:
        return self.fused.sample(**kwargs)
