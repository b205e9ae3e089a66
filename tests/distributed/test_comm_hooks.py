"""DDP comm hooks: two gloo ranks (torch.multiprocessing spawn, no Ray), PyTorch's hooks as oracle.

All two-rank runs happen in one spawned pair (a spawn costs a torch import per process); the
workers return what they saw (``_workers.py``) and every assertion is here. Single-process
tests cover the factory, state I/O and old checkpoints.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from rllib_ext.distributed import (
    BF16State,
    FP16State,
    OneBitState,
    PowerSGDHookState,
    merge_states,
)
from rllib_ext.distributed.onebit import PRECONDITIONER_FLOOR
from rllib_ext.learners.comm import HOOKS, make_comm_hook
from rllib_ext.settings import CompressionSettings
from tests.distributed import _workers
from tests.distributed._workers import settings

SPAWN_TIMEOUT_S = 240
RANKS = range(_workers.WORLD_SIZE)


def _spawn(tmp: Path, world_size: int, runs: tuple = ()) -> dict[int, dict[str, Any]]:
    """Runs the worker on ``world_size`` gloo ranks; each rank's ``{run name: outcome}``."""
    context = mp.start_processes(
        _workers.worker,
        args=(str(tmp / "init"), str(tmp), world_size, runs),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"gloo runs did not finish in {SPAWN_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return {r: pickle.loads((tmp / f"rank{r}.pkl").read_bytes()) for r in range(world_size)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return _spawn(tmp_path_factory.mktemp("gloo"), _workers.WORLD_SIZE)


def _values(two_ranks: dict, name: str) -> list[Any]:
    """``[rank 0's value, rank 1's value]`` of one run; fails with the worker's traceback."""
    values = []
    for rank in RANKS:
        outcome = two_ranks[rank][name]
        assert "error" not in outcome, f"rank {rank}:\n{outcome.get('error')}"
        values.append(outcome["value"])
    return values


def _same_on_ranks(per_rank: list[torch.Tensor]) -> bool:
    """Bit-identical on every rank (NaNs compared as equal)."""
    first = per_rank[0].nan_to_num(1.0)
    return all(torch.equal(first, other.nan_to_num(1.0)) for other in per_rank[1:])


def test_fp16_bit_identical_to_torch_hook_and_overflow_is_inf(two_ranks):
    runs = _values(two_ranks, "run_fp16_vs_torch")
    for rank, run in enumerate(runs):
        for step in run["steps"]:
            for theirs, ours in zip(step["theirs"], step["ours"], strict=True):
                assert torch.equal(theirs, ours), f"rank {rank}: differs from fp16_compress_hook"
        assert run["stats"]["compression_ratio"] == 2.0
        assert run["stats"]["num_steps"] == 3 and run["stats"]["num_buckets"] >= 3
        # Rank 0's loss-scaled gradient arrives as inf on both ranks, as with PyTorch's hook.
        for theirs, ours in zip(run["overflow"]["theirs"], run["overflow"]["ours"], strict=True):
            assert torch.equal(theirs.nan_to_num(0.0), ours.nan_to_num(0.0))
            assert torch.equal(theirs.isinf(), ours.isinf())
        assert sum(int((~torch.isfinite(g)).sum()) for g in run["overflow"]["ours"]) > 0
    for key in ("steps", "overflow"):
        grads = [
            [g for s in (r[key] if key == "steps" else [r[key]]) for g in s["ours"]] for r in runs
        ]
        for per_rank in zip(*grads, strict=True):
            assert _same_on_ranks(list(per_rank))


def test_bf16_every_transport_on_gloo(two_ranks):
    runs = _values(two_ranks, "run_bf16_transports")
    local = [run["local_grads"] for run in runs]  # what each rank contributed, per parameter
    assert runs[0]["transports"]["allgather"]["resolved"] == "allgather"
    expected_ratio = {"allgather": 2.0, "allreduce": 2.0, "fp32": 1.0}
    for transport, result in runs[0]["transports"].items():
        assert result["stats"]["compression_ratio"] == expected_ratio[result["resolved"]]
        for i, got in enumerate(result["grads"]):
            per_rank = torch.stack([grads[i] for grads in local])
            assert _same_on_ranks([run["transports"][transport]["grads"][i] for run in runs])
            # bf16 keeps 8 significant bits of each rank's value: error relative to the inputs.
            exact, scale = per_rank.mean(0), per_rank.abs().mean(0)
            assert ((got - exact).abs() <= 2**-7 * scale + 1e-30).all(), transport
            assert torch.equal(got, got.to(torch.bfloat16).float()), "not bf16 precision"
            if result["resolved"] in ("allgather", "fp32"):
                rounded = per_rank.to(torch.bfloat16).float()
                want = (rounded.sum(0) / 2).to(torch.bfloat16).float()
                assert torch.equal(got, want), transport
    # inf stays inf (bf16 has fp32's range, so nothing overflows that was finite before).
    for run in runs:
        out = run["with_inf"]
        assert torch.isinf(out[3]) and torch.isfinite(out[torch.arange(40) != 3]).all()


def test_onebit_error_feedback_bounded_over_200_steps(two_ranks):
    runs = _values(two_ranks, "run_onebit_error_feedback")
    ef, no_ef = runs[0]["errors"]["ef"], runs[0]["errors"]["no_ef"]
    assert runs[0]["errors"] == runs[1]["errors"]  # identical decoded sums on both ranks
    # Telescoping identity: sum_decoded - sum_true = -(1/W) sum_r residual_r.
    residual_mean = torch.stack([run["residual"] for run in runs]).mean(0)
    torch.testing.assert_close(runs[0]["sum_error"], -residual_mean, atol=1e-3, rtol=0)
    # Bounded by one step's gradient norm at every step (measured max ~0.6x), and flat: the
    # second hundred steps add nothing (linear growth would double it).
    grad_norm = float(_workers.onebit_ef_gradient(0, 0).norm())
    assert max(ef) <= grad_norm
    assert max(ef[100:]) <= 1.25 * max(ef[:100]), "error grows with steps"
    assert no_ef[-1] >= 10 * ef[-1]
    assert runs[0]["stats"]["compression_ratio"] > 25  # 512 grads: 2048 B vs 64 + 4 B


def test_onebit_warmup_then_preconditioned_keeps_element_scales(two_ranks):
    runs = _values(two_ranks, "run_onebit_warmup_then_preconditioned")
    run = runs[0]
    squares = torch.zeros(256)
    for t, decoded in enumerate(run["warmup"]):  # exact averaging all-reduces
        mean = (_workers.onebit_warmup_gradient(t, 0) + _workers.onebit_warmup_gradient(t, 1)) / 2
        torch.testing.assert_close(decoded, mean)
        squares += mean * mean
    assert run["after_warmup"]["step"] == 3 and run["after_warmup"]["preconditioners"] == 0
    assert run["after_warmup"]["stats"]["compression_ratio"] == 1.0  # warm-up sent plain fp32
    torch.testing.assert_close(run["decoded"], run["restored_decoded"])  # same preconditioner
    assert _same_on_ranks([r["decoded"] for r in runs])
    want_rms = (squares / 3).sqrt()
    floor = PRECONDITIONER_FLOOR * float(want_rms.mean())
    torch.testing.assert_close(run["rms"], want_rms.clamp(min=floor))
    assert (want_rms[200:] > floor).all()  # 1000x smaller gradients stay above the floor
    assert run["restored_step"] == 4 and torch.equal(run["restored_rms"], run["rms"])
    assert torch.equal(run["frozen_rms"], run["rms"])  # the frozen RMS is checkpointed
    rms = run["rms"]
    normalized = [_workers.onebit_warmup_gradient(3, r) / rms for r in RANKS]
    want = torch.stack([n.abs().mean() * torch.sign(n) for n in normalized]).mean(0) * rms
    torch.testing.assert_close(run["decoded"], want, rtol=1e-4, atol=0.0)
    small = run["decoded"][200:].abs().max() / run["decoded"][:200].abs().max()
    assert small < 1e-2  # the small-gradient tensor keeps its own scale
    assert run["stats"]["compression_ratio"] > 25


def test_onebit_warmup_under_ddp_with_several_buckets(two_ranks):
    runs = _values(two_ranks, "run_onebit_warmup_under_ddp")
    for step in range(6):
        for i in range(len(runs[0]["grads"][step])):
            per_rank = [run["grads"][step][i] for run in runs]
            assert _same_on_ranks(per_rank) and torch.isfinite(per_rank[0]).all()
    for per_rank in zip(*(run["params"] for run in runs), strict=True):
        assert _same_on_ranks(list(per_rank))
    assert runs[0]["preconditioned_buckets"] >= 2  # one per bucket
    ratios = runs[0]["ratios"]
    assert ratios[0] == 1.0 and ratios[-1] > 10


def test_onebit_overflow_checkpoint_and_pickling(two_ranks):
    runs = _values(two_ranks, "run_onebit_nonfinite_and_state")
    assert _same_on_ranks([run["overflow"] for run in runs])
    for rank, run in enumerate(runs):
        assert not torch.isfinite(run["overflow"]).any(), "overflow hidden by 1-bit decode"
        assert torch.isfinite(run["residual_after_overflow"]).all(), "residual poisoned by inf"
        assert torch.isfinite(run["next"]).all()
        assert run["stats"]["num_nonfinite_buckets"] == 1
        assert run["merged_ranks"] == [0, 1]
        # A fresh state restored from get_state() continues exactly like the original.
        assert torch.equal(*run["continued"]) and torch.equal(*run["continued_residuals"])
        # A checkpoint from learner 0 only: rank 1 starts from a zero residual.
        expected = run["restored_residual"] if rank == 0 else run["fresh_residual"]
        assert torch.equal(run["partial_residual"], expected)
        assert run["other_layout_pending"] == [0], "residual applied to a different layout"
        assert run["clone_group"] is None and torch.equal(run["clone_residual"], run["residual"])


def test_powersgd_exact_on_low_rank_and_matches_torch(two_ranks):
    runs = _values(two_ranks, "run_powersgd")
    for rank, run in enumerate(runs):
        for t, (ours, theirs) in enumerate(zip(run["ours"], run["torch"], strict=True)):
            # Same algorithm and same random Q; PyTorch orthogonalises with QR for r > 2
            # (columns may flip sign, P Q^T does not): rounding only.
            assert float((ours - theirs).norm() / theirs.norm()) < 1e-5, f"step {t}"
            mean = _workers.powersgd_gradients(t, rank)[1]
            # Steps 0-1 plain; step 2 first compressed from a random Q (conditioning-limited in
            # fp32); from step 3 the warm-started Q spans the row space: exact.
            tolerance = 1e-3 if t == 2 else 1e-5
            assert float((ours - mean).norm() / mean.norm()) < tolerance, f"step {t}"
        n, m, r = 64, 48, 4
        plain, compressed = n * m + n, (n + m) * r + n
        assert run["stats"]["bytes_sent"] == 4 * (2 * plain + 4 * compressed)
        assert not torch.isfinite(run["overflow"]).all()
        assert run["overflow_stats"]["num_nonfinite_buckets"] == 1
        mean = _workers.powersgd_gradients(7, rank)[1]
        assert float((run["recovered"] - mean).norm() / mean.norm()) < 1e-5, "no recovery"
        assert torch.equal(*run["restored"]), "restored PowerSGD state diverges"
        assert run["clone_group"] is None and run["iterations"][0] == run["iterations"][1]
        assert torch.equal(*run["unpickled"]), "unpickled PowerSGD state diverges"
    for key in ("ours", "overflow"):
        per_step = [run[key] if key == "ours" else [run[key]] for run in runs]
        for per_rank in zip(*per_step, strict=True):
            assert _same_on_ranks(list(per_rank))


def test_every_hook_keeps_ranks_identical_under_ddp_and_reports_buckets(two_ranks):
    runs = _values(two_ranks, "run_ddp_all_hooks")
    assert set(runs[0]) == set(HOOKS)
    ratios = {}
    for name in HOOKS:
        for step in range(4):
            for per_rank in zip(*(run[name]["grads"][step] for run in runs), strict=True):
                assert _same_on_ranks(list(per_rank)), name
        for per_rank in zip(*(run[name]["params"] for run in runs), strict=True):
            assert _same_on_ranks(list(per_rank)), name
        stats, records = runs[0][name]["stats"], runs[0][name]["records"]
        assert stats["num_steps"] == 4 and stats["bytes_sent"] > 0 and stats["comm_time_s"] > 0
        # The observer saw every bucket, and the sums are the sums of its records.
        assert len(records) == stats["num_buckets"] and {r.hook for r in records} == {name}
        assert sum(r.bytes_sent for r in records) == stats["bytes_sent"]
        assert sum(r.is_last for r in records) == 4
        assert all(r.comm_s >= r.decode_s >= 0 for r in records)
        ratios[name] = stats["compression_ratio"]
    assert ratios["fp16"] == 2.0 and ratios["onebit"] > 20 and ratios["powersgd"] > 1


def test_onebit_kernels_compile_in_the_first_warmup_call_not_when_warmup_ends(tmp_path: Path):
    outcome = _spawn(tmp_path, 2, runs=(_workers.run_onebit_kernels_load_in_warmup,))
    for rank in (0, 1):
        result = outcome[rank]["run_onebit_kernels_load_in_warmup"]
        assert "error" not in result, result.get("error")
        assert result["value"] == {"before": False, "after": True, "step": 1}


def test_onebit_numba_kernels_match_torch_ops_in_the_hook(two_ranks):
    runs = _values(two_ranks, "run_onebit_kernels")
    for run in runs:
        assert run["compiled"] == {"numba": 6, "torch": 0}  # 2 warm-up steps, then 6
        assert run["auto_fp32"] and not run["auto_fp64"]
        for numba, torch_ops in zip(run["decoded"]["numba"], run["decoded"]["torch"], strict=True):
            # Only the scale mean(|c|) is summed in another order (float64 vs a float32 dot).
            torch.testing.assert_close(numba, torch_ops, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(*run["residuals"].values(), rtol=1e-4, atol=1e-6)
    for per_rank in zip(*(run["decoded"]["numba"] for run in runs), strict=True):
        assert _same_on_ranks(list(per_rank))


def test_powersgd_numba_kernels_match_torch_ops_in_the_hook(two_ranks):
    runs = _values(two_ranks, "run_powersgd_kernels")
    for run in runs:
        assert run["compiled"] == {"numba": 4, "torch": 0}  # 2 plain steps, then 4
        for numba, torch_ops in zip(run["decoded"]["numba"], run["decoded"]["torch"], strict=True):
            torch.testing.assert_close(numba, torch_ops, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(*run["errors"].values(), rtol=1e-4, atol=1e-5)
    for per_rank in zip(*(run["decoded"]["numba"] for run in runs), strict=True):
        assert _same_on_ranks(list(per_rank))


# ------------------------------------------------------------------------- single process


def test_factory_reads_the_settings_and_nothing_else():
    expected = {"fp16": FP16State, "bf16": BF16State, "powersgd": PowerSGDHookState}
    expected["onebit"] = OneBitState
    for name, state_class in expected.items():
        hook, state = make_comm_hook(CompressionSettings(grad_compression=name))
        assert hook is HOOKS[name][0] and type(state) is state_class
    defaults = CompressionSettings()
    _, powersgd = make_comm_hook(CompressionSettings(grad_compression="powersgd"))
    assert powersgd.matrix_approximation_rank == defaults.powersgd_rank
    assert powersgd.start_iter == defaults.powersgd_start_iter
    assert powersgd.error_feedback == defaults.compression_error_feedback
    _, onebit = make_comm_hook(
        CompressionSettings(grad_compression="onebit", compression_error_feedback=False)
    )
    assert onebit.warmup_steps == defaults.onebit_warmup_steps and not onebit.error_feedback
    with pytest.raises(ValueError, match=r"grad_compression=None.*Fix"):
        make_comm_hook(CompressionSettings())


def test_hook_options_outside_the_settings_name_value_and_fix():
    with pytest.raises(ValueError, match=r"kernel='c'.*\('auto', 'numba', 'torch'\).*Fix"):
        OneBitState(settings("onebit"), kernel="c")
    with pytest.raises(ValueError, match=r"kernel='gpu'.*Fix"):
        PowerSGDHookState(settings("powersgd"), kernel="gpu")
    with pytest.raises(ValueError, match=r"'int16'.*allowed.*Fix"):
        BF16State(settings("bf16"), transport="int16")
    with pytest.raises(ValueError, match=r"min_compression_rate=0.*Fix"):
        PowerSGDHookState(settings("powersgd"), min_compression_rate=0)


def test_pickling_drops_group_and_observers_keeps_stats():
    seen: list[Any] = []
    for name, (_, state_class) in HOOKS.items():
        state = state_class(settings(name))
        state.add_observer(seen.append)
        record = _workers_record(name)
        state.stats.record(record)
        clone = pickle.loads(pickle.dumps(state))
        assert clone.process_group is None and type(clone) is type(state)
        stats = clone.pop_stats()
        assert stats["compression_ratio"] == 4.0 and stats["num_steps"] == 1
        assert clone.pop_stats()["bytes_sent"] == 0 and clone.pop_stats()["compression_ratio"] == 1
        clone.stats.record(record)  # the clone has no observers
    assert len(seen) == len(HOOKS)


def _workers_record(name: str):
    from rllib_ext.distributed import BucketRecord

    return BucketRecord(
        hook=name,
        bucket_index=0,
        is_last=True,
        bytes_uncompressed=40,
        bytes_sent=10,
        start_s=0.0,
        encode_s=0.1,
        comm_s=0.5,
        decode_s=0.1,
        compiled=False,
        nonfinite=False,
    )


def test_state_format_and_hook_mismatch():
    state = OneBitState(settings("onebit"))
    state.residuals[3] = torch.ones(5)
    state.fingerprints[3] = (5,)
    saved = state.get_state()
    assert saved["hook"] == "onebit" and saved["world_size"] == 1
    assert torch.equal(saved["per_rank"][0]["buckets"][3]["residual"], torch.ones(5))
    # String keys (as some checkpoint formats produce) are accepted.
    stringly = {**saved, "per_rank": {"0": saved["per_rank"][0]}}
    restored = OneBitState(settings("onebit"))
    restored.set_state(stringly)
    assert 3 in restored._pending.entries
    with pytest.raises(ValueError, match="'onebit'.*'powersgd'.*Fix"):
        PowerSGDHookState(settings("powersgd")).set_state(saved)
    other = {**saved, "per_rank": {1: saved["per_rank"][0]}}
    assert sorted(merge_states([saved, other])["per_rank"]) == [0, 1]
    with pytest.raises(ValueError, match="different hooks"):
        merge_states([saved, {**saved, "hook": "fp16"}])


def test_powersgd_state_roundtrip_single_process():
    state = PowerSGDHookState(settings("powersgd", powersgd_rank=2, powersgd_start_iter=2))
    state.rng.randint(1000)
    state.iteration = 7
    state.fingerprints[0] = (6, 3)
    state.qt_memory[0] = torch.arange(6.0)
    state.error_memory[0] = torch.ones(9)
    restored = PowerSGDHookState(settings("powersgd", powersgd_rank=2, powersgd_start_iter=2))
    restored.set_state(state.get_state())
    assert restored.iteration == 7
    assert restored.rng.randint(10**9) == state.rng.randint(10**9)
    pending = restored._pending.entries[0]
    assert torch.equal(pending["qt"], torch.arange(6.0))
    assert torch.equal(pending["error"], torch.ones(9))


def test_hook_states_saved_before_the_codec_split_restore_and_continue(tmp_path: Path):
    """States written by the hooks before the codec split (commit ed14c35, one rank, 4 steps of
    two buckets, see ``_workers.run_old_checkpoint``) restore unconverted, and the next step
    equals what the old hooks computed when they continued without stopping."""
    outcome = _spawn(tmp_path, 1, (_workers.run_old_checkpoint,))[0]["run_old_checkpoint"]
    assert "error" not in outcome, outcome.get("error")
    run = outcome["value"]
    saved = run["saved"]
    assert saved["onebit"]["format_version"] == saved["powersgd"]["format_version"] == 1
    for name in ("onebit", "powersgd"):
        for got, want in zip(run[name], saved[f"next_{name}"], strict=True):
            assert torch.equal(got, want), name
