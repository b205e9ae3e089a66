"""``import rllib_ext`` asks OpenMP's threads to yield (``OMP_WAIT_POLICY=PASSIVE``) unless the user
chose a policy or torch is already loaded (then OpenMP has read its settings already)."""

from __future__ import annotations

import os
import subprocess
import sys

from rllib_ext._threads import prefer_passive_omp_wait, wait_policy_note


def test_sets_passive_only_where_nothing_was_chosen_and_torch_is_not_loaded():
    environ: dict[str, str] = {}
    assert prefer_passive_omp_wait(environ, modules={})
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "set by rllib_ext" in wait_policy_note(environ, set_by_rllib_ext=True)

    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not prefer_passive_omp_wait(chosen, modules={})
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert "from the environment" in wait_policy_note(chosen, set_by_rllib_ext=False)

    late: dict[str, str] = {}
    assert not prefer_passive_omp_wait(late, modules={"torch": object()})
    assert late == {}
    assert "unset" in wait_policy_note(late)


def _policy_after(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    out = subprocess.run(
        [sys.executable, "-c", code + "; import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[-1]


def test_import_rllib_ext_sets_it_in_a_fresh_process_and_keeps_the_users():
    assert _policy_after("import rllib_ext") == "PASSIVE"
    assert _policy_after("import rllib_ext", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _policy_after("import torch, rllib_ext") == "None"
