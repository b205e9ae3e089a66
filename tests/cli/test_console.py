"""The console of ``rllib-ext train``: only rllib-ext's lines unless ``--verbose``.

Issue 31 ("a clean console"): no JAX ``os.fork()`` warning at ``ray.init``, no RLlib
deprecation warning, no GPUtil hint on a CPU run, Ray's and RLlib's warnings only with
``--verbose``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllib_ext.cli.main import _build_parser
from rllib_ext.cli.runconfig import TrainSettings
from rllib_ext.cli.train import quiet_console
from tests.cli._procs import console_script

needs_jaxmarl = pytest.mark.skipif(
    importlib.util.find_spec("jaxmarl") is None,
    reason='needs jaxmarl: pip install "rllib-ext[smax]"',
)

_GPUTIL_HINT = "Install gputil for GPU system monitoring."


@pytest.fixture
def ray_loggers() -> Iterator[None]:
    """Restores the levels and filters :func:`quiet_console` changes."""
    import ray  # noqa: F401  # Ray's logging set up first, as in quiet_console

    names = ("ray", "ray.rllib", "ray.tune.utils.util")
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names}
    yield
    for name, (level, filters) in saved.items():
        log = logging.getLogger(name)
        log.setLevel(level)
        log.filters[:] = filters


def _gputil_hint_passes() -> bool:
    record = logging.LogRecord(
        "ray.tune.utils.util", logging.WARNING, "", 0, _GPUTIL_HINT, (), None
    )
    return bool(logging.getLogger("ray.tune.utils.util").filter(record))


@pytest.mark.usefixtures("ray_loggers")
def test_quiet_console_raises_ray_loggers_to_error_and_drops_the_gputil_hint() -> None:
    init = quiet_console(TrainSettings(), verbose=False)
    assert init["logging_level"] == logging.ERROR
    assert logging.getLogger("ray.rllib").level == logging.ERROR
    hook = init["runtime_env"]["worker_process_setup_hook"]
    module, _, name = hook.rpartition(".")
    logging.getLogger("ray").setLevel(logging.INFO)
    getattr(importlib.import_module(module), name)()  # as Ray runs it in each worker
    assert logging.getLogger("ray").level == logging.ERROR
    assert not _gputil_hint_passes()
    other = logging.LogRecord("ray.tune.utils.util", logging.WARNING, "", 0, "other", (), None)
    assert logging.getLogger("ray.tune.utils.util").filter(other)


@pytest.mark.usefixtures("ray_loggers")
def test_verbose_keeps_ray_levels_and_a_gpu_run_keeps_the_gputil_hint() -> None:
    logging.getLogger("ray.rllib").setLevel(logging.WARNING)
    assert quiet_console(TrainSettings(), verbose=True) == {}  # ray_init_kwargs's level
    assert logging.getLogger("ray.rllib").level == logging.WARNING
    assert not _gputil_hint_passes()  # a CPU run, also with --verbose
    assert quiet_console(TrainSettings(num_gpus_per_learner=1.0), verbose=True) == {}
    assert _gputil_hint_passes()


@pytest.mark.usefixtures("ray_loggers")
def test_repeated_runs_install_one_gputil_filter() -> None:
    for _ in range(3):
        quiet_console(TrainSettings(), verbose=False)
    filters = logging.getLogger("ray.tune.utils.util").filters
    assert [type(f).__name__ for f in filters].count("_DropGPUtilHint") == 1


def test_verbose_flag_defaults_off() -> None:
    parser = _build_parser()
    assert not getattr(parser.parse_args(["train"]), "verbose", False)
    assert parser.parse_args(["train", "--verbose"]).verbose is True


@needs_jaxmarl
def test_smax_map_names_do_not_start_jax() -> None:
    # A fresh interpreter: importing JaxMARL initializes JAX's backend (it computes arrays at
    # import), after which a fork (ray.init) warns. The pre-Ray map check must not import it.
    code = (
        "import sys\n"
        "from rllib_ext.envs.smac.smax import _import_smax, smax_map_names\n"
        "names = smax_map_names()\n"
        "assert 'jaxmarl' not in sys.modules, 'jaxmarl imported'\n"
        "assert names == sorted(_import_smax()[0].MAP_NAME_TO_SCENARIO), names\n"
        "assert '3m' in names\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@needs_jaxmarl
def test_smax_run_prints_only_rllib_ext_lines(tmp_path: Path) -> None:
    """A real (tiny) SMAX run of the console script: before the summary, every line is ours."""
    argv = [console_script("rllib-ext"), "train", "--env", "smax"]
    argv += ["--env-config", '{"map_name": "3m"}', "--seed", "0", "--stop-timesteps", "400"]
    argv += ["--num-envs-per-env-runner", "2", "--no-progress", "--checkpoint-freq", "0"]
    argv += ["--training", '{"train_batch_size_per_learner": 400, "minibatch_size": 200}']
    argv += ["--set", "num_epochs=1", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    lowered = console.lower()
    for unwanted in ("os.fork() was called", "deprecat", "gputil", "warning"):
        assert unwanted not in lowered, console
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("[rllib-ext] ") for line in lines), proc.stderr
    assert proc.stdout.startswith("rllib-ext train: smax"), proc.stdout
