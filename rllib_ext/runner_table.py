"""The one env-runner table: which ``EnvRunner`` class an ``rllib_ext.PPOConfig``'s runs use, and why.

:func:`select_env_runner_class` reads the config and returns the class with the name of the rule
that chose it; :func:`apply_env_runner_table` writes the choice into ``config.env_runner_cls``
(``rllib_ext.PPOConfig`` calls it whenever a setter the rules read runs). The first rule that
applies wins:

=======================  ================================================  ==============================
rule                     when                                              class
=======================  ================================================  ==============================
``user_class``           ``env_runner_cls`` is a class this table did      the user's (RLlib runs it)
                         not pick (a user's subclass of ours included)
``rllib_old_api_stack``  ``enable_env_runner_and_connector_v2=False``      RLlib's choice: its
                                                                           ``RolloutWorker``
``rllib_offline_output`` ``.offline_data(output=...)``                     RLlib's choice: its
                                                                           ``OfflineSingleAgentEnvRunner``
``smax_batched``         rllib_ext's SMAX env, multi-agent,                ``SMAXVectorEnvRunner``
                         ``num_envs_per_env_runner > 1``
``fused_single_agent``   single-agent, ``fused_sampling=True``             ``FusedSingleAgentEnvRunner``
``amp_inference``        ``amp_inference=True``                            ``AMP{Single,Multi}AgentEnvRunner``
``rllib_default``        anything else                                     RLlib's choice
=======================  ================================================  ==============================

Where RLlib chooses (``rllib_*`` rules) ``env_runner_cls`` stays ``None``, so RLlib's own
``EnvRunnerGroup`` logic runs (including its refusal of multi-agent recording). Profiling
(:func:`rllib_ext.profiling.enable_profiling`) puts ``Profiling<Base>``, a one-layer subclass of the
chosen class, in its place; the table unwraps it, applies the rules to the class underneath and wraps the result again (rule
``profiled:<rule>``), so a profiled config still follows the table.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rllib_ext.config_checks import amp_env_runner_class
from rllib_ext.env_runners import (
    AMPMultiAgentEnvRunner,
    AMPSingleAgentEnvRunner,
    rllib_env_runner_class,
)
from rllib_ext.envs import is_smac_env
from rllib_ext.fused_sampling.runner import FusedSingleAgentEnvRunner
from rllib_ext.profiling.env_runner import profiled, profiled_env_runner_class
from rllib_ext.settings import AMPSettings, SamplingSettings

__all__ = ["RULES", "RunnerChoice", "apply_env_runner_table", "select_env_runner_class"]

RULES = (
    "user_class",
    "rllib_old_api_stack",
    "rllib_offline_output",
    "smax_batched",
    "fused_single_agent",
    "amp_inference",
    "rllib_default",
)
"""The rules in the order they are tried (a profiled config's rule is ``profiled:<rule>``)."""

_SMAX_RUNNER = "rllib_ext.envs.smac.env_runner.SMAXVectorEnvRunner"

TABLE_CLASSES: frozenset[str] = frozenset(
    {
        _SMAX_RUNNER,
        *(
            f"{cls.__module__}.{cls.__qualname__}"
            for cls in (FusedSingleAgentEnvRunner, AMPSingleAgentEnvRunner, AMPMultiAgentEnvRunner)
        ),
    }
)
"""The classes the table picks itself, by qualified name (the SMAX runner's module loads the
SMAX backend, so only SMAX configs import it): finding one of them in a config is no choice of
the user's (the rules pick again). Exactly these classes: a user's subclass is the user's."""


def _picked_by_table(cls: type) -> bool:
    return f"{cls.__module__}.{cls.__qualname__}" in TABLE_CLASSES


def _runs_on_smax(config: Any) -> bool:
    if not is_smac_env(config.env):
        return False
    # lazy: rllib_ext.envs.smac loads the SMAC backends' modules; only SMAC configs need them
    from rllib_ext.envs.smac.factory import smax_env_config

    return smax_env_config(config.env, config.env_config) is not None


def _smax_runner() -> type:
    # lazy: the SMAX runner's module loads the SMAX backend (JAX); only SMAX configs need it
    from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner

    return SMAXVectorEnvRunner


class RunnerChoice(NamedTuple):
    """What :func:`select_env_runner_class` chose."""

    cls: type | None
    """The class the runs will use; ``None`` only where RLlib itself refuses the config
    (multi-agent recording)."""
    rule: str
    """The rule that chose it (:data:`RULES`, ``profiled:`` in front for a profiled config)."""
    rllib_picks: bool = False
    """RLlib picks the class itself (``env_runner_cls`` stays ``None``)."""

    @property
    def config_value(self) -> type | None:
        """What goes into ``config.env_runner_cls``."""
        return None if self.rllib_picks else self.cls


def _flag(config: Any, key: str, default: Any) -> Any:
    # Read leniently: validate() reports a bad value in one line.
    return config.learner_config_dict.get(key, default)


def _rllib_choice(config: Any, rule: str) -> RunnerChoice:
    try:
        cls: type | None = rllib_env_runner_class(config)
    except ValueError:  # multi-agent recording: RLlib raises its own message when it builds
        cls = None
    return RunnerChoice(cls, rule, rllib_picks=True)


def _select_unprofiled(config: Any, current: type | None) -> RunnerChoice:
    if current is not None and not _picked_by_table(current):
        return RunnerChoice(current, "user_class")
    if not config.enable_env_runner_and_connector_v2:  # RLlib's old stack: its RolloutWorker
        return RunnerChoice(None, "rllib_old_api_stack", rllib_picks=True)
    if config.output:
        return _rllib_choice(config, "rllib_offline_output")
    if config.is_multi_agent and config.num_envs_per_env_runner > 1 and _runs_on_smax(config):
        return RunnerChoice(_smax_runner(), "smax_batched")
    if (
        not config.is_multi_agent
        and _flag(config, "fused_sampling", SamplingSettings.fused_sampling) is True
    ):
        return RunnerChoice(FusedSingleAgentEnvRunner, "fused_single_agent")
    if _flag(config, "amp_inference", AMPSettings.amp_inference) is True:
        return RunnerChoice(amp_env_runner_class(config), "amp_inference")
    return _rllib_choice(config, "rllib_default")


def select_env_runner_class(config: Any) -> RunnerChoice:
    """The env-runner class for ``config`` and the rule that chose it; changes nothing."""
    current = config.env_runner_cls
    if current is None or not profiled(current):
        return _select_unprofiled(config, current)
    # Profiled: the rules apply to the class underneath, whose timing subclass runs.
    base = None if getattr(current, "profiled_rllib_choice", False) else current.profiled_class
    choice = _select_unprofiled(config, base)
    if choice.cls is None:
        return choice._replace(rule=f"profiled:{choice.rule}")
    timed = profiled_env_runner_class(choice.cls, rllib_choice=choice.rllib_picks)
    return RunnerChoice(timed, f"profiled:{choice.rule}")


def apply_env_runner_table(config: Any) -> RunnerChoice:
    """Writes :func:`select_env_runner_class`'s choice into ``config.env_runner_cls``."""
    choice = select_env_runner_class(config)
    config.env_runner_cls = choice.config_value
    return choice
