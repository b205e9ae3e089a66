"""Where one training iteration's wall time went, computed from its RLlib result dict.

Inputs: ``time_this_iter_s``, the timers' ``env_runners/rllib_ext/profile/<phase>_s`` and
``learners/__all_modules__/rllib_ext/profile/<phase>_s`` (summed over EnvRunners / Learners by
RLlib) and ``CompiledGAE``'s ``rllib_ext/gae/time_ms``. Leaf phases sum to the wall time and are never negative;
``unaccounted_s`` (wall minus sampling and learner) is clearly negative only if something were
counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_ext.connectors.gae import GAE_TIME_KEY
from rllib_ext.learners.comm import COMM_METRIC
from rllib_ext.profiling.env_runner import PROFILE_KEY

__all__ = ["PHASES", "SOURCES", "Breakdown", "breakdown_of_result", "merge_breakdowns"]

SOURCES: dict[str, str] = {
    "sampling/env_step": "EnvRunner._try_env_step: the vector env's step",
    "sampling/connectors": "env-to-module + module-to-env pipelines, first to last piece (the "
    "single-agent fused loop: actions from the module's outputs, what those pieces do)",
    "sampling/inference": "end of env-to-module to start of module-to-env: the RLModule forward",
    "sampling/episodes": "EnvRunner.sample() minus the above: per-agent episode bookkeeping, "
    "callbacks, episode numpy conversion",
    "learner/connector": "update start to first minibatch minus GAE: learner connector, tensors",
    "learner/gae": "CompiledGAE (rllib_ext/gae/time_ms); RLlib's GAE stays in learner/connector",
    "learner/forward": "_uncompiled_update start to compute_losses: forward_train",
    "learner/loss": "compute_losses",
    "learner/backward": "compute_gradients minus grad_comm",
    "learner/grad_comm": "time with a bucket in flight in rllib_ext's compression hooks (their "
    "public observer), at most backward; DDP's own all-reduce stays in backward",
    "learner/optimizer": "postprocess_gradients + apply_gradients",
    "learner/other": "Learner.update minus the above: minibatch slicing, metrics, KL update",
    "other": "time_this_iter_s minus sampling and learner: Ray transfers, weight sync, "
    "metrics reduction, callbacks",
}
"""What each leaf phase measures; the keys are the phases in table order."""

PHASES: tuple[str, ...] = tuple(SOURCES)


@dataclass
class Breakdown:
    """Seconds per leaf phase (see :data:`PHASES`) over one or more iterations."""

    iterations: list[int]
    wall_s: float
    seconds: dict[str, float]
    unaccounted_s: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        return {k: v / self.wall_s if self.wall_s > 0 else 0.0 for k, v in self.seconds.items()}

    def group_seconds(self, group: str) -> float:
        return sum(v for k, v in self.seconds.items() if k.partition("/")[0] == group)

    def to_dict(self) -> dict[str, Any]:
        phases = {
            k: {"seconds": self.seconds[k], "share": s, "source": SOURCES[k]}
            for k, s in self.shares.items()
        }
        return {
            "iterations": self.iterations,
            "wall_s": self.wall_s,
            "wall_s_per_iteration": self.wall_s / max(1, len(self.iterations)),
            "unaccounted_s": self.unaccounted_s,
            "phases": phases,
            "details": self.details,
        }

    def table(self) -> str:
        """Plain text: each group's total, then its phases indented; s/iteration and share."""
        n, wall = max(1, len(self.iterations)), self.wall_s or 1.0
        rows: list[tuple[str, float]] = []
        groups: set[str] = set()
        for name in PHASES:
            head, _, leaf = name.partition("/")
            if leaf and head not in groups:
                groups.add(head)
                rows.append((head, self.group_seconds(head)))
            rows.append((f"  {leaf}" if leaf else name, self.seconds[name]))
        rows.append(("wall (iteration)", self.wall_s))
        lines = (f"{name:<22} {s / n:>9.4f} {s / wall:>7.1%}" for name, s in rows)
        return "\n".join([f"{'phase':<22} {'s/iter':>9} {'share':>7}", "-" * 40, *lines])


