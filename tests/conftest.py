"""Shared fixtures: one local Ray instance per test session (2-core CI machine)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with 4 logical CPUs (oversubscribes 2 cores so 2 learners + driver fit)."""
    import ray

    if not ray.is_initialized():
        # address="local": always a fresh Ray for the tests, never one that another
        # process started on this machine (a stale /tmp/ray/ray_current_cluster included).
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
