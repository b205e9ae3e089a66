"""Array-speed sampling of SMAX battles: RLlib's episodes without RLlib's per-step loop.

RLlib's ``MultiAgentEnvRunner`` turns every env step into per-agent dicts, runs both connector
pipelines over them and appends to each ``MultiAgentEpisode`` agent by agent. The fused loop
keeps a rollout as arrays instead (one forward over all agents of a group of battles, the
battles stepped with an ``int [E, N]`` array) and builds the same numpy'd episode chunks once
per chunk. Layers: :mod:`.rules` (when it is exact), :mod:`.policy` (the forward),
:mod:`.tracks` (typed records), :mod:`.chunks` (RLlib's episode layout), :mod:`.sampler`
(the loop, its state between calls, RLlib's metrics).
"""

from __future__ import annotations

from rllib_ext.envs.smac.sampling.rules import why_not_fused
from rllib_ext.envs.smac.sampling.sampler import FusedSampler, gc_paused

__all__ = ["FusedSampler", "gc_paused", "why_not_fused"]
