"""``--custom-resources-per-learner`` / ``--custom-resources-per-env-runner`` (and the same YAML
keys): placement of learners and env runners on the Ray nodes that provide a custom resource."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.main import main
from rllib_ext.cli.ppo_config import (
    build_algo_config,
    check_cluster_resources,
    custom_resources_needed,
    ray_init_kwargs,
)
from rllib_ext.cli.runconfig import TrainSettings, resolve_settings


def test_flags_reach_rllibs_learner_and_env_runner_settings() -> None:
    settings = resolve_settings(
        {
            "custom_resources_per_learner": '{"learner_node": 1}',
            "custom_resources_per_env_runner": '{"sampler_node": 0.5}',
        }
    )
    assert settings.custom_resources_per_learner == {"learner_node": 1.0}
    config = build_algo_config(settings)
    assert config.custom_resources_per_learner == {"learner_node": 1.0}
    assert config.custom_resources_per_env_runner == {"sampler_node": 0.5}


def test_yaml_keys_are_the_flag_names_and_flags_win(tmp_path: Path) -> None:
    yaml_file = tmp_path / "cluster.yaml"
    yaml_file.write_text(
        "num_learners: 2\ncustom_resources_per_learner: {learner_node: 1}\n"
        "custom-resources-per-env-runner: {sampler_node: 2}\n"
    )
    settings = resolve_settings({}, config_file=str(yaml_file))
    assert settings.custom_resources_per_learner == {"learner_node": 1.0}
    assert settings.custom_resources_per_env_runner == {"sampler_node": 2.0}
    flag = resolve_settings(
        {"custom_resources_per_learner": '{"gpu_box": 1}'}, config_file=str(yaml_file)
    )
    assert flag.custom_resources_per_learner == {"gpu_box": 1.0}


BAD = {
    "not_json": ("{learner_node: 1}", ["not valid JSON"]),
    "list": ("[1]", ["JSON object"]),
    "zero": ('{"learner_node": 0}', ["'learner_node': 0", "> 0"]),
    "text_amount": ('{"learner_node": "one"}', ["'learner_node': 'one'", "> 0"]),
    "bool_amount": ('{"learner_node": true}', ["'learner_node': True", "> 0"]),
    "builtin": ('{"GPU": 1}', ["'GPU'", "--num-gpus-per-learner"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize(
    "flag", ["--custom-resources-per-learner", "--custom-resources-per-env-runner"]
)
def test_bad_value_is_one_line_before_ray(
    case: str, flag: str, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    value, fragments = BAD[case]
    assert main(["train", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rllib-ext: error: {flag} "), err
    for fragment in [*fragments, "Fix: e.g."]:
        assert fragment in err[0], (fragment, err[0])


def test_only_remote_actors_ask_and_a_local_ray_provides_what_they_ask() -> None:
    settings = TrainSettings(
        num_learners=2,
        num_env_runners=0,  # sampling in the driver: no env runner actor asks for anything
        custom_resources_per_learner={"learner_node": 1.0, "fast_net": 0.5},
        custom_resources_per_env_runner={"sampler_node": 1.0},
    )
    assert custom_resources_needed(settings) == {"learner_node": 2.0, "fast_net": 1.0}
    assert ray_init_kwargs(settings)["resources"] == {"learner_node": 2.0, "fast_net": 1.0}
    assert "resources" not in ray_init_kwargs(TrainSettings())
    joined = ray_init_kwargs(
        TrainSettings(address="auto", num_learners=2, custom_resources_per_learner={"a": 1.0})
    )
    assert "resources" not in joined  # a cluster's nodes declare their own


def test_a_cluster_without_the_resource_fails_in_one_line_instead_of_waiting() -> None:
    settings = TrainSettings(num_learners=2, custom_resources_per_learner={"learner_node": 1.0})
    check_cluster_resources(settings, {"CPU": 4.0, "learner_node": 2.0})
    with pytest.raises(CLIError) as error:
        check_cluster_resources(settings, {"CPU": 4.0, "learner_node": 1.0})
    message = str(error.value)
    assert "\n" not in message
    assert "2 of the custom resource 'learner_node'" in message and "has 1" in message
    assert "ray start" in message


@pytest.mark.usefixtures("ray_session")
def test_train_on_a_running_ray_without_the_resource_ends_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error is raised inside the run (Ray is up) and reaches the user after the cleanup."""
    argv = ["train", "--run-dir", str(tmp_path / "run"), "--num-learners", "1"]
    argv += ["--custom-resources-per-learner", '{"rllib_ext_missing_slot": 1}']
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rllib-ext: error:") and "rllib_ext_missing_slot" in err[-1]
    assert not any("Traceback" in line or "CLIError" in line for line in err)
