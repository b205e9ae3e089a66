"""``FusedSingleAgentEnvRunner``: RLlib's ``SingleAgentEnvRunner`` with the fused loop.

Selected by :func:`use_fused_single_agent_runner` (from ``rllib_ext.PPOConfig``'s derived
settings) for single-agent configs with ``fused_sampling=True`` (the default) where the user
chose no env-runner class. Each ``sample()`` runs :class:`~.sampler.FusedSampler` where
:func:`~.rules.why_not_fused` finds no reason against it, else RLlib's own loop over the same
vector env, with one INFO line per reason; ``env_runners/fused_sampling`` is 1 when the last
``sample()`` ran fused. ``amp_inference`` is supported (:class:`~rllib_ext.env_runners.
AMPInference`). Switching between the two loops resets the envs (each keeps its own episodes).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.annotations import override

from rllib_ext.env_runners import AMPInference, replaceable
from rllib_ext.fused_sampling.policy import UnfusedModuleOutputs
from rllib_ext.fused_sampling.rules import why_not_fused
from rllib_ext.fused_sampling.sampler import FusedSampler
from rllib_ext.settings import ExtensionSettings, SamplingSettings

__all__ = ["FUSED_METRIC", "FusedSingleAgentEnvRunner", "use_fused_single_agent_runner"]

logger = logging.getLogger(__name__)

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


class FusedSingleAgentEnvRunner(AMPInference, SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` whose time-step and episode sampling runs as one batched
    forward per step where exact (see the module docstring)."""

    fused_sampling: bool = True
    """False: always RLlib's loop (class or instance attribute; the config's
    ``fused_sampling`` setting applies too)."""

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.fused = FusedSampler(self)
        """The fused loop and the episodes it carries between calls."""
        self._fused_last = False
        self._fallbacks_logged: set[str] = set()
        self._unfused_outputs: str | None = None
        settings = ExtensionSettings.from_learner_config_dict(config.learner_config_dict)
        self._setting_off = not settings.sampling.fused_sampling

    @override(EnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        episodes = super().sample(*args, **kwargs)
        self.metrics.log_value(FUSED_METRIC, float(self._fused_last), window=1)
        return episodes

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        super().make_env()
        fused = getattr(self, "fused", None)  # None while RLlib's __init__ builds the env
        if fused is not None:
            fused.drop()

    @override(SingleAgentEnvRunner)
    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        fused_before = self._fused_last
        why_not = (
            "fused_sampling=False"
            if self._setting_off or not self.fused_sampling
            else self._unfused_outputs or why_not_fused(self, random_actions=random_actions)
        )
        if why_not is None:
            self._fused_last = True
            try:
                return self.fused.sample(
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    explore=explore,
                    force_reset=force_reset,
                )
            except UnfusedModuleOutputs as err:  # from the first forward: RLlib's loop instead
                self._unfused_outputs = why_not = str(err)
                self.fused.drop()
                force_reset = True
            except BaseException:
                self.fused.drop()  # a step may be half recorded: the next call resets
                raise
        if fused_before or self.fused.active:  # leaving the fused loop: RLlib's starts afresh
            self.fused.drop()
            force_reset = True
        self._fused_last = False
        if why_not not in self._fallbacks_logged:
            self._fallbacks_logged.add(why_not)
            logger.info("fused sampling off, RLlib's SingleAgentEnvRunner loop runs: %s", why_not)
        return super()._sample(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )
