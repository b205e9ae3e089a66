"""Runs inside each of the two spawned gloo ranks (see test_comm_hooks.py); asserts nothing.

Every ``run_*`` function runs on both ranks in the same order, does its collectives and RETURNS
what it saw (tensors, statistics, states); the tests compare the two ranks' values and assert.
Spawning is slow (a torch import per process), so all runs share one spawned pair.
"""

from __future__ import annotations

import datetime
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

from rllib_ext.distributed import (
    BF16State,
    FP16State,
    OneBitState,
    PowerSGDHookState,
    bf16_hook,
    fp16_hook,
    gather_state,
    onebit_hook,
    powersgd_hook,
)
from rllib_ext.distributed.cast import gloo_supports_bf16
from rllib_ext.learners.comm import HOOKS, make_comm_hook
from rllib_ext.ops.codecs import select_kernels
from rllib_ext.settings import CompressionSettings

WORLD_SIZE = 2


def settings(name: str, **kwargs: Any) -> CompressionSettings:
    """Compression settings for the hooks; 1-bit without warm-up unless asked."""
    return CompressionSettings(grad_compression=name, **{"onebit_warmup_steps": 0, **kwargs})


class FakeBucket:
    """Duck-typed ``dist.GradBucket`` over given gradient tensors (one flat buffer).

    The hooks use only ``buffer``, ``index``, ``is_last``, ``parameters`` and ``gradients``,
    which lets a run choose the exact gradient a rank contributes.
    """

    def __init__(self, grads: list[torch.Tensor], *, index: int = 0, is_last: bool = True):
        self._buffer = torch.cat([g.reshape(-1) for g in grads]).clone()
        self._shapes = [g.shape for g in grads]
        self._index = index
        self._is_last = is_last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._is_last

    def parameters(self) -> list[torch.Tensor]:
        return [torch.empty(shape) for shape in self._shapes]

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for shape in self._shapes:
            numel = int(torch.Size(shape).numel())
            views.append(self._buffer[offset : offset + numel].view(shape))
            offset += numel
        return views


def _run(hook: Callable, state: Any, grads: list[torch.Tensor], **bucket_kw) -> torch.Tensor:
    """Runs ``hook`` on a fake bucket holding ``grads``; returns the decoded flat gradient."""
    return hook(state, FakeBucket(grads, **bucket_kw)).wait().clone()


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)
    )


def _ddp(model: nn.Module) -> DDP:
    # Small buckets: several buckets per backward pass, so is_last()/index() matter.
    return DDP(model, bucket_cap_mb=0.01)


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in module.parameters()]


def _params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _backward(model: nn.Module, inputs: torch.Tensor, loss_scale: float = 1.0) -> None:
    model.zero_grad(set_to_none=True)
    (model(inputs).pow(2).mean() * loss_scale).backward()


# --------------------------------------------------------------------------------------------


def run_fp16_vs_torch(rank: int) -> dict[str, Any]:
    """Ours and PyTorch's fp16_compress_hook on two identical DDP MLPs, 3 steps, then a step
    where only rank 0's loss is scaled past the fp16 range."""
    theirs, ours = _ddp(_mlp(0)), _ddp(_mlp(0))
    theirs.register_comm_hook(None, default_hooks.fp16_compress_hook)
    state = FP16State(settings("fp16"))
    ours.register_comm_hook(state, fp16_hook)
    torch.manual_seed(100 + rank)
    steps = []
    for _ in range(3):
        inputs = torch.randn(16, 8)
        for model in (theirs, ours):
            _backward(model, inputs)
        steps.append({"theirs": _grads(theirs), "ours": _grads(ours)})
    stats = state.pop_stats()
    inputs = torch.randn(16, 8)
    for model in (theirs, ours):
        _backward(model, inputs, loss_scale=1e9 if rank == 0 else 1.0)
    overflow = {"theirs": _grads(theirs), "ours": _grads(ours)}
    return {"steps": steps, "stats": stats, "overflow": overflow}


def run_bf16_transports(rank: int) -> dict[str, Any]:
    """Every bf16 transport through DDP on gloo, and an inf on rank 0 with the all-gather."""
    transports = ["auto", "allgather", "fp32"] + (["allreduce"] if gloo_supports_bf16() else [])
    torch.manual_seed(200 + rank)
    inputs = torch.randn(16, 8)
    local = _mlp(1)
    _backward(local, inputs)
    out: dict[str, Any] = {"local_grads": _grads(local), "transports": {}}
    for transport in transports:
        model = _ddp(_mlp(1))
        state = BF16State(settings("bf16"), transport=transport)
        model.register_comm_hook(state, bf16_hook)  # DDP refuses torch's bf16 hook on CPU
        _backward(model, inputs)
        out["transports"][transport] = {
            "resolved": state.resolved_transport(),
            "grads": _grads(model),
            "stats": state.pop_stats(),
        }
    grad = torch.randn(40)
    if rank == 0:
        grad[3] = float("inf")
    out["with_inf"] = _run(bf16_hook, BF16State(settings("bf16"), transport="allgather"), [grad])
    return out


def run_onebit_error_feedback(rank: int) -> dict[str, Any]:
    """200 steps of 1-bit with and without error feedback on noise-dominated gradients (both
    ranks' gradients are computable from seeds, see ``onebit_ef_gradient``)."""
    states = {
        "ef": OneBitState(settings("onebit")),
        "no_ef": OneBitState(settings("onebit", compression_error_feedback=False)),
    }
    sums = {key: torch.zeros(512) for key in states}
    errors: dict[str, list[float]] = {key: [] for key in states}
    sum_true = torch.zeros(512)
    for t in range(200):
        sum_true += (onebit_ef_gradient(0, t) + onebit_ef_gradient(1, t)).reshape(-1) / 2
        for key, state in states.items():
            sums[key] += _run(onebit_hook, state, [onebit_ef_gradient(rank, t)])
            errors[key].append(float((sums[key] - sum_true).norm()))
    return {
        "errors": errors,
        "sum_error": sums["ef"] - sum_true,
        "residual": states["ef"].residuals[0].clone(),
        "stats": states["ef"].pop_stats(),
    }


def onebit_ef_gradient(rank: int, step: int) -> torch.Tensor:
    """Per-rank gradient = persistent mean + minibatch noise (noise-dominated, as SGD)."""
    base = torch.Generator().manual_seed(7)
    means = [0.1 * torch.randn(32, 16, generator=base) for _ in range(2)]
    g = torch.Generator().manual_seed(1000 * step + rank)
    return means[rank] + 0.5 * torch.randn(32, 16, generator=g)


def onebit_warmup_gradient(step: int, rank: int) -> torch.Tensor:
    """200 elements of scale 10, 56 of scale 0.01."""
    scales = torch.cat([torch.full((200,), 10.0), torch.full((56,), 0.01)])
    return scales * torch.randn(256, generator=torch.Generator().manual_seed(100 * step + rank))


def run_onebit_warmup_then_preconditioned(rank: int) -> dict[str, Any]:
    """onebit_warmup_steps=3: three warm-up steps, a state round trip mid-way, then one
    preconditioned step on the original and the restored state."""
    state = OneBitState(settings("onebit", onebit_warmup_steps=3))
    warmup = [_run(onebit_hook, state, [onebit_warmup_gradient(t, rank)]) for t in range(3)]
    after_warmup = {
        "step": state.step,
        "preconditioners": len(state.preconditioners),
        "stats": state.pop_stats(),
    }
    restored = OneBitState(settings("onebit", onebit_warmup_steps=3))
    restored.set_state(state.get_state())  # mid-way: the moments travel as shared state
    decoded = _run(onebit_hook, state, [onebit_warmup_gradient(3, rank)])
    again = _run(onebit_hook, restored, [onebit_warmup_gradient(3, rank)])
    frozen = OneBitState(settings("onebit", onebit_warmup_steps=3))
    frozen.set_state(restored.get_state())
    return {
        "warmup": warmup,
        "after_warmup": after_warmup,
        "decoded": decoded,
        "restored_decoded": again,
        "rms": state.preconditioners[0][1].clone(),
        "restored_step": restored.step,
        "restored_rms": restored.preconditioners[0][1].clone(),
        "frozen_rms": frozen.preconditioners[0][1].clone(),
        "stats": state.pop_stats(),
    }


def run_onebit_kernels_load_in_warmup(rank: int) -> dict[str, Any]:
    """In a fresh process: whether the numba kernels are loaded before and after the first
    warm-up call of the 1-bit hook (``onebit_warmup_steps=100``, so the call only averages)."""
    from rllib_ext.ops.codecs._select import KERNELS

    before = KERNELS.loaded
    state = OneBitState(settings("onebit", onebit_warmup_steps=100))
    _run(onebit_hook, state, [torch.ones(16)])
    return {"before": before, "after": KERNELS.loaded, "step": state.step}


def run_onebit_nonfinite_and_state(rank: int) -> dict[str, Any]:
    """inf on rank 0 at step 4; then checkpoint round trips (full, rank 0 only, other layout)
    and pickling."""
    state = OneBitState(settings("onebit"), process_group=dist.group.WORLD)
    torch.manual_seed(300 + rank)
    for _ in range(3):
        _run(onebit_hook, state, [torch.randn(100)])
    grad = torch.randn(100)
    if rank == 0:
        grad[5] = float("inf")
    out: dict[str, Any] = {"overflow": _run(onebit_hook, state, [grad])}
    out["residual_after_overflow"] = state.residuals[0].clone()
    out["next"] = _run(onebit_hook, state, [torch.randn(100)])
    out["stats"] = state.pop_stats()
    saved = state.get_state()
    merged = gather_state(state)  # every rank's entry, collected by a collective
    out["merged_ranks"] = sorted(merged["per_rank"])
    restored = OneBitState(settings("onebit"))
    restored.set_state(pickle.loads(pickle.dumps(saved)))
    nxt = torch.randn(100)
    out["continued"] = _run(onebit_hook, state, [nxt]), _run(onebit_hook, restored, [nxt])
    out["continued_residuals"] = state.residuals[0].clone(), restored.residuals[0].clone()
    # A checkpoint from learner 0 only (RLlib's default), and a fresh state.
    partial, fresh = OneBitState(settings("onebit")), OneBitState(settings("onebit"))
    partial.set_state({**merged, "per_rank": {0: merged["per_rank"][0]}})
    _run(onebit_hook, partial, [nxt])
    _run(onebit_hook, fresh, [nxt])
    out["partial_residual"] = partial.residuals[0].clone()
    out["fresh_residual"] = fresh.residuals[0].clone()
    out["restored_residual"] = restored.residuals[0].clone()
    # A restored residual for another bucket layout (same numel, two params).
    other_layout = OneBitState(settings("onebit"))
    other_layout.set_state(saved)
    _run(onebit_hook, other_layout, [nxt[:60], nxt[60:]])
    out["other_layout_pending"] = sorted(other_layout._pending.entries)
    clone = pickle.loads(pickle.dumps(state))
    out["clone_group"] = clone.process_group
    out["clone_residual"] = clone.residuals[0].clone()
    out["residual"] = state.residuals[0].clone()
    return out


def _orthonormal(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=torch.float64))[0]


def powersgd_gradients(t: int, rank: int, r: int = 4, n: int = 64, m: int = 48):
    """``(this rank's [matrix, bias], mean over ranks flat)``: every rank's matrix and their mean
    have rank r (``L A_t diag(s_r) B_t R^T``, singular values in [1, 2]); plus a bias vector,
    which PowerSGD all-reduces uncompressed."""
    left, right = _orthonormal(n, r, 1), _orthonormal(m, r, 2)
    a, b = _orthonormal(r, r, 10 * t + 3), _orthonormal(r, r, 10 * t + 4)
    per_rank = []
    for rr in range(WORLD_SIZE):
        g = torch.Generator().manual_seed(10 * t + 5 + rr)
        sigma = 1 + torch.rand(r, generator=g, dtype=torch.float64)
        matrix = (left @ a @ torch.diag(sigma) @ b @ right.T).float()
        per_rank.append((matrix, torch.randn(n, generator=g)))
    mean = torch.cat(
        [
            sum(p[0] for p in per_rank).reshape(-1) / WORLD_SIZE,
            sum(p[1] for p in per_rank) / WORLD_SIZE,
        ]
    )
    return list(per_rank[rank]), mean


def run_powersgd(rank: int) -> dict[str, Any]:
    """Ours and PyTorch's powerSGD_hook on rank-4 gradients for 6 steps; an inf on rank 0 at
    step 6; recovery at 7; checkpoint round trip at 8; pickling at 9."""
    ours = PowerSGDHookState(
        settings("powersgd", powersgd_rank=4, powersgd_start_iter=2), orthogonalization_epsilon=1e-8
    )
    oracle = torch_powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=4,
        start_powerSGD_iter=2,
        orthogonalization_epsilon=1e-8,
        compression_stats_logging_frequency=10**9,
    )
    out: dict[str, Any] = {"ours": [], "torch": []}
    for t in range(6):
        grads, _ = powersgd_gradients(t, rank)
        out["ours"].append(_run(powersgd_hook, ours, grads))
        out["torch"].append(_run(torch_powersgd.powerSGD_hook, oracle, grads))
    out["stats"] = ours.pop_stats()
    grads, _ = powersgd_gradients(6, rank)
    if rank == 0:
        grads[0][3, 7] = float("inf")
    out["overflow"] = _run(powersgd_hook, ours, grads)
    out["overflow_stats"] = ours.pop_stats()
    out["recovered"] = _run(powersgd_hook, ours, powersgd_gradients(7, rank)[0])
    restored = PowerSGDHookState(
        settings("powersgd", powersgd_rank=4, powersgd_start_iter=2), orthogonalization_epsilon=1e-8
    )
    restored.set_state(pickle.loads(pickle.dumps(ours.get_state())))
    grads, _ = powersgd_gradients(8, rank)
    out["restored"] = _run(powersgd_hook, ours, grads), _run(powersgd_hook, restored, grads)
    ours.process_group = dist.group.WORLD
    clone = pickle.loads(pickle.dumps(ours))
    out["clone_group"], out["iterations"] = clone.process_group, (clone.iteration, ours.iteration)
    grads, _ = powersgd_gradients(9, rank)
    out["unpickled"] = _run(powersgd_hook, ours, grads), _run(powersgd_hook, clone, grads)
    return out


def run_ddp_all_hooks(rank: int) -> dict[str, Any]:
    """Each hook through make_comm_hook on a real DDP model with SGD, 4 steps: grads per step,
    parameters at the end, statistics."""
    out = {}
    for name in HOOKS:
        hook, state = make_comm_hook(settings(name, powersgd_rank=2, powersgd_start_iter=2))
        model = _ddp(_mlp(2))
        model.register_comm_hook(state, hook)
        records: list[Any] = []
        state.add_observer(records.append)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(400 + rank)
        grads = []
        for _ in range(4):
            _backward(model, torch.randn(16, 8))
            grads.append(_grads(model))
            optimizer.step()
        out[name] = {
            "grads": grads,
            "params": _params(model),
            "stats": state.pop_stats(),
            "records": records,
        }
    return out


def run_onebit_warmup_under_ddp(rank: int) -> dict[str, Any]:
    """Several buckets per backward (DDP rebuilds them after step 1): 2 warm-up steps, then
    preconditioned 1-bit, with Adam, 6 steps."""
    hook, state = make_comm_hook(settings("onebit", onebit_warmup_steps=2))
    model = _ddp(_mlp(3))
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    grads, ratios = [], []
    torch.manual_seed(500 + rank)
    for _ in range(6):
        _backward(model, torch.randn(16, 8))
        grads.append(_grads(model))
        optimizer.step()
        ratios.append(state.pop_stats()["compression_ratio"])
    return {
        "grads": grads,
        "params": _params(model),
        "ratios": ratios,
        "preconditioned_buckets": len(state.preconditioners),
    }


def run_onebit_kernels(rank: int) -> dict[str, Any]:
    """1-bit with the numba kernels and with torch ops, through warm-up, preconditioning and
    error feedback, 8 steps; which kernels the selection rule picks."""
    states = {
        kernel: OneBitState(settings("onebit", onebit_warmup_steps=2), kernel=kernel)
        for kernel in ("numba", "torch")
    }
    decoded: dict[str, list[torch.Tensor]] = {kernel: [] for kernel in states}
    for t in range(8):
        g = torch.Generator().manual_seed(10 * t + rank)
        grads = [torch.randn(37, 11, generator=g), torch.randn(5003, generator=g) * 1e-3]
        for kernel, state in states.items():
            decoded[kernel].append(_run(onebit_hook, state, [x.clone() for x in grads]))
    return {
        "decoded": decoded,
        "residuals": {kernel: state.residuals[0].clone() for kernel, state in states.items()},
        "compiled": {
            kernel: state.pop_stats()["num_compiled_buckets"] for kernel, state in states.items()
        },
        "auto_fp32": select_kernels("auto", torch.zeros(8)) is not None,
        "auto_fp64": select_kernels("auto", torch.zeros(8, dtype=torch.float64)) is not None,
    }


