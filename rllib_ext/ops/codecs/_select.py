"""The one rule that picks numba kernels or torch ops for every codec.

``kernel="auto"`` (default): the fused numba kernels of :mod:`rllib_ext.ops.codecs._numba` where
they apply (contiguous CPU float32 tensors, numba importable), torch ops elsewhere (GPU buckets,
other dtypes). ``"torch"``: always torch ops. ``"numba"``: like ``"auto"``, but numba must load.
Both implementations sit behind each codec's functions, which take the resolved ``kernels``
(``None`` = torch ops), so the choice is made once per bucket and reported in the statistics.
"""

from __future__ import annotations

from types import ModuleType

import torch

from rllib_ext.ops._jit import LazyKernels

__all__ = ["KERNEL_CHOICES", "KERNELS", "check_kernel", "select_kernels"]

KERNEL_CHOICES: tuple[str, ...] = ("auto", "numba", "torch")


def _build() -> ModuleType:
    from rllib_ext.ops.codecs import _numba  # lazy: numba loads on first use; failure = fallback

    return _numba


def _smoke(kernels: ModuleType) -> None:
    kernels.smoke()


KERNELS: LazyKernels[ModuleType] = LazyKernels("compression codecs", _build, _smoke)


def check_kernel(kernel: str) -> str:
    """Validates a ``kernel`` option (see the module docstring); returns it.

    Raises:
        ValueError: an unknown value, or ``"numba"`` where numba does not load.
    """
    if kernel not in KERNEL_CHOICES:
        raise ValueError(
            f"kernel={kernel!r} is not one of {KERNEL_CHOICES}. Fix: use 'auto' (numba kernels "
            "where they apply), 'torch' or 'numba'."
        )
    if kernel == "numba" and KERNELS.load() is None:
        raise ValueError(
            "kernel='numba' but numba is not importable here (or failed to compile). "
            "Fix: pip install numba, or use kernel='auto'."
        )
    return kernel


def select_kernels(kernel: str, *tensors: torch.Tensor, applies: bool = True) -> ModuleType | None:
    """The numba kernels for these tensors, or ``None`` for torch ops.

    Args:
        kernel: ``"auto"``, ``"numba"`` or ``"torch"`` (validated by :func:`check_kernel`).
        tensors: every tensor the kernels will read or write; all must be contiguous CPU
            float32 for the kernels to apply.
        applies: the codec's own condition (e.g. at most 8 ranks for the 1-bit decode table).
    """
    if kernel == "torch" or not applies:
        return None
    if all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors
    ):
        return KERNELS.load()
    return None
