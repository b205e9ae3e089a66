"""The AMP checkpoint state's ``dtype`` is checked on restore (it used to be saved and ignored)."""

from __future__ import annotations

import logging

import pytest
import torch

from rllib_ext.learners.amp import AMPState
from rllib_ext.settings import AMPSettings


def _state(amp: str, dtype: torch.dtype) -> AMPState:
    return AMPState(settings=AMPSettings(amp=amp), device=torch.device("cpu"), dtype=dtype)


def test_restoring_into_another_dtype_warns_and_names_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fp16 = _state("fp16", torch.float16)
    fp16.scaler("default_policy")
    saved = fp16.get_state()
    assert saved["dtype"] == "float16"
    with caplog.at_level(logging.WARNING, logger="rllib_ext.learners.amp"):
        _state("bf16", torch.bfloat16).set_state(saved)
    assert "saved with dtype float16" in caplog.text and "running bfloat16" in caplog.text
    assert "loss scale is not used" in caplog.text


def test_restoring_into_the_same_dtype_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    fp16 = _state("fp16", torch.float16)
    fp16.scaler("default_policy")
    restored = _state("fp16", torch.float16)
    with caplog.at_level(logging.WARNING, logger="rllib_ext.learners.amp"):
        restored.set_state(fp16.get_state())
    assert caplog.text == ""
    assert (
        restored.scaler("default_policy").get_scale() == fp16.scaler("default_policy").get_scale()
    )
