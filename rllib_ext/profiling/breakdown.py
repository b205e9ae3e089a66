"""Where one training iteration's wall time went, computed from its RLlib result dict.

Inputs: ``time_this_iter_s``; ``env_runners/profile/<phase>_s`` (summed over EnvRunners, see
:mod:`~rllib_ext.profiling.env_runner`); ``learners/__all_modules__/profile/<phase>_s`` (summed
over Learners, :mod:`~rllib_ext.profiling.learner`); ``learners/<module>/gae/time_ms`` and
``comm/time_ms``, which ``VectorizedGAE`` and the compression hooks log. Leaf phases sum to the
wall time and are never negative; ``unaccounted_s`` (wall minus sampling and learner) would be
clearly negative only if something were counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_ext.profiling.env_runner import PROFILE_KEY

__all__ = ["PHASES", "SOURCES", "Breakdown", "breakdown_of_result", "merge_breakdowns"]

SOURCES: dict[str, str] = {
    "sampling/env_step": "EnvRunner._try_env_step: the vector env's step",
    "sampling/connectors": "env-to-module + module-to-env pipelines, first to last piece",
    "sampling/inference": "end of env-to-module to start of module-to-env: the RLModule forward",
    "sampling/episodes": "EnvRunner.sample() minus the above: per-agent episode bookkeeping, "
    "callbacks, episode numpy conversion",
    "learner/connector": "update start to first minibatch minus GAE: learner connector, tensors",
    "learner/gae": "VectorizedGAE (gae/time_ms); RLlib's GAE stays in learner/connector",
    "learner/forward": "_uncompiled_update start to compute_losses: forward_train",
    "learner/loss": "compute_losses",
    "learner/backward": "compute_gradients minus grad_comm",
    "learner/grad_comm": "rllib_ext compression hooks: time with a bucket's hook in flight (their "
    "observer; else comm/time_ms), at most backward; DDP's own all-reduce stays in backward",
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
            name: {"seconds": self.seconds[name], "share": share, "source": SOURCES[name]}
            for name, share in self.shares.items()
        }
        n = max(1, len(self.iterations))
        return {
            "iterations": self.iterations,
            "wall_s": self.wall_s,
            "wall_s_per_iteration": self.wall_s / n,
            "unaccounted_s": self.unaccounted_s,
            "phases": phases,
            "details": self.details,
        }

    def table(self) -> str:
        """A plain-text table: phase, seconds per iteration, share."""
        n, wall = max(1, len(self.iterations)), self.wall_s or 1.0
        lines = [f"{'phase':<22} {'s/iter':>9} {'share':>7}", f"{'-' * 22} {'-' * 9} {'-' * 7}"]
        row = "{:<22} {:>9.4f} {:>7.1%}".format
        group = None
        for name in PHASES:
            head, _, leaf = name.partition("/")
            if leaf and head != group:
                group, total = head, self.group_seconds(head)
                lines.append(row(head, total / n, total / wall))
            lines.append(
                row(
                    f"  {leaf}" if leaf else name, self.seconds[name] / n, self.seconds[name] / wall
                )
            )
        lines.append(row("wall (iteration)", self.wall_s / n, 1.0))
        return "\n".join(lines)


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
    env = result.get("env_runners", {}).get(PROFILE_KEY, {})
    modules = dict(result.get("learners", {}))
    lrn = modules.pop("__all_modules__", {}).get(PROFILE_KEY, {})

    def env_s(phase: str) -> float:
        return _num(env, f"{phase}_s") / runners

    def learner_s(phase: str) -> float:
        return _num(lrn, f"{phase}_s") / learners

    sampling = _fit(
        {f"sampling/{p}": env_s(p) for p in ("env_step", "connectors", "inference")},
        env_s("sample"),
        "sampling/episodes",
    )
    # VectorizedGAE logs the same elapsed time under every module (window=1: last value).
    gae = max((_num(r, "gae/time_ms") / 1e3 for r in modules.values()), default=0.0)
    backward = learner_s("backward")
    # Fallback (no observer records): the hooks' comm/time_ms, summed over possibly overlapping buckets.
    comm = (
        learner_s("grad_comm")
        or sum(_num(r, "comm/time_ms") for r in modules.values()) / 1e3 / learners
    )
    comm = min(backward, comm)
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
    comm_keys = ("comm/time_ms", "comm/codec_time_ms", "comm/bytes_sent")
    details = {
        "env_steps": _num(result, "env_runners", "num_env_steps_sampled"),
        "num_env_runners": runners,
        "num_learners": learners,
        "comm": {
            m: {k: _num(r, k) for k in comm_keys} for m, r in modules.items() if comm_keys[0] in r
        },
        # RLlib's own driver timers, for comparison (EMA-smoothed; not used for the shares).
        "rllib_timers": {k: v for k, v in result.get("timers", {}).items() if isinstance(v, float)},
    }
    measured = sum(sampling.values()) + sum(learner.values())
    iteration = int(result.get("training_iteration", 0))
    return Breakdown([iteration], wall, seconds, wall - measured, details)


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
