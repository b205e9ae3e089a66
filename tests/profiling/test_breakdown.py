"""Unit tests of the profiling arithmetic and wrappers (no Ray)."""

from __future__ import annotations

import math
import time

import pytest

from rllib_ext.profiling import PHASES, ProfilerCallback
from rllib_ext.profiling._clock import (
    PhaseClock,
    TimedCallable,
    interval_union,
    wrap_method,
)
from rllib_ext.profiling.breakdown import breakdown_of_iteration, merge_breakdowns


@pytest.mark.parametrize(
    ("intervals", "want"),
    [
        ([], 0.0),
        ([(0.0, 1.0)], 1.0),
        ([(0.0, 1.0), (2.0, 3.5)], 2.5),
        ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # overlap counted once
        ([(1.0, 3.0), (0.0, 4.0), (5.0, 6.0)], 5.0),  # nested, unsorted
    ],
)
def test_interval_union(intervals: list[tuple[float, float]], want: float) -> None:
    assert interval_union(intervals) == pytest.approx(want)


class _Thing:
    def work(self, x: int) -> int:
        time.sleep(0.01)
        return x + 1


def test_wrap_method_times_calls_of_one_instance() -> None:
    thing, other = _Thing(), _Thing()
    clock = PhaseClock()
    wrap_method(thing, "work", clock, "phase")
    wrap_method(thing, "work", clock, "phase")  # idempotent: not timed twice
    assert thing.work(1) == 2 and thing.work(2) == 3
    other.work(0)  # other instances are untouched
    popped = clock.pop()
    assert popped["calls"] == {"phase": 2}
    assert popped["seconds"]["phase"] >= 0.02
    assert clock.pop()["seconds"] == {}  # pop resets


def test_timed_callable_keeps_the_class_name_rllib_uses_for_timers() -> None:
    clock = PhaseClock()
    inner = _Thing()
    proxy = TimedCallable(inner.work, clock, "p")
    assert proxy(3) == 4
    assert clock.pop()["calls"] == {"p": 1}
    wrapped_obj = TimedCallable(inner, clock, "q")
    assert wrapped_obj.__class__ is _Thing and isinstance(wrapped_obj, _Thing)
    assert wrapped_obj.work(1) == 2  # attribute access delegates


def _result(wall: float) -> dict:
    return {
        "time_this_iter_s": wall,
        "env_runners": {"num_env_steps_sampled": 1000},
        "timers": {"learner_update_timer": 0.5},
    }


def _runner(sample: float, env_step: float, inference: float, connectors: float) -> dict:
    seconds = {"sample": sample, "env_step": env_step, "inference": inference}
    return {"seconds": {**seconds, "connectors": connectors}, "calls": {"sample": 1}}


IDLE_RUNNER = {"seconds": {}, "calls": {}}  # e.g. the local EnvRunner next to remote ones


def _learner(**seconds: float) -> dict:
    comm = seconds.pop("comm_s", 0.0)
    return {"seconds": seconds, "calls": {"update": 1}, "comm_s": comm}


