"""Step 3b of ``benchmarks/gpu_check.py``: every comm hook under DDP on two spawned ranks.

Each hook comes from ``make_comm_hook`` (what the learner registers) on a small DDP MLP with
SGD, two warm-up steps for PowerSGD and 1-bit, then compressed steps; the ranks return what they
saw and the parent compares them (bit-identical gradients and parameters) and against the
uncompressed mean of both ranks' local gradients. Over gloo with CUDA tensors (both ranks on the
one GPU) where there is a GPU, CPU tensors in ``--dry-run``; over NCCL only with two GPUs (one
per rank). A hook whose collective the backend refuses for these tensors is "not run: why".
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

HOOK_NAMES = ("fp16", "bf16", "powersgd", "onebit")
TWO_RANK_STEPS = 4  # with 2 warm-up steps for PowerSGD and 1-bit: 2 compressed steps


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 3),
    )


def _flat_grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in module.parameters()]).cpu()


def _rank_run(rank: int, name: str, device: torch.device) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from rllib_ext.learners.comm import make_comm_hook
    from rllib_ext.settings import CompressionSettings

    settings = CompressionSettings(
        grad_compression=name, powersgd_rank=2, powersgd_start_iter=2, onebit_warmup_steps=2
    )
    hook, state = make_comm_hook(settings)
    local = _mlp().to(device)
    model = DDP(
        _mlp().to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=0.01,
    )
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(TWO_RANK_STEPS, 16, 8, generator=torch.Generator().manual_seed(100 + rank))
    grads, local_grads = [], []
    for step in range(TWO_RANK_STEPS):
        x = inputs[step].to(device)
        local.load_state_dict(model.module.state_dict())
        for net in (model, local):
            net.zero_grad(set_to_none=True)
            net(x).pow(2).mean().backward()
        grads.append(_flat_grads(model))
        local_grads.append(_flat_grads(local))
        optimizer.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return {
        "grads": grads,
        "local_grads": local_grads,
        "params": params,
        "stats": state.pop_stats(),
    }


def _rank_worker(rank: int, init_file: str, out_dir: str, backend: str, device_type: str) -> None:
    """Spawn target: every hook in turn on this rank; pickles what it saw (asserts nothing)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    # gloo: both ranks share GPU 0; NCCL needs one GPU per rank.
    device = (
        torch.device(device_type, (rank if backend == "nccl" else 0))
        if device_type == "cuda"
        else torch.device("cpu")
    )
    results: dict[str, Any] = {}
    try:
        for name in HOOK_NAMES:
            try:
                results[name] = {"value": _rank_run(rank, name, device)}
            except Exception:  # noqa: BLE001 - reported per hook, the other hooks still run
                results[name] = {"error": traceback.format_exc()}
            dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
        dist.destroy_process_group()


def _spawn(backend: str, device_type: str, timeout_s: float) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gpu_check_ranks_") as tmp:
        context = mp.start_processes(
            _rank_worker,
            args=(os.path.join(tmp, "init"), tmp, backend, device_type),
            nprocs=2,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"two {backend} ranks did not finish in {timeout_s:.0f} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        return [pickle.loads(Path(tmp, f"rank{r}.pkl").read_bytes()) for r in range(2)]


_UNSUPPORTED = ("not supported", "unsupported", "not implemented", "only supports", "no support")
"""Words of torch's errors for a collective that a backend cannot run on these tensors."""


def _rank_row(backend: str, device: str, name: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "backend": backend,
        "device": device,
        "hook": name,
        "case": f"{name} over {backend}, {device} tensors",
    }
    errors = [r[name]["error"] for r in ranks if "error" in r[name]]
    if errors:
        last = errors[0].strip().splitlines()[-1]
        unsupported = any(s in errors[0].lower() for s in _UNSUPPORTED)
        row.update(error=errors[0], summary=last[:100])
        row["check"] = f"not run: {last[:80]}" if unsupported else "FAIL error"
        row["failed"] = not unsupported
        row["ranks_identical"] = None
        return row
    a, b = (r[name]["value"] for r in ranks)
    identical = all(
        torch.equal(x, y)
        for x, y in zip(a["grads"] + [a["params"]], b["grads"] + [b["params"]], strict=True)
    )
    # The uncompressed answer of the first step: the mean of both ranks' local gradients.
    mean = (a["local_grads"][0] + b["local_grads"][0]) / 2
    last_mean = (a["local_grads"][-1] + b["local_grads"][-1]) / 2
    row.update(
        ranks_identical=identical,
        rel_err_first_step=float((a["grads"][0] - mean).norm() / mean.norm()),
        rel_err_last_step=float((a["grads"][-1] - last_mean).norm() / last_mean.norm()),
        stats=a["stats"],
    )
    sent = a["stats"]["bytes_sent"] > 0
    row["summary"] = (
        f"ranks identical {identical}, rel err last step {row['rel_err_last_step']:.2g}, "
        f"ratio {a['stats']['compression_ratio']:.2f}"
    )
    row["check"] = "ranks pass" if identical and sent else "FAIL ranks differ or nothing sent"
    row["failed"] = not (identical and sent)
    return row


def run_two_ranks(device: torch.device, *, timeout_s: float) -> list[dict[str, Any]]:
    """The hooks under DDP on two ranks: gloo (CUDA tensors on one shared GPU when there is
    one), NCCL with one GPU per rank where there are two; rows say what did not run. The ranks
    are killed after ``timeout_s`` per backend (``TimeoutError``)."""
    import torch.distributed as dist

    rows = []
    device_type = device.type
    if not dist.is_available() or not dist.is_gloo_available():
        return [{"case": "gloo", "summary": "-", "check": "not run: torch without gloo"}]
    started = time.monotonic()
    ranks = _spawn("gloo", device_type, timeout_s)
    rows += [_rank_row("gloo", device_type, name, ranks) for name in HOOK_NAMES]
    gpus = torch.cuda.device_count() if device_type == "cuda" else 0
    if gpus >= 2 and dist.is_nccl_available():
        ranks = _spawn("nccl", "cuda", max(timeout_s - (time.monotonic() - started), 5))
        rows += [_rank_row("nccl", "cuda", name, ranks) for name in HOOK_NAMES]
    else:
        reason = (
            f"{gpus} GPU(s) visible and NCCL needs one GPU per rank"
            if device_type == "cuda"
            else "no CUDA (dry run)"
        )
        rows.append(
            {
                "case": "hooks over nccl",
                "backend": "nccl",
                "summary": "-",
                "check": f"not run: {reason}",
            }
        )
    return rows
