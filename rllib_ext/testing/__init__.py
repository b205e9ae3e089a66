"""Conformance checks users run against their own envs and policies.

* :func:`check_masked_multiagent_env`: RLlib's env checker plus the action-mask contract.
* :class:`BackendSpy`: proves that no illegal action of a policy reaches a SMAC backend.
* :func:`steps_to_return`: trains a config until a mean episode return; env steps it took.

Test doubles (such as the StarCraft II stand-in) live under ``tests/``, not in the package.
"""

from __future__ import annotations

from rllib_ext.testing.learning import LearningReport, steps_to_return
from rllib_ext.testing.masked_env import (
    BackendSpy,
    MaskedEnvReport,
    check_masked_multiagent_env,
    sample_legal,
)

__all__ = [
    "BackendSpy",
    "LearningReport",
    "MaskedEnvReport",
    "check_masked_multiagent_env",
    "sample_legal",
    "steps_to_return",
]
