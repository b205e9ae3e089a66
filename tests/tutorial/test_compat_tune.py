"""rllib_ext.tune's argument translation and the old metric names (no Ray started)."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import Any

import pytest
from ray.tune.stopper import CombinedStopper

from rllib_ext import compat, tune
from rllib_ext.compat import LEGACY_METRICS, add_legacy_metrics


class _Recorder:
    """Stands in for ray.tune (the module rllib_ext.tune hands its arguments to)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict]] = []

    def run(self, trainable: Any, **kwargs: Any) -> str:
        self.calls.append((trainable, kwargs))
        return "analysis"


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    monkeypatch.setattr(tune, "_tune", SimpleNamespace(run=rec.run))
    monkeypatch.delenv(tune.MAX_ITERATIONS_ENV, raising=False)
    return rec


def test_tutorial_call_shape_is_translated(recorder: _Recorder, tmp_path: Any) -> None:
    config = compat.PPOConfig().environment("CartPole-v1")
    out = tune.run(
        "PPO",
        config=config,
        stop={"episode_reward_mean": 450, "time_total_s": 3600},
        checkpoint_freq=10,
        checkpoint_at_end=True,
        local_dir=str(tmp_path / "results"),
        verbose=2,
        resources_per_trial=config.resources_total,
    )
    assert out == "analysis"
    ((trainable, kwargs),) = recorder.calls
    assert trainable is compat.PPO
    assert kwargs["storage_path"] == os.path.abspath(tmp_path / "results")
    assert kwargs["resources_per_trial"] is None  # the trainable reserves it itself
    assert (kwargs["metric"], kwargs["mode"]) == ("episode_reward_mean", "max")
    assert kwargs["stop"] == {"episode_reward_mean": 450, "time_total_s": 3600}
    assert kwargs["checkpoint_freq"] == 10 and kwargs["checkpoint_at_end"] is True
    assert kwargs["verbose"] == 2 and kwargs["config"] is config


def test_other_trainables_and_arguments_pass_unchanged(recorder: _Recorder) -> None:
    def trainable(config: dict) -> None:
        pass

    tune.run(trainable, config={"a": 1}, resources_per_trial={"cpu": 1}, metric="m", mode="min")
    ((got, kwargs),) = recorder.calls
    assert got is trainable
    assert kwargs["resources_per_trial"] == {"cpu": 1}
    assert (kwargs["metric"], kwargs["mode"]) == ("m", "min")
    assert tune.resolve_trainable("APPO") == "APPO"


def test_local_dir_and_storage_path_together_is_an_error(recorder: _Recorder) -> None:
    with pytest.raises(ValueError, match="local_dir='a' and storage_path='b'"):
        tune.run("PPO", local_dir="a", storage_path="b")


@pytest.mark.parametrize(
    "stop, expected",
    [
        (None, {"training_iteration": 3}),
        ({"episode_reward_mean": 450}, {"episode_reward_mean": 450, "training_iteration": 3}),
        ({"training_iteration": 1000}, {"training_iteration": 3}),
        ({"training_iteration": 2}, {"training_iteration": 2}),
    ],
)
def test_iteration_cap_from_the_environment(
    recorder: _Recorder, monkeypatch: pytest.MonkeyPatch, stop: Any, expected: dict
) -> None:
    monkeypatch.setenv(tune.MAX_ITERATIONS_ENV, "3")
    tune.run("PPO", stop=stop)
    assert recorder.calls[0][1]["stop"] == expected


def test_iteration_cap_wraps_a_stopper_function(
    recorder: _Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tune.MAX_ITERATIONS_ENV, "3")
    tune.run("PPO", stop=lambda trial_id, result: False)
    stopper = recorder.calls[0][1]["stop"]
    assert isinstance(stopper, CombinedStopper)
    assert stopper("t", {"training_iteration": 3}) and not stopper("t", {"training_iteration": 2})


@pytest.mark.parametrize("bad", ["0", "x", "-2"])
def test_bad_iteration_cap(recorder: _Recorder, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(tune.MAX_ITERATIONS_ENV, bad)
    with pytest.raises(ValueError, match=rf"RLLIB_EXT_MAX_ITERATIONS='{bad}'.*>= 1"):
        tune.run("PPO")


def _result(**env_runners: Any) -> dict:
    return {"env_runners": env_runners, "num_env_steps_sampled_lifetime": 8000.0}


def test_old_names_copy_the_new_values() -> None:
    result = add_legacy_metrics(
        _result(
            episode_return_mean=21.5,
            episode_return_min=9.0,
            episode_return_max=60.0,
            episode_len_mean=21.5,
            num_episodes=12,
            num_episodes_lifetime=370.0,
        )
    )
    assert result["episode_reward_mean"] == 21.5
    assert (result["episode_reward_min"], result["episode_reward_max"]) == (9.0, 60.0)
    assert result["episode_len_mean"] == 21.5
    assert result["timesteps_total"] == 8000 and isinstance(result["timesteps_total"], int)
    assert result["episodes_total"] == 370 and result["episodes_this_iter"] == 12
    assert result["env_runners"]["episode_return_mean"] == 21.5  # new names untouched


def test_missing_new_values_read_nan_and_flattened_results_work() -> None:
    result = add_legacy_metrics(_result())
    assert math.isnan(result["episode_reward_mean"])
    flat = add_legacy_metrics({"env_runners/episode_return_mean": 7.0})
    assert flat["episode_reward_mean"] == 7.0
    assert set(LEGACY_METRICS) <= set(flat)


def test_fitting_happens_in_the_driver_for_a_dict_config(
    recorder: _Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rllib_ext.compat import check_request

    monkeypatch.setenv("RLLIB_EXT_FIT_RESOURCES", "1")
    tutorial = {"env": "CartPole-v1", "num_gpus": 64, "num_workers": 512, "kl_coeff": 0.3}
    tune.run("PPO", config=dict(tutorial))
    config = recorder.calls[0][1]["config"]
    assert isinstance(config, compat.PPOConfig)  # Tune turns it into the fitted dict
    assert config.kl_coeff == 0.3 and config.num_env_runners < 512
    check_request(config, include_main=True)  # fits what this process sees