def test_breakdown_sums_to_wall_and_splits_each_group() -> None:
    learners = [
        _learner(
            update=0.4,
            connector=0.05,
            gae=0.02,
            forward=0.1,
            loss=0.05,
            backward=0.1,
            optimizer=0.05,
            comm_s=0.04,
        ),
        _learner(
            update=0.4,
            connector=0.07,
            gae=0.04,
            forward=0.1,
            loss=0.05,
            backward=0.12,
            optimizer=0.05,
            comm_s=0.06,
        ),
    ]
    part = breakdown_of_iteration(
        iteration=3,
        result=_result(1.0),
        driver={"sampling": 0.5, "learner_update": 0.45, "weight_sync": 0.01},
        learners=learners,
        env_runners=[_runner(0.4, 0.04, 0.08, 0.04), _runner(0.4, 0.06, 0.12, 0.06), IDLE_RUNNER],
    )
    assert set(part.seconds) == set(PHASES)
    assert sum(part.seconds.values()) == pytest.approx(1.0)
    assert math.isclose(sum(part.shares.values()), 1.0, abs_tol=1e-9)
    # Mean over the EnvRunners that sampled.
    assert part.seconds["sampling/env_step"] == pytest.approx(0.05)
    assert part.seconds["sampling/inference"] == pytest.approx(0.1)
    assert part.seconds["sampling/connectors"] == pytest.approx(0.05)
    assert part.group_seconds("sampling") == pytest.approx(0.5)
    # Learner phases: mean over learners; GAE out of the connector, comm out of backward.
    assert part.seconds["learner/gae"] == pytest.approx(0.03)
    assert part.seconds["learner/connector"] == pytest.approx(0.03)
    assert part.seconds["learner/grad_comm"] == pytest.approx(0.05)
    assert part.seconds["learner/backward"] == pytest.approx(0.06)
    assert part.group_seconds("learner") == pytest.approx(0.45)
    assert part.seconds["other"] == pytest.approx(0.04)
    assert part.unaccounted_s == pytest.approx(0.04)


def test_breakdown_scales_estimates_that_exceed_the_measured_total() -> None:
    part = breakdown_of_iteration(
        iteration=1,
        result=_result(1.0),
        driver={"sampling": 0.5, "learner_update": 0.4, "weight_sync": 0.0},
        learners=[_learner(forward=0.3, backward=0.3)],  # more than the update took
        env_runners=[_runner(0.6, 0.3, 0.3, 0.1)],  # more than the driver measured
    )
    assert all(v >= 0 for v in part.seconds.values())
    assert part.group_seconds("sampling") == pytest.approx(0.5)
    assert part.seconds["sampling/other"] == 0.0
    assert part.group_seconds("learner") == pytest.approx(0.4)
    assert part.seconds["learner/forward"] == pytest.approx(0.2)
    assert sum(part.shares.values()) == pytest.approx(1.0)


def test_merge_weights_iterations_by_time_and_renders_a_table() -> None:
    parts = [
        breakdown_of_iteration(
            iteration=i,
            result=_result(wall),
            driver={"sampling": wall / 2, "learner_update": wall / 4, "weight_sync": 0.0},
            learners=[_learner(forward=wall / 8)],
            env_runners=[_runner(wall / 2, wall / 8, wall / 8, 0.0)],
        )
        for i, wall in ((2, 1.0), (3, 3.0))
    ]
    merged = merge_breakdowns(parts)
    assert merged.iterations == [2, 3] and merged.wall_s == pytest.approx(4.0)
    assert merged.group_seconds("sampling") == pytest.approx(2.0)
    data = merged.to_dict()
    assert data["wall_s_per_iteration"] == pytest.approx(2.0)
    assert list(data["phases"]) == list(PHASES)
    assert all(p["source"] for p in data["phases"].values())
    table = merged.table()
    assert "sampling" in table and "grad_comm" in table and "100.0%" in table
    with pytest.raises(ValueError, match="at least one"):
        merge_breakdowns([])


def test_configure_validates_and_defaults_the_trace_iteration(tmp_path) -> None:
    cls = ProfilerCallback.configure(out_dir=tmp_path / "p", iterations=[4, 2, 3])
    assert issubclass(cls, ProfilerCallback)
    assert cls.iterations == (2, 3, 4) and cls.trace_iteration == 5
    assert (tmp_path / "p").is_dir()
    assert ProfilerCallback.configure(out_dir=None, trace_iteration=None).trace_iteration is None
    with pytest.raises(ValueError, match=r"iterations=\(0,\).*>= 1"):
        ProfilerCallback.configure(out_dir=None, iterations=[0])
    with pytest.raises(ValueError, match="trace_iteration=0"):
        ProfilerCallback.configure(out_dir=None, trace_iteration=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable.*Fix"):
        ProfilerCallback.configure(out_dir=blocker / "sub")
