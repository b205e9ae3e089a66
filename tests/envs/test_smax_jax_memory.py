"""The SMAX backend sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` before its first JAX call (JAX
on a CUDA GPU otherwise takes 75% of its memory when it creates its GPU client, leaving the rest
to a torch learner on the same GPU), unless the user set the variable; ``import rllib_ext`` leaves
it alone. Each case in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jaxmarl", reason='SMAX backend needs jaxmarl: pip install "rllib-ext[smax]"')

PROBE = """
import json, os, sys
import rllib_ext
from rllib_ext.envs.smac import smax
seen = {"after_import": os.environ.get(smax.XLA_PREALLOCATE)}
smax._import_smax()
seen["after_backend"] = os.environ.get(smax.XLA_PREALLOCATE)
seen["jaxmarl_loaded"] = "jaxmarl" in sys.modules
print(json.dumps(seen))
"""


def _probe(preallocate: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    env["JAX_PLATFORMS"] = "cpu"
    if preallocate is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = preallocate
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_backend_sets_no_preallocation_when_it_loads_jax() -> None:
    seen = _probe(None)
    assert seen == {
        "after_import": None,  # not at import rllib_ext, nor of the backend's module
        "after_backend": "false",
        "jaxmarl_loaded": True,
    }


def test_the_users_value_is_kept() -> None:
    seen = _probe("true")
    assert seen["after_import"] == "true" and seen["after_backend"] == "true"
