"""Where one training iteration's wall time went: phases, seconds and shares.

Sources, per phase (``source`` in ``breakdown.json``):

* ``wall``: RLlib's ``time_this_iter_s`` (``Algorithm.step()``, i.e. the whole iteration).
* ``sampling``: rllib_ext's driver timer, from the start of ``training_step`` to the start of
  the learner update (``synchronous_parallel_sample`` plus the EnvRunner metrics merge).
  Split with rllib_ext's EnvRunner timers (:mod:`rllib_ext.profiling.env_runner`, mean over the
  EnvRunners that sampled): ``env_step``, ``inference``, ``connectors`` (the spans of RLlib's
  ``env_step_timer``, ``rlmodule_inference_timer`` and ``connector_pipeline_timer``, summed
  rather than EMA-averaged); ``sampling/other`` is the rest (episode bookkeeping, Ray
  transfer, waiting for the slowest EnvRunner).
* ``learner/*``: rllib_ext's timers inside each Learner (mean over learners), see
  :mod:`rllib_ext.profiling.learner`; ``learner/other`` is the driver's ``learner_group.update``
  wall time minus them (batching into minibatches, metrics, Ray transfer to remote learners).
* ``weight_sync``: rllib_ext's driver timer around ``env_runner_group.sync_weights``.
* ``other``: the rest of the iteration (metrics reduction, EnvRunner state sync, callbacks,
  evaluation).

Leaf phases sum to ``wall`` exactly; a measured phase is never negative. ``unaccounted_s`` is
``wall`` minus the measured phases before the remainders are formed: it is ``other``, and a
clearly negative value would mean double counting (the tests check it is not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PHASES", "Breakdown", "breakdown_of_iteration", "merge_breakdowns"]

PHASES: tuple[str, ...] = (
    "sampling/env_step",
    "sampling/inference",
    "sampling/connectors",
    "sampling/other",
    "learner/connector",
    "learner/gae",
    "learner/forward",
    "learner/loss",
    "learner/backward",
    "learner/grad_comm",
    "learner/optimizer",
    "learner/other",
    "weight_sync",
    "other",
)
"""Leaf phases, in table order; their seconds sum to the iteration's wall time."""

SOURCES: dict[str, str] = {
    "sampling/env_step": "rllib_ext EnvRunner timer: EnvRunner._try_env_step (vector env step)",
    "sampling/inference": "rllib_ext EnvRunner timer: module.forward_exploration/inference",
    "sampling/connectors": "rllib_ext EnvRunner timer: env-to-module + module-to-env pipelines",
    "sampling/other": "rllib_ext driver sampling timer minus the three above",
    "learner/connector": "rllib_ext: learner connector pipeline minus its GAE piece",
    "learner/gae": "rllib_ext: the GAE connector piece",
    "learner/forward": "rllib_ext: module.forward_train",
    "learner/loss": "rllib_ext: compute_losses",
    "learner/backward": "rllib_ext: compute_gradients minus grad_comm",
    "learner/grad_comm": "rllib_ext: DDP comm hook, collectives in flight",
    "learner/optimizer": "rllib_ext: postprocess_gradients + apply_gradients",
    "learner/other": "rllib_ext driver learner_group.update timer minus the learner phases",
    "weight_sync": "rllib_ext driver timer around env_runner_group.sync_weights",
    "other": "RLlib time_this_iter_s minus all of the above",
}


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
        shares = self.shares
        return {
            "iterations": list(self.iterations),
            "wall_s": self.wall_s,
            "wall_s_per_iteration": self.wall_s / max(1, len(self.iterations)),
            "unaccounted_s": self.unaccounted_s,
            "phases": {
                name: {
                    "seconds": self.seconds[name],
                    "share": shares[name],
                    "source": SOURCES[name],
                }
                for name in PHASES
            },
            "groups": {
                g: {"seconds": self.group_seconds(g), "share": self.group_seconds(g) / self.wall_s}
                for g in ("sampling", "learner", "weight_sync", "other")
            }
            if self.wall_s > 0
            else {},
            "details": self.details,
        }

    def table(self) -> str:
        """A plain-text table: phase, seconds per iteration, share."""
        n = max(1, len(self.iterations))
        shares = self.shares
        lines = [
            f"{'phase':<22} {'s/iter':>9} {'share':>7}",
            f"{'-' * 22} {'-' * 9} {'-' * 7}",
        ]
        group = None
        for name in PHASES:
            head = name.split("/")[0]
            if "/" in name and head != group:
                group = head
                total = self.group_seconds(head)
                lines.append(f"{head:<22} {total / n:>9.4f} {total / self.wall_s:>7.1%}")
            label = f"  {name.split('/', 1)[1]}" if "/" in name else name
            lines.append(f"{label:<22} {self.seconds[name] / n:>9.4f} {shares[name]:>7.1%}")
        lines.append(f"{'wall (iteration)':<22} {self.wall_s / n:>9.4f} {1:>7.1%}")
        return "\n".join(lines)


