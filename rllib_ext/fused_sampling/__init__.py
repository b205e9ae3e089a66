"""Array-speed sampling for single-agent gymnasium vector envs: RLlib's episodes, fused.

:class:`FusedSingleAgentEnvRunner` (picked by ``rllib_ext.PPOConfig`` for single-agent envs,
``fused_sampling=True``, the default) runs :class:`SingleAgentFusedSampler` where
:func:`single_agent_rule` finds no reason against it (decided before any side effect), else
RLlib's own ``SingleAgentEnvRunner._sample``, with one ``FusedSamplingFallback`` warning per
runner and reason and ``env_runners/rllib_ext/fused_sampling`` 0. Layers, as for SMAX
(:mod:`rllib_ext.envs.smac.sampling`): the rule (``rules.py``), the forward and actions
(``policy.py``), the step log and per-env tracks (``tracks.py``), episode chunks (``chunks.py``,
:func:`build_single_agent_chunk`, the one place that knows RLlib's single-agent episode layout),
the loop (``sampler.py``) and the runner (``runner.py``). What every fused loop shares (the
runner's select-and-dispatch, the rule's common checks, the ``on_episode_end`` call) is the
fused core, :mod:`rllib_ext.fused`; this package never imports the SMAX one.
"""

from __future__ import annotations

from rllib_ext.fused.dispatch import FusedSamplingFallback
from rllib_ext.fused_sampling.chunks import build_single_agent_chunk
from rllib_ext.fused_sampling.rules import single_agent_rule
from rllib_ext.fused_sampling.runner import (
    FUSED_METRIC,
    FusedSingleAgentEnvRunner,
)
from rllib_ext.fused_sampling.sampler import SingleAgentFusedSampler

__all__ = [
    "FUSED_METRIC",
    "FusedSamplingFallback",
    "FusedSingleAgentEnvRunner",
    "SingleAgentFusedSampler",
    "build_single_agent_chunk",
    "single_agent_rule",
]
