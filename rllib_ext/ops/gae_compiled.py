"""Compiled single-pass GAE loop (numba), the default kernel behind :mod:`rllib_ext.ops.gae`.

One backward pass over the flat batch reads ``V``, ``r`` and the two flags once and writes
the advantages (and, fused, the float32 value targets) once: the streaming minimum, plus a
dependent multiply-add per step. The arithmetic is the textbook loop of
:mod:`rllib_ext.ops.gae_reference` in the same operation order, so the results are
bit-identical to it (no ``fastmath``: LLVM may not reassociate or contract to FMA).

numba is imported on first use; where it is missing or fails to compile,
:func:`load` returns ``None`` and :mod:`rllib_ext.ops.gae` uses its numpy blocked scan. Compiled
code is cached on disk (``cache=True``), so a new process (a Ray learner) loads it in
milliseconds instead of compiling again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rllib_ext.ops._jit import LazyKernels

__all__ = ["KERNELS", "CompiledKernels", "load"]


class CompiledKernels:
    """The jitted loops. Arguments are 1-D contiguous arrays of equal length ``N``.

    ``advantages(v, r, term, trunc, gamma, c, adv)``: fills ``adv`` (``[N]`` float64).
    ``value_targets(v, r, term, trunc, gamma, c, out)``: fills ``out`` (``[N]`` float32) with
    ``float32(A_t) + V_t``, RLlib's rounding, without an ``[N]`` float64 temporary.
    ``suffix_sum(x, stops, c, out)``: ``out_t = x_t + c * (1 - stops_t) * out_{t+1}``.
    """

    def __init__(self, advantages: Callable, value_targets: Callable, suffix_sum: Callable):
        self.advantages = advantages
        self.value_targets = value_targets
        self.suffix_sum = suffix_sum


def _build() -> CompiledKernels:
    import numba

    # error_model="numpy": no Python-style ZeroDivisionError checks (they block vectorizing).
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")

    @jit
    def advantages(v, r, term, trunc, gamma, c, adv):  # pragma: no cover - compiled
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
    def value_targets(v, r, term, trunc, gamma, c, out):  # pragma: no cover - compiled
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
    def suffix_sum(x, stops, c, out):  # pragma: no cover - compiled
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


KERNELS: LazyKernels[CompiledKernels] = LazyKernels("GAE kernel", _build, _smoke)


def load() -> CompiledKernels | None:
    """The compiled kernels, or ``None`` where numba is not installed or cannot compile."""
    return KERNELS.load()