def _num(mapping: Any, *path: str) -> float:
    for key in path:
        mapping = mapping.get(key) if isinstance(mapping, Mapping) else None
    try:
        return float(mapping or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _fit(parts: dict[str, float], total: float, rest: str) -> dict[str, float]:
    """Non-negative ``parts`` plus ``rest`` summing to ``total`` (parts scaled down if over)."""
    parts = {k: max(0.0, v) for k, v in parts.items()}
    measured = sum(parts.values())
    if measured > total > 0:
        parts = {k: v * total / measured for k, v in parts.items()}
    return {**parts, rest: max(0.0, total - sum(parts.values()))}


def breakdown_of_result(
    result: Mapping[str, Any], *, num_env_runners: int, num_learners: int
) -> Breakdown:
    """The breakdown of the iteration whose RLlib result is ``result``.

    Args:
        num_env_runners / num_learners: as configured (0: the local one); the summed seconds
            are divided by them, so each phase is the mean over EnvRunners / Learners.
    """
    wall = _num(result, "time_this_iter_s")
    runners, learners = max(1, num_env_runners), max(1, num_learners)
    modules = dict(result.get("learners", {}))
    lrn = modules.pop("__all_modules__", {}).get(PROFILE_KEY, {})

    def env_s(phase: str) -> float:
        return _num(result, "env_runners", PROFILE_KEY, f"{phase}_s") / runners

    def learner_s(phase: str) -> float:
        return _num(lrn, f"{phase}_s") / learners

    sampling = _fit(
        {f"sampling/{p}": env_s(p) for p in ("env_step", "connectors", "inference")},
        env_s("sample"),
        "sampling/episodes",
    )
    # CompiledGAE logs the same elapsed time under every module (window=1: last value).
    gae = max((_num(r, GAE_TIME_KEY) / 1e3 for r in modules.values()), default=0.0)
    backward = learner_s("backward")
    comm = min(backward, learner_s("grad_comm"))
    learner = _fit(
        {
            "learner/connector": learner_s("connector") - gae,
            "learner/gae": gae,
            "learner/forward": learner_s("forward"),
            "learner/loss": learner_s("loss"),
            "learner/backward": backward - comm,
            "learner/grad_comm": comm,
            "learner/optimizer": learner_s("optimizer"),
        },
        learner_s("update"),
        "learner/other",
    )
    # Sampling and the update run one after the other, so this is not expected to exceed 1.
    seconds = _fit({**sampling, **learner}, wall, "other")
    comm_keys = tuple(f"{COMM_METRIC}/{k}" for k in ("time_ms", "codec_time_ms", "bytes_sent"))
    details = {
        "env_steps": _num(result, "env_runners", "num_env_steps_sampled"),
        "comm": {
            m: {k: _num(r, k) for k in comm_keys} for m, r in modules.items() if comm_keys[0] in r
        },
        # RLlib's own driver timers, for comparison (EMA-smoothed; not used for the shares).
        "rllib_timers": {k: v for k, v in result.get("timers", {}).items() if isinstance(v, float)},
    }
    measured = sum(sampling.values()) + sum(learner.values())
    return Breakdown(
        [int(result.get("training_iteration", 0))], wall, seconds, wall - measured, details
    )


def merge_breakdowns(parts: Sequence[Breakdown]) -> Breakdown:
    """Sum of several iterations' breakdowns (shares then weight iterations by their time)."""
    if not parts:
        raise ValueError("merge_breakdowns needs at least one breakdown")
    return Breakdown(
        iterations=[i for p in parts for i in p.iterations],
        wall_s=sum(p.wall_s for p in parts),
        seconds={name: sum(p.seconds[name] for p in parts) for name in PHASES},
        unaccounted_s=sum(p.unaccounted_s for p in parts),
        details={"per_iteration": [p.to_dict() for p in parts]},
    )
