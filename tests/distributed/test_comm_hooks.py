"""DDP comm hooks: two gloo ranks (torch.multiprocessing spawn, no Ray), PyTorch's hooks as oracle.

All two-rank checks run in one spawned pair (a spawn costs a torch import per process); each
check is reported by its own test below. Single-process tests cover validation and state I/O.
"""

from __future__ import annotations

import json
import pickle
import time

import pytest
import torch
import torch.multiprocessing as mp

from rllib_ext.distributed import (
    HOOKS,
    BF16State,
    FP16State,
    OneBitState,
    PowerSGDHookState,
    make_comm_hook,
    merge_states,
)
from tests.distributed import _workers

SPAWN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("gloo")
    context = mp.start_processes(
        _workers.worker,
        args=(str(tmp / "init"), str(tmp)),
        nprocs=_workers.WORLD_SIZE,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"two-rank checks did not finish in {SPAWN_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = {}
    for rank in range(_workers.WORLD_SIZE):
        results[rank] = json.loads((tmp / f"rank{rank}.json").read_text())
    return results


def _assert_ok(results: dict, name: str) -> dict:
    for rank, per_rank in results.items():
        outcome = per_rank.get(name)
        assert outcome is not None, f"{name} did not run on rank {rank}"
        assert outcome["status"] == "ok", f"rank {rank}:\n{outcome['status']}"
    return results[0][name]["info"]


def test_fp16_bit_identical_to_torch_hook_and_overflow_is_inf(two_rank_results):
    info = _assert_ok(two_rank_results, "check_fp16_matches_torch")
    assert info["overflowed_elements"] > 0


def test_bf16_works_on_gloo(two_rank_results):
    info = _assert_ok(two_rank_results, "check_bf16_on_gloo")
    assert info["transports"]["allgather"] == "allgather"


def test_onebit_error_feedback_bounded_over_200_steps(two_rank_results):
    info = _assert_ok(two_rank_results, "check_onebit_error_feedback")
    assert info["ef_max_err"] <= info["grad_norm"]
    assert info["no_ef_err_200"] >= 10 * info["ef_err_200"]


def test_powersgd_compiled_codec_matches_torch_ops(two_rank_results):
    info = _assert_ok(two_rank_results, "check_powersgd_codecs_agree")
    assert info["max_abs_diff"] < 1e-4


def test_onebit_compiled_codec_matches_torch_ops(two_rank_results):
    info = _assert_ok(two_rank_results, "check_onebit_codecs_agree")
    assert info["max_rel_diff"] < 1e-5


def test_onebit_warmup_then_preconditioned_keeps_element_scales(two_rank_results):
    info = _assert_ok(two_rank_results, "check_onebit_warmup_then_preconditioned")
    assert info["small_over_big"] < 1e-2


def test_onebit_warmup_under_ddp_with_several_buckets(two_rank_results):
    info = _assert_ok(two_rank_results, "check_onebit_warmup_under_ddp")
    assert info["ratios"][0] == 1.0 and info["ratios"][-1] > 10


def test_onebit_overflow_checkpoint_and_pickling(two_rank_results):
    _assert_ok(two_rank_results, "check_onebit_nonfinite_and_state")


def test_powersgd_exact_on_low_rank_and_matches_torch(two_rank_results):
    info = _assert_ok(two_rank_results, "check_powersgd")
    assert info["max_rel_err"] < 1e-5


def test_every_hook_keeps_ranks_identical_under_ddp(two_rank_results):
    info = _assert_ok(two_rank_results, "check_ddp_all_hooks")
    assert set(info) == set(HOOKS)


# ------------------------------------------------------------------------- single process


def test_registry_and_factory():
    assert set(HOOKS) == {"fp16", "bf16", "powersgd", "onebit"}
    expected = {"fp16": FP16State, "bf16": BF16State, "powersgd": PowerSGDHookState}
    expected["onebit"] = OneBitState
    for name, state_class in expected.items():
        hook, state = make_comm_hook(name, powersgd_rank=4, powersgd_start_iter=10)
        assert hook is HOOKS[name] and type(state) is state_class
    _, state = make_comm_hook("powersgd", powersgd_rank=4, powersgd_start_iter=10)
    assert state.matrix_approximation_rank == 4 and state.start_iter == 10


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "int8"}, r"'int8'.*allowed: \['bf16', 'fp16', 'onebit', 'powersgd'\].*Fix"),
        ({"name": "powersgd", "powersgd_rank": 0}, r"powersgd_rank=0.*>= 1.*Fix"),
        ({"name": "powersgd", "powersgd_rank": -3}, r"powersgd_rank=-3"),
        ({"name": "powersgd", "powersgd_start_iter": 1}, r"powersgd_start_iter=1.*>= 2.*Fix"),
        ({"name": "powersgd", "powersgd_start_iter": -1}, r"powersgd_start_iter=-1.*Fix"),
        ({"name": "bf16", "bf16_transport": "int16"}, r"'int16'.*allowed.*Fix"),
    ],
)
def test_bad_input_names_value_allowed_values_and_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_comm_hook(**kwargs)


