"""Compiled single-pass GAE loop (numba), the kernel behind :mod:`rllib_ext.ops.gae`.

One backward pass over the flat batch reads ``V``, ``r`` and the two flags once and writes
the advantages (and, fused, the float32 value targets) once: the streaming minimum, plus a
dependent multiply-add per step. The arithmetic is the textbook loop of
:mod:`rllib_ext.ops.gae_reference` in the same operation order, so the results are
bit-identical to it (no ``fastmath``: LLVM may not reassociate or contract to FMA).

numba (a dependency of rllib-ext) is imported on first use (~0.25 s); where it is missing or
fails to compile, :func:`load` raises an ``ImportError`` that says how to fix it. Compiled code
is cached on disk (``cache=True``), so a new process (a Ray learner) loads it in milliseconds
instead of compiling again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CompiledKernels", "load"]

Kernel = Callable[..., None]
Array = npt.NDArray[Any]


class CompiledKernels:
    """The jitted loops. Arguments are 1-D contiguous arrays of equal length ``N``.

    ``advantages(v, r, term, trunc, gamma, c, adv)``: fills ``adv`` (``[N]`` float64).
    ``value_targets(v, r, term, trunc, gamma, c, out)``: fills ``out`` (``[N]`` float32) with
    ``float32(A_t) + V_t``, RLlib's rounding, without an ``[N]`` float64 temporary.
    ``suffix_sum(x, stops, c, out)``: ``out_t = x_t + c * (1 - stops_t) * out_{t+1}``.
    """

    def __init__(self, advantages: Kernel, value_targets: Kernel, suffix_sum: Kernel) -> None:
        self.advantages = advantages
        self.value_targets = value_targets
        self.suffix_sum = suffix_sum


def _build() -> CompiledKernels:
    import numba  # lazy: ~0.4 s, paid on first use; load() turns a failure into one ImportError

    # error_model="numpy": no Python-style ZeroDivisionError checks (they block vectorizing).
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")

    @jit
    def advantages(  # pragma: no cover - compiled
        v: Array, r: Array, term: Array, trunc: Array, gamma: float, c: float, adv: Array
    ) -> None:
        a = 0.0
        next_v = 0.0  # V_N = 0
        for t in range(v.shape[0] - 1, -1, -1):
            vt = np.float64(v[t])
            boot = 0.0 if term[t] else next_v
            # (gamma * V_{t+1} + r_t) - V_t: RLlib's td-residual operation order.
            delta = (gamma * boot + np.float64(r[t])) - vt
            a = delta if (term[t] or trunc[t]) else delta + c * a
            adv[t] = a
            next_v = vt

    @jit
    def value_targets(  # pragma: no cover - compiled
        v: Array, r: Array, term: Array, trunc: Array, gamma: float, c: float, out: Array
    ) -> None:
        a = 0.0
        next_v = 0.0
        for t in range(v.shape[0] - 1, -1, -1):
            vt = np.float64(v[t])
            boot = 0.0 if term[t] else next_v
            delta = (gamma * boot + np.float64(r[t])) - vt
            a = delta if (term[t] or trunc[t]) else delta + c * a
            # Advantage rounded to float32 first, then + V in V's precision (as RLlib).
            out[t] = np.float32(a) + v[t]
            next_v = vt

    @jit
    def suffix_sum(x: Array, stops: Array, c: float, out: Array) -> None:  # pragma: no cover
        y = 0.0
        for t in range(x.shape[0] - 1, -1, -1):
            xt = np.float64(x[t])
            y = xt if stops[t] else xt + c * y
            out[t] = y

    return CompiledKernels(advantages, value_targets, suffix_sum)


def _smoke(kernels: CompiledKernels) -> None:
    """Compile (or load from cache) the float32 and float64 signatures up front."""
    flags = np.array([False, True, False])
    for dtype in (np.float32, np.float64):
        x = np.ones(3, dtype=dtype)
        kernels.advantages(x, x, flags, flags, 0.9, 0.5, np.empty(3))
        kernels.value_targets(x, x, flags, flags, 0.9, 0.5, np.empty(3, dtype=np.float32))
        kernels.suffix_sum(x, flags, 0.5, np.empty(3))


@functools.cache
def load() -> CompiledKernels:
    """The compiled kernels, built (or loaded from numba's disk cache) once per process.

    Raises:
        ImportError: numba is not installed or cannot compile here.
    """
    try:
        kernels = _build()
        _smoke(kernels)
    except Exception as err:  # ImportError, or a numba/LLVM failure
        raise ImportError(
            f"The compiled GAE kernel (numba) is unavailable here: {err!r}. numba is a "
            "dependency of rllib-ext. Fix: pip install 'numba>=0.60' with a matching llvmlite "
            "(pip install -c constraints.txt numba llvmlite); `rllib-ext doctor` checks it."
        ) from err
    return kernels