def _get(mapping: Mapping[str, Any], *path: str, default: float = 0.0) -> float:
    value: Any = mapping
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _fit(parts: dict[str, float], total: float, rest: str) -> dict[str, float]:
    """Non-negative ``parts`` plus ``rest`` summing to ``total`` (parts scaled down if over)."""
    parts = {k: max(0.0, v) for k, v in parts.items()}
    measured = sum(parts.values())
    if measured > total > 0:
        parts = {k: v * total / measured for k, v in parts.items()}
        measured = total
    return {**parts, rest: max(0.0, total - measured)}


def breakdown_of_iteration(
    *,
    iteration: int,
    result: Mapping[str, Any],
    driver: Mapping[str, float],
    learners: Sequence[Mapping[str, Any]],
    env_runners: Sequence[Mapping[str, Any]],
) -> Breakdown:
    """The breakdown of one iteration.

    Args:
        result: the iteration's RLlib result dict.
        driver: seconds of ``sampling``, ``learner_update`` and ``weight_sync`` (driver timers).
        learners: one :func:`rllib_ext.profiling.learner.collect_learner_phases` dict per learner.
        env_runners: one :func:`rllib_ext.profiling.env_runner.collect_env_runner_phases`
            dict per EnvRunner (those that did not sample are ignored; the rest averaged).
    """
    wall = float(result.get("time_this_iter_s") or 0.0)
    sampled = [r for r in env_runners if r.get("calls", {}).get("sample")]

    def runner_mean(key: str) -> float:
        values = [float(r.get("seconds", {}).get(key, 0.0)) for r in sampled]
        return sum(values) / len(values) if values else 0.0

    sampling = _fit(
        {
            "sampling/env_step": runner_mean("env_step"),
            "sampling/inference": runner_mean("inference"),
            "sampling/connectors": runner_mean("connectors"),
        },
        driver.get("sampling", 0.0),
        "sampling/other",
    )

    def mean(key: str) -> float:
        values = [float(lp.get("seconds", {}).get(key, 0.0)) for lp in learners]
        return sum(values) / len(values) if values else 0.0

    comm = sum(float(lp.get("comm_s", 0.0)) for lp in learners) / max(1, len(learners))
    gae = mean("gae")
    learner = _fit(
        {
            "learner/connector": mean("connector") - gae,
            "learner/gae": gae,
            "learner/forward": mean("forward"),
            "learner/loss": mean("loss"),
            "learner/backward": mean("backward") - comm,
            "learner/grad_comm": comm,
            "learner/optimizer": mean("optimizer"),
        },
        driver.get("learner_update", 0.0),
        "learner/other",
    )
    measured = driver.get("sampling", 0.0) + driver.get("learner_update", 0.0)
    measured += driver.get("weight_sync", 0.0)
    seconds = {**sampling, **learner, "weight_sync": driver.get("weight_sync", 0.0)}
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    details = {
        "env_steps": _get(result.get("env_runners", {}), "num_env_steps_sampled"),
        "env_runners_timed": len(sampled),
        "num_learners_timed": len(learners),
        "learner_update_calls": [lp.get("calls", {}).get("update", 0) for lp in learners],
        # RLlib's own timers, for comparison (EMA-smoothed; not used for the shares).
        "rllib_timers": {
            k: v for k, v in (result.get("timers") or {}).items() if isinstance(v, (int, float))
        },
    }
    return Breakdown([iteration], wall, seconds, wall - measured, details)


def merge_breakdowns(parts: Sequence[Breakdown]) -> Breakdown:
    """Sum of several iterations' breakdowns (shares then weight iterations by their time)."""
    if not parts:
        raise ValueError("merge_breakdowns needs at least one breakdown")
    seconds = {name: sum(p.seconds[name] for p in parts) for name in PHASES}
    return Breakdown(
        iterations=[i for p in parts for i in p.iterations],
        wall_s=sum(p.wall_s for p in parts),
        seconds=seconds,
        unaccounted_s=sum(p.unaccounted_s for p in parts),
        details={"per_iteration": [p.to_dict() for p in parts]},
    )
