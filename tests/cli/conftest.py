"""Fixtures of the CLI tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes any ray.init() in the command fail the test: errors must come before Ray."""
    import ray

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ray.init() was called")

    monkeypatch.setattr(ray, "init", refuse)
