"""Array-speed sampling of SMAX battles: RLlib's episodes without RLlib's per-step loop.

RLlib's ``MultiAgentEnvRunner`` turns every env step into per-agent dicts, runs both connector
pipelines over them and appends to each ``MultiAgentEpisode`` agent by agent. The fused loop
keeps a rollout as arrays instead (one forward over all agents of a group of battles, the
battles stepped with an ``int [E, N]`` array) and builds the same numpy'd episode chunks once
per chunk. Layers: :mod:`.rules` (:func:`smax_rule`, when it is exact), :mod:`.policy` (the forward),
:mod:`.tracks` (typed records), :mod:`.chunks` (:func:`build_smax_chunk`, RLlib's episode layout), :mod:`.sampler`
(:class:`SMAXFusedSampler`, the loop, its state between calls, RLlib's metrics). What every
fused loop shares (dispatch, the rule's common checks, ``on_episode_end``) is in
:mod:`rllib_ext.fused`; this package never imports the single-agent one.
"""

from __future__ import annotations

from rllib_ext.envs.smac.sampling.chunks import build_smax_chunk
from rllib_ext.envs.smac.sampling.rules import smax_rule
from rllib_ext.envs.smac.sampling.sampler import SMAXFusedSampler, gc_paused

__all__ = ["SMAXFusedSampler", "build_smax_chunk", "gc_paused", "smax_rule"]