def run_powersgd_kernels(rank: int) -> dict[str, Any]:
    """PowerSGD with the numba kernels and with torch ops, error feedback and a bias, 6 steps."""
    states = {
        kernel: PowerSGDHookState(
            settings("powersgd", powersgd_rank=2, powersgd_start_iter=2), kernel=kernel
        )
        for kernel in ("numba", "torch")
    }
    decoded: dict[str, list[torch.Tensor]] = {kernel: [] for kernel in states}
    for t in range(6):
        g = torch.Generator().manual_seed(20 * t + rank)
        grads = [torch.randn(40, 30, generator=g), torch.randn(40, generator=g)]
        for kernel, state in states.items():
            decoded[kernel].append(_run(powersgd_hook, state, [x.clone() for x in grads]))
    return {
        "decoded": decoded,
        "errors": {kernel: state.error_memory[0].clone() for kernel, state in states.items()},
        "compiled": {
            kernel: state.pop_stats()["num_compiled_buckets"] for kernel, state in states.items()
        },
    }


OLD_STATES = os.path.join(os.path.dirname(__file__), "data", "hook_states_v1.pt")


def old_state_gradients(t: int) -> list[list[torch.Tensor]]:
    """Step ``t``'s gradients of the two buckets the old states were saved with."""
    grads = []
    for index in (0, 1):
        g = torch.Generator().manual_seed(10 * t + index)
        grads.append([torch.randn(12, 10, generator=g), torch.randn(12, generator=g)])
    return grads


def run_old_checkpoint(rank: int) -> dict[str, Any]:
    """One rank: restores hook states saved by the hooks before the codec split (commit
    ed14c35: ``OneBitState(warmup_steps=2)``, ``PowerSGDHookState(matrix_approximation_rank=2,
    start_iter=2)``, 4 steps of two buckets on one rank) and runs step 4."""
    saved = torch.load(OLD_STATES, weights_only=False)
    onebit = OneBitState(settings("onebit", onebit_warmup_steps=2))
    onebit.set_state(saved["onebit"])
    powersgd = PowerSGDHookState(settings("powersgd", powersgd_rank=2, powersgd_start_iter=2))
    powersgd.set_state(saved["powersgd"])
    out: dict[str, Any] = {"saved": saved, "onebit": [], "powersgd": []}
    for index, grads in enumerate(old_state_gradients(4)):
        for name, hook, state in (
            ("onebit", onebit_hook, onebit),
            ("powersgd", powersgd_hook, powersgd),
        ):
            bucket_grads = [g.clone() for g in grads]
            out[name].append(_run(hook, state, bucket_grads, index=index, is_last=index == 1))
    return out


RUNS = [
    run_fp16_vs_torch,
    run_bf16_transports,
    run_onebit_error_feedback,
    run_onebit_warmup_then_preconditioned,
    run_onebit_warmup_under_ddp,
    run_onebit_nonfinite_and_state,
    run_onebit_kernels,
    run_powersgd,
    run_powersgd_kernels,
    run_ddp_all_hooks,
]


def worker(
    rank: int, init_file: str, out_dir: str, world_size: int = WORLD_SIZE, runs: tuple = ()
) -> None:
    """Spawn target: runs ``runs`` (default :data:`RUNS`), pickles ``{name: {"value": ...} or
    {"error": traceback}}`` to ``rank<r>.pkl``."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    results: dict[str, Any] = {}
    try:
        for run in runs or RUNS:
            try:
                results[run.__name__] = {"value": run(rank)}
            except Exception:
                results[run.__name__] = {"error": traceback.format_exc()}
            dist.barrier()
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as handle:
            pickle.dump(results, handle)
        dist.destroy_process_group()
