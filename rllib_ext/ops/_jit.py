"""Lazy, process-wide loading of numba kernels with a fallback when numba is unavailable.

numba is imported on first use (it costs ~0.25 s), compiled code is cached on disk
(``cache=True`` in the kernel modules), and a failure (numba missing, an LLVM error) is logged
once and reported as ``None`` so callers take their numpy/torch path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["LazyKernels"]

_log = logging.getLogger(__name__)

K = TypeVar("K")


class LazyKernels(Generic[K]):
    """Builds the kernels once per process: ``build()`` then ``smoke(kernels)``.

    Args:
        name: what the kernels are, for the log line when they are unavailable.
        build: imports numba and returns the jitted functions (compiled lazily by numba).
        smoke: calls every signature the callers use, so compilation (or the cache load)
            happens here and a failure turns into the fallback instead of a crash mid-run.
    """

    def __init__(self, name: str, build: Callable[[], K], smoke: Callable[[K], None]) -> None:
        self._name = name
        self._build = build
        self._smoke = smoke
        self._lock = threading.Lock()
        self._loaded = False
        self._kernels: K | None = None

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` has run in this process (kernels compiled or read from numba's
        cache, or the fallback chosen)."""
        return self._loaded

    def load(self) -> K | None:
        """The kernels, or ``None`` where numba is missing or cannot compile. Thread-safe."""
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    try:
                        kernels = self._build()
                        self._smoke(kernels)
                        self._kernels = kernels
                    except Exception as err:  # ImportError, or a numba/LLVM failure
                        _log.info("numba %s unavailable (%s); using the fallback", self._name, err)
                        self._kernels = None
                    self._loaded = True
        return self._kernels
