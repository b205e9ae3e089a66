"""Where one training iteration's wall time went, computed from its RLlib result dict.

Sources (``source`` in ``breakdown.json``): RLlib's ``time_this_iter_s`` for the wall time;
``env_runners/profile/<phase>_s`` (:mod:`rllib_ext.profiling.env_runner`, mean over the
EnvRunners); ``learners/__all_modules__/profile/<phase>_s`` (:mod:`rllib_ext.profiling.learner`,
mean over the Learners); ``learners/<module>/gae/time_ms`` (``VectorizedGAE``) and
``learners/<module>/comm/time_ms`` (rllib_ext's compression hooks). Leaf phases sum to the wall
time; a measured phase is never negative; ``unaccounted_s`` is wall minus sampling and learner
(the ``other`` phase; clearly negative would mean double counting).
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
    "learner/grad_comm": "rllib_ext compression hooks (comm/time_ms: hook start to collective "
    "done, summed over buckets, at most backward); DDP's own all-reduce stays in backward",
    "learner/optimizer": "postprocess_gradients + apply_gradients",
    "learner/other": "Learner.update minus the above: minibatch slicing, metrics, KL update",
    "other": "time_this_iter_s minus sampling and learner: Ray transfers, weight sync, "
    "metrics reduction, callbacks",
}
"""What each leaf phase measures."""

PHASES: tuple[str, ...] = tuple(SOURCES)
"""Leaf phases, in table order; their seconds sum to the iteration's wall time."""

GROUPS: tuple[str, ...] = ("sampling", "learner", "other")


@dataclass
class Breakdown:
    """Seconds per leaf phase over one or more iterations (see :data:`PHASES`)."""

    iterations: list[int]
    wall_s: float
    seconds: dict[str, float]
    unaccounted_s: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        return {k: (v / self.wall_s if self.wall_s > 0 else 0.0) for k, v in self.seconds.items()}

    def group_seconds(self, prefix: str) -> float:
        return sum(v for k, v in self.seconds.items() if k == prefix or k.startswith(prefix + "/"))

    def to_dict(self) -> dict[str, Any]:
        shares, wall = self.shares, self.wall_s
        return {
            "iterations": list(self.iterations),
            "wall_s": wall,
            "wall_s_per_iteration": wall / max(1, len(self.iterations)),
            "unaccounted_s": self.unaccounted_s,
            "phases": {
                name: {"seconds": self.seconds[name], "share": shares[name], "source": src}
                for name, src in SOURCES.items()
            },
            "groups": {
                g: {"seconds": self.group_seconds(g), "share": self.group_seconds(g) / wall}
                for g in GROUPS
                if wall > 0
            },
            "details": self.details,
        }

    def table(self) -> str:
        """A plain-text table: phase, seconds per iteration, share."""
        n, shares, wall = max(1, len(self.iterations)), self.shares, self.wall_s or 1.0
        lines = [f"{'phase':<22} {'s/iter':>9} {'share':>7}", f"{'-' * 22} {'-' * 9} {'-' * 7}"]
        group = None
        for name in PHASES:
            head, _, leaf = name.partition("/")
            if leaf and head != group:
                group, total = head, self.group_seconds(head)
                lines.append(f"{head:<22} {total / n:>9.4f} {total / wall:>7.1%}")
            label = f"  {leaf}" if leaf else name
            lines.append(f"{label:<22} {self.seconds[name] / n:>9.4f} {shares[name]:>7.1%}")
        lines.append(f"{'wall (iteration)':<22} {self.wall_s / n:>9.4f} {1:>7.1%}")
        return "\n".join(lines)


def _num(mapping: Any, *path: str) -> float:
    for key in path:
        mapping = mapping.get(key) if isinstance(mapping, Mapping) else None
    try:
        return float(mapping) if mapping is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _fit(parts: dict[str, float], total: float, rest: str) -> dict[str, float]:
    """Non-negative ``parts`` plus ``rest`` summing to ``total`` (parts scaled down if over)."""
    parts = {k: max(0.0, v) for k, v in parts.items()}
    measured = sum(parts.values())
    if measured > total > 0:
        parts = {k: v * total / measured for k, v in parts.items()}
        measured = total
    return {**parts, rest: max(0.0, total - measured)}


def breakdown_of_result(
    result: Mapping[str, Any], *, num_env_runners: int, num_learners: int
) -> Breakdown:
    """The breakdown of the iteration whose RLlib result is ``result``.

    Args:
        num_env_runners: EnvRunners that sampled (``config.num_env_runners``, 1 for the local
            one); their summed seconds are divided by it.
        num_learners: Learners that updated (``config.num_learners``, 1 for the local one).
    """
    wall = float(result.get("time_this_iter_s") or 0.0)
    runners, learners = max(1, num_env_runners), max(1, num_learners)
    env = result.get("env_runners", {}).get(PROFILE_KEY, {})
    learner_results = result.get("learners", {})
    lrn = learner_results.get("__all_modules__", {}).get(PROFILE_KEY, {})
    modules = {m: r for m, r in learner_results.items() if m != "__all_modules__"}

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
    comm = sum(_num(r, "comm/time_ms") for r in modules.values()) / 1e3 / learners
    comm = min(comm, backward)
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
    seconds = {**sampling, **learner}
    measured = sum(seconds.values())
    if measured > wall > 0:  # not expected: sampling and the update run one after the other
        seconds = {k: v * wall / measured for k, v in seconds.items()}
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    details = {
        "env_steps": _num(result, "env_runners", "num_env_steps_sampled"),
        "num_env_runners": runners,
        "num_learners": learners,
        "comm": {
            m: {
                k: r[k] for k in ("comm/time_ms", "comm/codec_time_ms", "comm/bytes_sent") if k in r
            }
            for m, r in modules.items()
            if "comm/time_ms" in r
        },
        # RLlib's own driver timers, for comparison (EMA-smoothed; not used for the shares).
        "rllib_timers": {
            k: v for k, v in (result.get("timers") or {}).items() if isinstance(v, (int, float))
        },
    }
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