def test_bad_types():
    with pytest.raises(TypeError, match="powersgd_rank='2'"):
        make_comm_hook("powersgd", powersgd_rank="2")
    with pytest.raises(TypeError, match="error_feedback=1"):
        OneBitState(error_feedback=1)
    with pytest.raises(ValueError, match=r"codec='c'.*\('auto', 'numba', 'torch'\).*Fix"):
        OneBitState(codec="c")
    with pytest.raises(ValueError, match=r"codec='gpu'.*Fix"):
        PowerSGDHookState(codec="gpu", start_iter=2)


def test_powersgd_start_iter_one_allowed_without_memory():
    state = PowerSGDHookState(start_iter=1, error_feedback=False, warm_start=False)
    assert state.iteration == 0


def test_pickling_without_process_group_and_stats_reset():
    for name in HOOKS:
        _, state = make_comm_hook(name, powersgd_start_iter=2)
        state._record(bytes_sent=10, bytes_uncompressed=40, comm_time_s=0.5, is_last=True)
        clone = pickle.loads(pickle.dumps(state))
        assert clone.process_group is None and type(clone) is type(state)
        stats = clone.pop_stats()
        assert stats["compression_ratio"] == 4.0 and stats["num_steps"] == 1
        assert clone.pop_stats()["bytes_sent"] == 0 and clone.pop_stats()["compression_ratio"] == 1


def test_state_format_and_hook_mismatch():
    state = OneBitState()
    state.residuals[3] = torch.ones(5)
    state.fingerprints[3] = (5,)
    saved = state.get_state()
    assert saved["hook"] == "onebit" and saved["world_size"] == 1
    assert torch.equal(saved["per_rank"][0]["buckets"][3]["residual"], torch.ones(5))
    # String keys (as some checkpoint formats produce) are accepted.
    stringly = {**saved, "per_rank": {"0": saved["per_rank"][0]}}
    restored = OneBitState()
    restored.set_state(stringly)
    assert 3 in restored._pending.entries
    with pytest.raises(ValueError, match="'onebit'.*'powersgd'.*Fix"):
        PowerSGDHookState(start_iter=2).set_state(saved)
    other = {**saved, "per_rank": {1: saved["per_rank"][0]}}
    assert sorted(merge_states([saved, other])["per_rank"]) == [0, 1]
    with pytest.raises(ValueError, match="different hooks"):
        merge_states([saved, {**saved, "hook": "fp16"}])


def test_powersgd_state_roundtrip_single_process():
    state = PowerSGDHookState(start_iter=2, matrix_approximation_rank=2)
    state.rng.randint(1000)
    state.iteration = 7
    state.fingerprints[0] = (6, 3)
    state.qt_memory[0] = torch.arange(6.0)
    state.error_memory[0] = torch.ones(9)
    restored = PowerSGDHookState(start_iter=2, matrix_approximation_rank=2)
    restored.set_state(state.get_state())
    assert restored.iteration == 7
    assert restored.rng.randint(10**9) == state.rng.randint(10**9)
    pending = restored._pending.entries[0]
    assert torch.equal(pending["qt"], torch.arange(6.0))
    assert torch.equal(pending["error"], torch.ones(9))
