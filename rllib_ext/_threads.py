"""torch's CPU thread count where rllib_ext's learner runs (no Ray or torch import at module level).

Contract: ``import rllib_ext`` sets no environment variable and no thread count. Building a
:class:`rllib_ext.PPOExtTorchLearner` on the CPU applies ``cpu_threads``
(:class:`rllib_ext.settings.UpdateSettings`) to torch's intra-op pool of that process, through
``torch.set_num_threads``:

* ``0`` (the default, "auto") where nothing chose a count (``OMP_NUM_THREADS`` is not in the
  process's environment): one thread when built; before each update, :class:`IdleCoreThreads`
  picks 1 or 2 (at most :data:`MAX_AUTO_THREADS` and the cores the process may use) from the
  cores other processes left idle since the last update, read from ``/proc/stat`` and the
  process's own CPU time: two threads alone, one beside a busy process. Without ``/proc/stat``
  it stays at one. Ray sets ``OMP_NUM_THREADS`` in its workers to the CPUs they were given
  (``num_cpus_per_learner``), so "auto" only acts in the driver process, where RLlib runs a local
  learner (``num_learners=0``) and local env runners (``num_env_runners=0``); elsewhere the count
  in force is kept;
* ``N >= 1``: ``N`` threads, always.

Why adaptive: a second thread makes the update of RLlib's PPO networks faster alone, but beside
another CPU-bound process OpenMP's waiting threads cost far more than it gains
(``benchmarks/README.md``, "Thread policy"). OpenMP's wait policy (``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT``) is read once, when torch loads OpenMP, so it stays the user's to set in the
environment; :func:`thread_policy_rows` reports both for ``rllib-ext doctor``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "AUTO",
    "CPU_THREADS_KEY",
    "MAX_AUTO_THREADS",
    "CpuTimes",
    "IdleCoreThreads",
    "LearnerThreads",
]
__all__ += ["apply_cpu_threads", "read_cpu_times", "resolve_cpu_threads", "thread_policy_rows"]

AUTO = 0
CPU_THREADS_KEY = "rllib_ext/cpu_threads"
"""``learners/__all_modules__/rllib_ext/cpu_threads``: torch's threads for the last update of a
CPU learner."""
MAX_AUTO_THREADS = 2
"""The most threads "auto" picks (the count measured to pay on RLlib's PPO networks)."""
OMP_NUM_THREADS = "OMP_NUM_THREADS"
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


class CpuTimes(NamedTuple):
    """One reading: wall clock, CPU seconds all processes on the machine have used, and CPU
    seconds this process has used (all in seconds)."""

    wall: float
    machine_busy: float
    own: float


def read_cpu_times(stat_path: str = "/proc/stat") -> CpuTimes | None:
    """The current :class:`CpuTimes`, or ``None`` where ``/proc/stat`` cannot be read."""
    try:
        with open(stat_path) as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    own = os.times()
    return CpuTimes(time.perf_counter(), (sum(fields) - idle) / ticks, own.user + own.system)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class IdleCoreThreads:
    """Threads from the cores other processes left idle (see the module docstring).

    :meth:`decide` reads :class:`CpuTimes` and compares them with the previous reading: the other
    processes' cores are the machine's busy CPU seconds less this process's, per wall second; the
    count is the usable cores less those, rounded, within ``[1, min(MAX_AUTO_THREADS, cores)]``
    (two cores: two threads while the others use less than half a core).
    """

    def __init__(
        self, cores: int | None = None, read: Callable[[], CpuTimes | None] = read_cpu_times
    ) -> None:
        self.cores = _usable_cores() if cores is None else cores
        self._read = read
        self._last = read()

    @property
    def available(self) -> bool:
        return self._last is not None

    def decide(self) -> int:
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now.wall <= last.wall:
            return 1
        others = max(0.0, (now.machine_busy - last.machine_busy) - (now.own - last.own))
        others /= now.wall - last.wall
        return max(1, min(MAX_AUTO_THREADS, self.cores, int(self.cores - others + 0.5)))


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


class LearnerThreads:
    """A learner's ``cpu_threads``: applied when built (:func:`apply_cpu_threads`) and, for
    "auto" on the CPU with ``OMP_NUM_THREADS`` unset, re-decided before each update."""

    def __init__(
        self,
        cpu_threads: int,
        device_type: str,
        environ: Mapping[str, str] = os.environ,
        idle: Callable[[], IdleCoreThreads] = IdleCoreThreads,
    ) -> None:
        self.threads = apply_cpu_threads(cpu_threads, device_type, environ)
        adaptive = device_type == "cpu" and cpu_threads == AUTO and OMP_NUM_THREADS not in environ
        self.idle = idle() if adaptive else None
        if self.idle is not None and not self.idle.available:
            self.idle = None

    @property
    def adaptive(self) -> bool:
        return self.idle is not None

    def before_update(self) -> int:
        """Sets the count for the coming update (adaptive only); returns torch's count."""
        if self.idle is not None:
            import torch  # lazy: keeps torch out of `import rllib_ext`

            threads = self.idle.decide()
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            self.threads = threads
        return self.threads


def thread_policy_rows(torch_threads: int, environ: Mapping[str, str] = os.environ) -> list[Any]:
    """``(name, value)`` rows for ``rllib-ext doctor``: what a CPU learner of rllib_ext gets and
    how to change it, and OpenMP's wait settings in force."""
    auto = resolve_cpu_threads(AUTO, environ)
    if auto is None:
        learner = f"{environ[OMP_NUM_THREADS]} (OMP_NUM_THREADS from the environment)"
    else:
        learner = (
            f"1 or {MAX_AUTO_THREADS}, by the cores other processes leave idle, before each update "
            "(cpu_threads=0, auto: OMP_NUM_THREADS unset)"
        )
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
