"""torch's CPU threads: ``import rllib_ext`` changes nothing; building the learner on the CPU
applies ``cpu_threads`` (auto: one thread unless ``OMP_NUM_THREADS`` chose a count)."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from rllib_ext import PPOConfig
from rllib_ext._threads import (
    CpuTimes,
    IdleCoreThreads,
    LearnerThreads,
    apply_cpu_threads,
    read_cpu_times,
    resolve_cpu_threads,
    thread_policy_rows,
)

_PROBE = (
    "import os, {imports}; import torch; "
    "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('OMP_NUM_THREADS'), "
    "torch.get_num_threads())"
)


def _probe(imports: str) -> list[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(imports=imports)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[-3:]


def test_import_rllib_ext_sets_no_environment_variable_and_no_thread_count():
    plain = _probe("json")
    with_ext = _probe("rllib_ext")
    assert with_ext[:2] == ["None", "None"]
    assert with_ext == plain


def test_auto_is_one_thread_unless_omp_num_threads_chose_a_count():
    assert resolve_cpu_threads(0, environ={}) == 1
    assert resolve_cpu_threads(0, environ={"OMP_NUM_THREADS": "4"}) is None
    assert resolve_cpu_threads(3, environ={"OMP_NUM_THREADS": "4"}) == 3


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_apply_sets_the_count_on_the_cpu_only(restore_threads):
    torch.set_num_threads(2)
    assert apply_cpu_threads(0, "cuda", environ={}) == 2
    assert apply_cpu_threads(0, "cpu", environ={"OMP_NUM_THREADS": "2"}) == 2
    assert apply_cpu_threads(0, "cpu", environ={}) == 1
    assert apply_cpu_threads(2, "cpu", environ={}) == 2


@pytest.mark.parametrize(("cpu_threads", "expected"), [(None, 1), (2, 2)])
def test_building_the_learner_applies_cpu_threads(
    ray_session, restore_threads, monkeypatch, cpu_threads, expected
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(3 - expected)  # the other count, so the learner must change it
    training = {} if cpu_threads is None else {"cpu_threads": cpu_threads}
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .training(train_batch_size=64, minibatch_size=32, **training)
    )
    config.build_learner(env=gym.make("CartPole-v1"))
    assert torch.get_num_threads() == expected


def test_doctor_rows_say_what_the_learner_gets_and_how_to_change_it():
    rows = dict(thread_policy_rows(2, environ={"GOMP_SPINCOUNT": "1000"}))
    assert rows["rllib_ext cpu learner threads"].startswith("1 ")
    assert "cpu_threads=N" in rows["rllib_ext cpu learner threads"]
    assert rows["GOMP_SPINCOUNT"] == "1000"
    assert "unset" in rows["OMP_WAIT_POLICY"]
    chosen = dict(thread_policy_rows(2, environ={"OMP_NUM_THREADS": "4"}))
    assert chosen["rllib_ext cpu learner threads"].startswith("4 ")


class _Clock:
    """CpuTimes readings advanced by hand: ``step(wall, others, own)`` seconds."""

    def __init__(self) -> None:
        self.now = CpuTimes(100.0, 50.0, 10.0)

    def step(self, wall: float, others: float, own: float) -> None:
        self.now = CpuTimes(
            self.now.wall + wall, self.now.machine_busy + others + own, self.now.own + own
        )

    def __call__(self) -> CpuTimes:
        return self.now


@pytest.mark.parametrize(
    ("cores", "others_per_second", "expected"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 1.9, 1), (1, 0.0, 1), (8, 0.0, 2)],
)
def test_idle_core_threads_counts_the_cores_other_processes_leave(
    cores, others_per_second, expected
):
    clock = _Clock()
    idle = IdleCoreThreads(cores=cores, read=clock)
    # Our own CPU time (two spinning threads) never counts as another process's.
    clock.step(wall=0.5, others=others_per_second * 0.5, own=1.0)
    assert idle.decide() == expected


def test_idle_core_threads_follows_a_busy_process_coming_and_going():
    clock = _Clock()
    idle = IdleCoreThreads(cores=2, read=clock)
    decisions = []
    for others in (0.0, 1.0, 1.0, 0.0):
        clock.step(wall=0.4, others=others * 0.4, own=0.6)
        decisions.append(idle.decide())
    assert decisions == [2, 1, 1, 2]


def test_without_proc_stat_auto_stays_at_one_thread(tmp_path):
    assert read_cpu_times(str(tmp_path / "missing")) is None
    idle = IdleCoreThreads(cores=2, read=lambda: None)
    assert not idle.available and idle.decide() == 1
    assert read_cpu_times() is not None  # Linux CI: the real file parses


def test_learner_threads_adapt_only_for_auto_on_the_cpu_without_omp_num_threads(restore_threads):
    clock = _Clock()
    make = lambda: IdleCoreThreads(cores=2, read=clock)  # noqa: E731
    auto = LearnerThreads(0, "cpu", environ={}, idle=make)
    assert auto.adaptive and torch.get_num_threads() == 1  # built: one thread
    clock.step(wall=0.5, others=0.0, own=0.5)
    assert auto.before_update() == 2 == torch.get_num_threads()
    clock.step(wall=0.5, others=0.5, own=0.5)  # a busy process beside us
    assert auto.before_update() == 1 == torch.get_num_threads()
    for fixed in (
        LearnerThreads(2, "cpu", environ={}, idle=make),
        LearnerThreads(0, "cpu", environ={"OMP_NUM_THREADS": "2"}, idle=make),
        LearnerThreads(0, "cuda", environ={}, idle=make),
    ):
        assert not fixed.adaptive
        before = torch.get_num_threads()
        assert fixed.before_update() == before
