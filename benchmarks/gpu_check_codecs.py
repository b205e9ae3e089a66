"""Step 3 of ``benchmarks/gpu_check.py``: the gradient codecs on CUDA tensors, against references.

:func:`run_codecs`: each codec of :mod:`rllib_ext.ops.codecs` on the device against its
``*_reference.py``, with the tolerances of ``tests/ops/test_compression_*.py`` (cast: exact;
1-bit: signs exact, scale rtol 1e-6, residual atol 2e-6 x scale, decode rtol 1e-6 + atol 1.5e-6 x
max; PowerSGD: rtol 1e-4 + atol 1e-5 x max), then encode/decode throughput in GB/s of fp32
gradient. The kernels are chosen as the hooks choose them (``select_kernels("auto", ...)``:
torch ops on CUDA); ``--dry-run`` forces torch ops on the CPU so it runs the CUDA code path.
The hooks that move these bytes between ranks: ``gpu_check_ranks.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

CHECK_SIZES = (1, 7, 8, 9, 63, 4095, 4096, 4097, 10_001)
POWERSGD_SHAPES = ((1, 1, 1), (7, 13, 1), (64, 33, 4), (300, 257, 2))


def _values(numel: int, seed: int, device: torch.device, *, extremes: bool = False) -> torch.Tensor:
    """Gradients over six decades, signed zeros and fp32 denormals first (``extremes``: and
    +-3e38, beyond fp16's range)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 3, max(numel, 1))[:numel]
    special = [0.0, -0.0, 1e-40, -1e-40] + ([3.0e38, -3.0e38] if extremes else [])
    if numel >= len(special):
        x[: len(special)] = torch.tensor(special)
    return x.to(device)


def _excess(got: Any, want: Any, *, rtol: float = 0.0, atol: float = 0.0) -> float:
    """``max |got - want| / (atol + rtol |want|)`` (equal values, NaN == NaN, count 0; an
    exact comparison gives 0 or inf). Within tolerance when <= 1."""
    got = np.asarray(got.cpu() if isinstance(got, torch.Tensor) else got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if same.all():
        return 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.abs(got - want) / (atol + rtol * np.abs(want))
    ratio = np.where(same, 0.0, np.nan_to_num(ratio, nan=np.inf))
    return float(ratio.max())


def _best_seconds(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    fn()  # warm-up: allocator, lazy tables
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


# -- the codecs against their references ---------------------------------------------------


def _check_cast(device: torch.device, codec: str) -> dict[str, float]:
    """``codec="fp16"``: ``cast_compress`` to fp16; ``"bf16"``: the bf16 rounding, cast and
    all-gather mean. All exact."""
    from rllib_ext.ops.codecs import cast
    from rllib_ext.ops.codecs import cast_reference as ref

    worst: dict[str, float] = {}

    def record(name: str, excess: float) -> None:
        worst[name] = max(worst.get(name, 0.0), excess)

    for numel in CHECK_SIZES:
        x = _values(numel, numel, device, extremes=True)
        host = x.cpu().numpy()
        if codec == "fp16":
            for divisor in (1, 2, 3, 8):
                got = cast.cast_compress(x, torch.float16, divisor=divisor).float()
                want = ref.cast_compress_reference(host, "float16", divisor=divisor)
                record("cast_compress", _excess(got, want))
            continue
        record("round_to_bf16", _excess(cast.round_to_bf16(x), ref.round_to_bf16_reference(host)))
        got = cast.cast_compress(x, torch.bfloat16, divisor=2).float()
        record(
            "cast_compress", _excess(got, ref.cast_compress_reference(host, "bfloat16", divisor=2))
        )
        for world_size in (1, 2, 3, 4):
            per_rank = [_values(numel, 100 * r + numel, device) for r in range(world_size)]
            gathered = torch.cat([cast.bf16_bytes(v) for v in per_rank])
            out = torch.full((numel,), 7.0, device=device)
            cast.bf16_mean_of_bytes(gathered, world_size, out=out)
            want = ref.bf16_mean_reference([v.cpu().numpy() for v in per_rank])
            record("bf16_mean_of_bytes", _excess(out, want))
    return worst


def _check_onebit(device: torch.device, kernel: str) -> dict[str, float]:
    from rllib_ext.ops.codecs import onebit, select_kernels
    from rllib_ext.ops.codecs import onebit_reference as ref

    signs = scale = residual_err = decode = 0.0
    for numel in CHECK_SIZES:
        for with_residual, with_precond in (
            (True, True),
            (True, False),
            (False, True),
            (False, False),
        ):
            grad = _values(numel, numel, device)
            precond = torch.rand(numel, generator=torch.Generator().manual_seed(1)).add_(0.1)
            precond = precond.to(device) if with_precond else None
            residual = _values(numel, numel + 1, device) * 0.01 if with_residual else None
            want_payload, want_residual = ref.encode_reference(
                grad.cpu().numpy(),
                None if residual is None else residual.cpu().numpy(),
                None if precond is None else precond.cpu().numpy(),
            )
            state = None if residual is None else residual.clone()
            payload = onebit.encode(
                grad.clone(),
                residual=state,
                precond=precond,
                kernels=select_kernels(kernel, grad),
                scratch=torch.full((numel + 5,), 9.0, device=device),  # dirty scratch
            )
            signs = max(signs, _excess(payload[4:], want_payload[4:]))
            want_scale = float(want_payload[:4].view(np.float32)[0])
            got_scale = onebit.scales(payload.view(1, -1))[0]
            scale = max(scale, _excess(got_scale.reshape(1), [want_scale], rtol=1e-6))
            if state is not None:
                excess = _excess(state, want_residual, atol=2e-6 * want_scale)
                residual_err = max(residual_err, excess)
    for world_size in (1, 2, 3, 4, 8):
        for numel in (1, 13, 4097, 10_001):
            payloads = torch.stack(
                [
                    onebit.encode(
                        _values(numel, 100 * r + numel, device),
                        residual=None,
                        precond=None,
                        kernels=None,
                    )
                    for r in range(world_size)
                ]
            )
            precond = torch.rand(numel).add_(0.5).to(device)
            out = torch.full((numel,), 7.0, device=device)
            kernels = select_kernels(kernel, out, applies=world_size <= onebit.MAX_NUMBA_RANKS)
            onebit.decode_mean(payloads, precond=precond, out=out, kernels=kernels)
            want = ref.decode_mean_reference(payloads.cpu().numpy(), numel, precond.cpu().numpy())
            atol = 1.5e-6 * float(np.abs(want).max())
            decode = max(decode, _excess(out, want, rtol=1e-6, atol=atol))
    return {"signs": signs, "scale": scale, "residual": residual_err, "decode_mean": decode}


def _check_powersgd(device: torch.device, kernel: str) -> dict[str, float]:
    from rllib_ext.ops.codecs import powersgd, select_kernels
    from rllib_ext.ops.codecs import powersgd_reference as ref

    worst = {"decoded": 0.0, "error": 0.0, "qt": 0.0}
    for n, m, r in POWERSGD_SHAPES:
        g = torch.Generator().manual_seed(n * m + r)
        grad, error = torch.randn(n, m, generator=g), torch.randn(n, m, generator=g)
        qt0 = torch.randn(r, m, generator=g)
        want_qt0 = powersgd.orthogonalize_(qt0.T.clone(), epsilon=1e-8).T
        decoded, errors, qts = ref.powersgd_step_reference(
            [grad.numpy()], [want_qt0.numpy()], [error.numpy()], epsilon=1e-8
        )
        # The hook's sequence on one rank (its all-reduces are identities at W = 1).
        matrix, qt, old_error = grad.to(device), qt0.to(device), error.to(device)
        new_error = torch.full((n, m), 9.0, device=device)
        p = torch.full((n, r), 9.0, device=device)
        kernels = select_kernels(kernel, matrix)
        powersgd.orthogonalize_(qt.T, epsilon=1e-8)
        powersgd.add_error_and_p(matrix, qt, p, error=old_error, kernels=kernels)
        powersgd.compute_qt(matrix, p, qt, epsilon=1e-8)
        powersgd.decode_with_error(matrix, p, qt, error=new_error, kernels=kernels)
        atol = 1e-5 * (float(np.abs(decoded[0]).max()) + 1e-30)
        for key, got, want in (
            ("decoded", matrix, decoded[0]),
            ("error", new_error, errors[0]),
            ("qt", qt, qts[0]),
        ):
            worst[key] = max(worst[key], _excess(got, want, rtol=1e-4, atol=atol))
    return worst


def _throughput(
    codec: str, device: torch.device, kernel: str, numel: int, matrix: tuple[int, int], reps: int
) -> dict[str, float]:
    """Best encode and decode seconds -> GB/s of fp32 gradient (two ranks' payloads decoded)."""
    from rllib_ext.ops.codecs import cast, onebit, powersgd, select_kernels

    grad = torch.randn(numel, device=device)
    out = torch.empty_like(grad)
    encode: Callable[[], Any]
    decode: Callable[[], Any]
    if codec == "fp16":
        wire = cast.cast_compress(grad, torch.float16, divisor=2)

        def encode() -> torch.Tensor:
            return cast.cast_compress(grad, torch.float16, divisor=2)

        def decode() -> torch.Tensor:
            return out.copy_(wire)  # the hook's decode after the all-reduce

    elif codec == "bf16":
        gathered = torch.cat([cast.bf16_bytes(grad)] * 2)

        def encode() -> torch.Tensor:
            return cast.bf16_bytes(grad)

        def decode() -> None:
            cast.bf16_mean_of_bytes(gathered, 2, out=out)

    elif codec == "onebit":
        residual, scratch = torch.zeros_like(grad), torch.empty_like(grad)
        kernels = select_kernels(kernel, grad, residual)

        def encode() -> torch.Tensor:
            return onebit.encode(
                grad, residual=residual, precond=None, kernels=kernels, scratch=scratch
            )

        payloads = torch.stack([encode(), encode()])

        def decode() -> torch.Tensor:
            return onebit.decode_mean(payloads, precond=None, out=out, kernels=kernels)
    else:
        rows, cols = matrix
        numel = rows * cols
        mat, error = torch.randn(rows, cols, device=device), torch.zeros(rows, cols, device=device)
        qt, p = torch.randn(4, cols, device=device), torch.empty(rows, 4, device=device)
        kernels = select_kernels(kernel, mat)

        def encode() -> None:
            powersgd.orthogonalize_(qt.T, epsilon=1e-8)
            powersgd.add_error_and_p(mat, qt, p, error=error, kernels=kernels)
            powersgd.compute_qt(mat, p, qt, epsilon=1e-8)

        def decode() -> None:
            powersgd.decode_with_error(mat, p, qt, error=error, kernels=kernels)

    gigabytes = numel * 4 / 1e9
    return {
        "numel": numel,
        "encode_gbps": gigabytes / _best_seconds(encode, device, reps),
        "decode_gbps": gigabytes / _best_seconds(decode, device, reps),
    }


def run_codecs(sizes: Any, device: torch.device) -> list[dict[str, Any]]:
    """One row per codec: worst error/tolerance per sub-check (pass: <= 1) and GB/s."""
    from gpu_check_train import error_row

    kernel = "auto" if device.type == "cuda" else "torch"  # dry run: the path CUDA tensors take
    checks: dict[str, Callable[[], dict[str, float]]] = {
        "fp16": lambda: _check_cast(device, "fp16"),
        "bf16": lambda: _check_cast(device, "bf16"),
        "powersgd": lambda: _check_powersgd(device, kernel),
        "onebit": lambda: _check_onebit(device, kernel),
    }
    reps = 5 if device.type == "cuda" else 1
    rows = []
    for codec, check in checks.items():
        case = f"{codec} on {device} ({kernel} kernels)"
        try:
            errors = check()
            speed = _throughput(codec, device, kernel, sizes.codec_numel, sizes.codec_matrix, reps)
        except Exception:  # noqa: BLE001 - the other codecs still run
            rows.append(error_row(case, codec=codec, within_tolerance=False))
            continue
        worst = max(errors.values())
        row = {
            "codec": codec,
            "device": str(device),
            "kernel": kernel,
            "errors_over_tolerance": errors,
            "within_tolerance": worst <= 1.0,
            **speed,
        }
        row["case"] = case
        row["summary"] = (
            f"max err/tol {worst:.3g}; encode {speed['encode_gbps']:.1f} GB/s, "
            f"decode {speed['decode_gbps']:.1f} GB/s ({speed['numel']:,} fp32)"
        )
        row["check"] = "tolerance pass" if row["within_tolerance"] else f"FAIL {errors}"
        row["failed"] = not row["within_tolerance"]
        rows.append(row)
    return rows
