"""Unit tests of the profiling arithmetic, clocks and config wiring (no Ray)."""

from __future__ import annotations

import math

import pytest
from ray.rllib.algorithms.ppo import PPOConfig as RLlibPPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

import rllib_ext
from rllib_ext.env_runners import AMPSingleAgentEnvRunner
from rllib_ext.fused_sampling import FusedSingleAgentEnvRunner
from rllib_ext.profiling import PHASES, ProfilerCallback, breakdown_of_result, enable_profiling
from rllib_ext.profiling.breakdown import merge_breakdowns
from rllib_ext.profiling.env_runner import PROFILE_KEY, PhaseClock, PipelineMark, profiled
from rllib_ext.profiling.learner import interval_union
from rllib_ext.sampling_protocol import fused_equivalent, sample_phase


def _result(
    wall: float,
    *,
    env: dict[str, float],
    learner: dict[str, float],
    modules: dict[str, dict[str, float]] | None = None,
) -> dict:
    """An RLlib result dict as the timing subclasses leave it (seconds already summed)."""
    return {
        "training_iteration": 3,
        "time_this_iter_s": wall,
        "env_runners": {
            "num_env_steps_sampled": 1000,
            PROFILE_KEY: {f"{k}_s": v for k, v in env.items()},
        },
        "learners": {
            "__all_modules__": {PROFILE_KEY: {f"{k}_s": v for k, v in learner.items()}},
            **(modules or {}),
        },
        "timers": {"learner_update_timer": 0.5},
    }


def test_breakdown_divides_by_runners_and_learners_and_sums_to_wall() -> None:
    result = _result(
        1.0,
        # Two EnvRunners: the result holds their sums.
        env={"sample": 1.0, "env_step": 0.1, "connectors": 0.2, "inference": 0.3},
        # Two Learners, summed likewise.
        learner={
            "update": 0.8,
            "connector": 0.1,
            "forward": 0.2,
            "loss": 0.1,
            "backward": 0.2,
            "grad_comm": 0.08,  # the union of the hooks' bucket intervals
            "optimizer": 0.1,
        },
        modules={
            "p0": {
                "rllib_ext/gae/time_ms": 20.0,
                "rllib_ext/comm/time_ms": 60.0,
                "rllib_ext/comm/bytes_sent": 10.0,
            },
            "p1": {"rllib_ext/gae/time_ms": 20.0, "rllib_ext/comm/time_ms": 20.0},
        },
    )
    part = breakdown_of_result(result, num_env_runners=2, num_learners=2)
    assert set(part.seconds) == set(PHASES) and part.iterations == [3]
    assert sum(part.seconds.values()) == pytest.approx(1.0)
    assert math.isclose(sum(part.shares.values()), 1.0, abs_tol=1e-9)
    assert part.seconds["sampling/env_step"] == pytest.approx(0.05)
    assert part.seconds["sampling/inference"] == pytest.approx(0.15)
    assert part.seconds["sampling/episodes"] == pytest.approx(0.2)  # 0.5 - 0.05 - 0.1 - 0.15
    assert part.group_seconds("sampling") == pytest.approx(0.5)
    # GAE: the same elapsed time is logged under each module; it is part of the connector span.
    assert part.seconds["learner/gae"] == pytest.approx(0.02)
    assert part.seconds["learner/connector"] == pytest.approx(0.03)
    # Communication: mean over learners, taken out of backward.
    assert part.seconds["learner/grad_comm"] == pytest.approx(0.04)
    assert part.seconds["learner/backward"] == pytest.approx(0.06)
    assert part.seconds["learner/other"] == pytest.approx(0.05)
    assert part.group_seconds("learner") == pytest.approx(0.4)
    assert part.seconds["other"] == pytest.approx(0.1) == part.unaccounted_s
    assert part.details["comm"]["p0"] == {
        "rllib_ext/comm/time_ms": 60.0,
        "rllib_ext/comm/codec_time_ms": 0.0,
        "rllib_ext/comm/bytes_sent": 10.0,
    }


def test_breakdown_clamps_comm_to_backward_and_scales_overlong_parts() -> None:
    result = _result(
        1.0,
        env={"sample": 0.5, "env_step": 0.4, "connectors": 0.4},  # more than sample() took
        learner={"update": 0.4, "forward": 0.3, "backward": 0.1, "grad_comm": 0.5},
    )
    part = breakdown_of_result(result, num_env_runners=0, num_learners=0)  # local runner/learner
    assert all(v >= 0 for v in part.seconds.values())
    assert part.group_seconds("sampling") == pytest.approx(0.5)
    assert part.seconds["sampling/episodes"] == 0.0
    assert part.seconds["sampling/env_step"] == pytest.approx(0.25)
    assert part.seconds["learner/grad_comm"] == pytest.approx(0.1)
    assert part.seconds["learner/backward"] == 0.0
    assert part.group_seconds("learner") == pytest.approx(0.4)
    assert sum(part.shares.values()) == pytest.approx(1.0)


def test_breakdown_takes_grad_comm_from_the_learner_not_from_the_summed_hook_metric() -> None:
    result = _result(
        1.0,
        env={"sample": 0.5},
        learner={"update": 0.4, "backward": 0.2},
        modules={"p0": {"rllib_ext/comm/time_ms": 150.0}},  # overlapping buckets, summed
    )
    part = breakdown_of_result(result, num_env_runners=1, num_learners=1)
    assert part.seconds["learner/grad_comm"] == 0.0  # DDP's own all-reduce: inside backward
    assert part.seconds["learner/backward"] == pytest.approx(0.2)
    assert part.details["comm"]["p0"]["rllib_ext/comm/time_ms"] == 150.0


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


