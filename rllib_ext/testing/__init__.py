"""Conformance checks and test stand-ins users can run against their own envs.

* :func:`check_masked_multiagent_env`: RLlib's env checker plus the action-mask contract.
* :class:`BackendSpy`: proves no illegal action reaches a SMAC backend.
* :mod:`rllib_ext.testing.fake_sc2`: a labelled stand-in with SMAC's API (not StarCraft II).
"""

from __future__ import annotations

from rllib_ext.testing.masked_env import (
    BackendSpy,
    MaskedEnvReport,
    check_masked_multiagent_env,
    sample_legal,
)

__all__ = ["BackendSpy", "MaskedEnvReport", "check_masked_multiagent_env", "sample_legal"]
