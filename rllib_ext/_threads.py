"""torch's CPU thread count where rllib_ext's learner runs (no Ray or torch import at module level).

Contract: ``import rllib_ext`` sets no environment variable and no thread count. Building a
:class:`rllib_ext.PPOExtTorchLearner` on the CPU applies ``cpu_threads``
(:class:`rllib_ext.settings.UpdateSettings`) to torch's intra-op pool of that process, through
``torch.set_num_threads``:

* ``0`` (the default, "auto"): one thread where nothing chose a count, i.e. ``OMP_NUM_THREADS`` is
  not in the process's environment; otherwise the count in force is kept. Ray sets
  ``OMP_NUM_THREADS`` in its workers to the CPUs they were given (``num_cpus_per_learner``), so
  "auto" only changes the driver process, where RLlib runs a local learner (``num_learners=0``)
  and local env runners (``num_env_runners=0``);
* ``N >= 1``: ``N`` threads.

Why one thread: with RLlib's PPO networks the update's matrices are small, a second thread gains
little alone and, beside another CPU-bound process, OpenMP's waiting threads cost far more
(``benchmarks/README.md``, "Thread policy"). OpenMP's wait policy (``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT``) is read once, when torch loads OpenMP, so it stays the user's to set in the
environment; :func:`thread_policy_rows` reports both for ``rllib-ext doctor``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["AUTO", "apply_cpu_threads", "resolve_cpu_threads", "thread_policy_rows"]

AUTO = 0
OMP_NUM_THREADS = "OMP_NUM_THREADS"
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def resolve_cpu_threads(cpu_threads: int, environ: Mapping[str, str] = os.environ) -> int | None:
    """The thread count to set for ``cpu_threads``, or ``None`` to keep the count in force."""
    if cpu_threads != AUTO:
        return cpu_threads
    return None if OMP_NUM_THREADS in environ else 1


def apply_cpu_threads(
    cpu_threads: int, device_type: str, environ: Mapping[str, str] = os.environ
) -> int:
    """Applies ``cpu_threads`` to torch where the learner runs on the CPU (``device_type``
    ``"cpu"``; a GPU learner's process is left as it is); returns torch's count afterwards."""
    import torch  # lazy: keeps torch out of `import rllib_ext`

    threads = resolve_cpu_threads(cpu_threads, environ) if device_type == "cpu" else None
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def thread_policy_rows(torch_threads: int, environ: Mapping[str, str] = os.environ) -> list[Any]:
    """``(name, value)`` rows for ``rllib-ext doctor``: what a CPU learner of rllib_ext gets and
    how to change it, and OpenMP's wait settings in force."""
    auto = resolve_cpu_threads(AUTO, environ)
    if auto is None:
        learner = f"{environ[OMP_NUM_THREADS]} (OMP_NUM_THREADS from the environment)"
    else:
        learner = "1 (cpu_threads=0, auto: OMP_NUM_THREADS unset)"
    rows: list[Any] = [
        ("torch cpu threads", f"{torch_threads} in this process"),
        (
            "rllib_ext cpu learner threads",
            f"{learner}; change: .training(cpu_threads=N) or --cpu-threads N",
        ),
    ]
    for name in _WAIT_VARIABLES:
        value = environ.get(name)
        rows.append((name, "unset (OpenMP's default)" if value is None else value))
    return rows