def test_merge_weights_iterations_by_time_and_renders_a_table() -> None:
    parts = []
    for iteration, wall in ((2, 1.0), (3, 3.0)):
        result = _result(wall, env={"sample": wall / 2}, learner={"update": wall / 4})
        result["training_iteration"] = iteration
        parts.append(breakdown_of_result(result, num_env_runners=1, num_learners=1))
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


def test_pipeline_marks_attribute_connectors_and_inference_between_them() -> None:
    clock = PhaseClock()
    spans = [("", "connectors"), ("connectors", "inference"), ("inference", "connectors")]
    marks = [PipelineMark(clock=clock, spans=s) for s in [*spans, ("connectors", "")]]
    batch = {"obs": [1]}
    for mark in marks:  # env-to-module start, end; module-to-env start, end
        assert mark(batch=batch, rl_module=None, episodes=[]) is batch
    assert set(clock.seconds) == {"connectors", "inference"} and not clock.opened
    # A module-to-env start without an open inference span adds nothing to inference.
    before = clock.seconds["inference"]
    marks[2](batch=batch)
    assert clock.seconds["inference"] == before and set(clock.opened) == {"connectors"}
    # A mark without a clock only passes the batch through.
    assert PipelineMark()(batch=batch) is batch


def test_phase_clock_logs_summed_seconds_and_starts_over() -> None:
    class Metrics:
        def __init__(self) -> None:
            self.logged: list[tuple[tuple[str, ...], float, str]] = []

        def log_value(self, key: tuple[str, ...], value: float, *, reduce: str) -> None:
            self.logged.append((key, value, reduce))

    clock, metrics = PhaseClock(), Metrics()
    for _ in range(2):
        with clock.time("backward"):
            pass
    clock.open("update")
    clock.close("update")
    clock.close("never_opened")
    clock.open("left_open")
    clock.log(metrics, "__all_modules__")
    keys = [key for key, _, _ in metrics.logged]
    assert keys == [("__all_modules__", PROFILE_KEY, f"{p}_s") for p in ("backward", "update")]
    assert PROFILE_KEY == "rllib_ext/profile"
    assert all(v >= 0 and reduce == "sum" for _, v, reduce in metrics.logged)
    assert not clock.seconds and not clock.opened
    # An EnvRunner's own sampling loop reports phases only when it is profiled.
    runner = type("Runner", (), {"sample_clock": clock})()
    with sample_phase(runner, "env_step"), sample_phase(object(), "env_step"):
        pass
    assert set(clock.seconds) == {"env_step"}
    # Profiling's marks only pass the batch through: fused loops may skip them.
    assert fused_equivalent(PipelineMark()) and not fused_equivalent(object())


def test_enable_profiling_selects_timing_subclasses_of_the_configured_classes(tmp_path) -> None:
    config = rllib_ext.PPOConfig().environment("CartPole-v1")
    assert enable_profiling(config, out_dir=tmp_path / "p", iterations=[4, 2, 3]) is config
    runner, learner = config.env_runner_cls, config.learner_class
    assert profiled(runner) and issubclass(runner, SingleAgentEnvRunner)
    assert profiled(learner) and learner.__mro__[1] is rllib_ext.PPOExtTorchLearner
    callback = config.callbacks_class
    assert issubclass(callback, ProfilerCallback)
    assert callback.iterations == (2, 3, 4) and callback.trace
    assert (tmp_path / "p").is_dir()
    # Applying it twice does not stack subclasses.
    enable_profiling(config, out_dir=None)
    # (rllib_ext.PPOConfig's single-agent runner is the fused one.)
    assert config.env_runner_cls.__mro__[1] is FusedSingleAgentEnvRunner  # one layer, no mixin
    # ... nor callbacks: the second call's options replace the first's.
    callback = config.callbacks_class
    assert isinstance(callback, type) and issubclass(callback, ProfilerCallback)
    assert callback.out_dir is None and not callback.trace
    # amp_inference keeps rllib_ext's AMP runner underneath; the stock route keeps RLlib's learner.
    amp = rllib_ext.PPOConfig().environment("CartPole-v1").training(amp="bf16", amp_inference=True)
    amp.training(fused_sampling=False)
    amp_runner = enable_profiling(amp, out_dir=None).env_runner_cls
    assert profiled(amp_runner) and amp_runner.__mro__[1] is AMPSingleAgentEnvRunner
    stock = enable_profiling(RLlibPPOConfig().environment("CartPole-v1"), out_dir=None)
    assert issubclass(stock.learner_class, PPOTorchLearner)
    assert stock.learner_class.profiled_class is PPOTorchLearner
    assert not stock.callbacks_class.trace  # no out_dir: nowhere to write a trace


def test_enable_profiling_rejects_bad_options_naming_the_fix(tmp_path) -> None:
    config = rllib_ext.PPOConfig().environment("CartPole-v1")
    with pytest.raises(ValueError, match=r"iterations=\(0,\).*>= 1"):
        enable_profiling(config, out_dir=None, iterations=[0])
    with pytest.raises(TypeError, match="needs a TorchLearner subclass, got object. Fix:"):
        enable_profiling(config.learners(learner_class=object), out_dir=None)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable.*Fix"):
        enable_profiling(config, out_dir=blocker / "sub")
    # nothing changed by a rejected call
    assert config.env_runner_cls is FusedSingleAgentEnvRunner
