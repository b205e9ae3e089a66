"""The fused core: what every fused sampling loop shares, whatever the env.

A fused loop samples what RLlib's env runner would, as arrays, inside that runner. Two exist:
the single-agent one (:mod:`rllib_ext.fused_sampling`: ``SingleAgentFusedSampler``,
``single_agent_rule``, ``build_single_agent_chunk``) and the SMAX one
(:mod:`rllib_ext.envs.smac.sampling`: ``SMAXFusedSampler``, ``smax_rule``, ``build_smax_chunk``).
Neither imports the other; both import this package: the runner's select-and-dispatch
(:mod:`.dispatch`: :class:`FusedDispatch`, :class:`FusedSamplingFallback`), the rule's common
checks (:mod:`.rules`: RLlib's default pipelines piece by piece, numpy'd episodes, a CPU module,
no per-step callback) and what the loops do with built chunks (:mod:`.episodes`: the
``on_episode_end`` call, running chunks kept for RLlib's episode metrics).
"""

from __future__ import annotations

from rllib_ext.fused.dispatch import FusedDispatch, FusedSamplingFallback
from rllib_ext.fused.rules import UnfusedModuleOutputs

__all__ = ["FusedDispatch", "FusedSamplingFallback", "UnfusedModuleOutputs"]
