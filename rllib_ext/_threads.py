"""OpenMP's wait policy: torch's CPU thread pool yields instead of spinning (no Ray or torch import).

By default torch's OpenMP threads spin between parallel regions: fastest alone on the cores, and
slowest beside another CPU-bound process (each region waits for a descheduled thread while the
spinning one takes the cores). ``import rllib_ext`` sets ``OMP_WAIT_POLICY=PASSIVE`` where the user
set no policy and torch is not loaded yet (OpenMP reads it once, when torch loads it); Ray's worker
processes started afterwards inherit it. ``OMP_WAIT_POLICY=ACTIVE`` keeps the spinning pool. The
trade-off, measured: benchmarks/README.md, "Contention".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

__all__ = ["OMP_WAIT_POLICY", "prefer_passive_omp_wait", "wait_policy_note"]

OMP_WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_omp_wait(
    environ: MutableMapping[str, str] = os.environ,
    modules: Mapping[str, object] = sys.modules,
) -> bool:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless it is set or torch is already in
    ``modules``; returns whether it set it."""
    if OMP_WAIT_POLICY in environ or "torch" in modules:
        return False
    environ[OMP_WAIT_POLICY] = "PASSIVE"
    return True


def wait_policy_note(
    environ: Mapping[str, str] = os.environ, *, set_by_rllib_ext: bool | None = None
) -> str:
    """One line for ``rllib-ext doctor``: the policy in force and where it came from."""
    policy = environ.get(OMP_WAIT_POLICY)
    if policy is None:
        return "unset: OpenMP's default, spinning (torch was loaded before rllib_ext)"
    origin = "set by rllib_ext" if set_by_rllib_ext else "from the environment"
    return f"{policy} ({origin}; OMP_WAIT_POLICY=ACTIVE keeps the spinning pool)"
