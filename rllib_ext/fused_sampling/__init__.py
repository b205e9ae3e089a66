"""Array-speed sampling for single-agent gymnasium vector envs: RLlib's episodes, fused.

:class:`FusedSingleAgentEnvRunner` (picked by ``rllib_ext.PPOConfig`` for single-agent envs,
``fused_sampling=True``, the default) runs :class:`FusedSampler` where :func:`why_not_fused`
finds no reason against it (decided before any side effect), else RLlib's own
``SingleAgentEnvRunner._sample``, with one ``FusedSamplingFallback`` warning per runner and
reason and ``env_runners/fused_sampling`` 0. Layers, as for SMAX
(:mod:`rllib_ext.envs.smac.sampling`): the rule (``rules.py``), the forward and actions
(``policy.py``), the step log and per-env tracks (``tracks.py``), episode chunks (``chunks.py``,
the one place that knows RLlib's single-agent episode layout), the loop (``sampler.py``) and the
runner (``runner.py``). ``common.py`` holds what every fused loop shares, the SMAX one too: the
runner's select-and-dispatch (``FusedDispatch``), the rule's common checks and the
``on_episode_end`` call.
"""

from __future__ import annotations

from rllib_ext.fused_sampling.common import FusedSamplingFallback
from rllib_ext.fused_sampling.rules import why_not_fused
from rllib_ext.fused_sampling.runner import (
    FUSED_METRIC,
    FusedSingleAgentEnvRunner,
)
from rllib_ext.fused_sampling.sampler import FusedSampler

__all__ = [
    "FUSED_METRIC",
    "FusedSampler",
    "FusedSamplingFallback",
    "FusedSingleAgentEnvRunner",
    "why_not_fused",
]
