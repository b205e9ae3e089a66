"""The wheel a user installs next to the RLlib they already have.

``python -m build`` makes the sdist and the wheel (presets inside); the wheel goes into a fresh
venv that already holds ``ray[rllib]`` at the newest tested release, and pip must leave Ray
alone; then ``rllib-ext train`` runs from that venv. Slow (a new venv: minutes).
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from rllib_ext._versions import TESTED

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1500, **kwargs)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    return out


def test_the_sdist_and_the_wheel_carry_the_presets(dist: Path) -> None:
    (wheel,) = dist.glob("rllib_ext-*.whl")
    (sdist,) = dist.glob("rllib_ext-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    presets = {Path(n).name for n in names if n.startswith("rllib_ext/presets/")}
    shipped = {p.name for p in (ROOT / "rllib_ext" / "presets").glob("*.yaml")}
    assert presets == shipped and "smax.yaml" in presets
    assert "rllib_ext/py.typed" in names
    requires = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(requires).decode()
    assert "Requires-Dist: ray[rllib]<2.61,>=2.58" in metadata
    assert sdist.stat().st_size > 0


def test_the_wheel_installs_beside_an_existing_ray_and_trains(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("rllib_ext-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    ray_version = TESTED["ray"][1]
    # The user's machine: CPU torch and the current RLlib, installed before rllib-ext.
    _run([python, "-m", "pip", "install", "-q", "torch==2.13.0"])
    _run([python, "-m", "pip", "install", "-q", f"ray[rllib]=={ray_version}"])
    installed = _run([python, "-m", "pip", "install", str(wheel)])
    assert not re.search(r"^Successfully installed .*\bray-", installed.stdout, re.M), (
        installed.stdout[-3000:]
    )
    assert "Uninstalling ray-" not in installed.stdout, installed.stdout[-3000:]
    shown = _run([python, "-m", "pip", "show", "ray"])
    assert f"Version: {ray_version}" in shown.stdout

    run_dir = tmp_path / "run"
    train = [str(env_dir / "bin" / "rllib-ext"), "train", "--stop-timesteps", "4000"]
    done = _run([*train, "--no-progress", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert "reached --stop-timesteps" in done.stdout, done.stdout[-3000:]
    assert (run_dir / "summary.json").is_file()
