"""``benchmarks/gpu_kit/download.py``: the pins file, the slimmed wheel and the manifest, on a
fake wheel (no download); and the committed pins against the tested versions."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from rllib_ext._versions import TESTED

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu_kit"))
import download  # noqa: E402

ON_THE_GPU_MACHINE = {"torch", "numpy", "jax", "jaxlib", "numba", "pytest"}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_committed_pins_one_per_name_tested_versions_nothing_the_machine_has() -> None:
    pins = dict(download.read_pins(download.PINS.read_text()))
    names = {download.normalize(n) for n in pins}
    assert not names & ON_THE_GPU_MACHINE
    for required in ("ray", "gymnasium", "pettingzoo", "tensorboardx", "jaxmarl"):
        assert required in names
    oldest, newest = TESTED["ray"]
    assert _key(oldest) <= _key(pins["ray"]) <= _key(newest)
    constraints = dict(
        line.split("==")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name, version in pins.items():  # what CI tests, where CI pins it
        if name in constraints:
            assert version == constraints[name], name


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("ray>=2.58\n", r"line 1: 'ray>=2.58' is not NAME==VERSION.*Fix: e.g."),
        ("ray==2.60.0\n# c\nRay==2.59.0\n", r"line 3: Ray pinned twice \(2.60.0 and 2.59.0\)"),
        ("dm-tree==0.1.10\ndm_tree==0.1.9\n", r"line 2: dm_tree pinned twice"),
    ],
)
def test_bad_pins_are_one_line_errors(text: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as info:
        download.read_pins(text)
    assert "\n" not in str(info.value)


def _fake_wheel(path: Path, files: dict[str, bytes]) -> None:
    record = "".join(
        f"{name},{download._record_hash(data)},{len(data)}\n" for name, data in files.items()
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("ray-2.60.0.dist-info/RECORD", record + "ray-2.60.0.dist-info/RECORD,,\n")


def test_slimmed_wheel_and_manifest(tmp_path: Path) -> None:
    staged, dest = tmp_path / "staged", tmp_path / "wheels"
    staged.mkdir()
    dest.mkdir()
    (dest / "old-1.0-py3-none-any.whl").write_bytes(b"stale")
    files = {
        "ray/__init__.py": b"version = 1\n",
        "ray/jars/ray_dist.jar": b"java" * 1000,
        "ray/dashboard/client/build/index.html": b"<html>",
        "ray/dashboard/head.py": b"# kept\n",
    }
    _fake_wheel(staged / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", files)
    _fake_wheel(staged / "lz4-4.4.5-cp312-cp312-manylinux2014_x86_64.whl", {"lz4/x.py": b"1"})
    manifest = download.build_kit([("ray", "2.60.0"), ("lz4", "4.4.5")], staged, dest)

    assert sorted(p.name for p in dest.iterdir()) == sorted(e["file"] for e in manifest["wheels"])
    ray_entry, lz4_entry = manifest["wheels"]
    with zipfile.ZipFile(dest / ray_entry["file"]) as wheel:
        names = set(wheel.namelist())
        record = wheel.read("ray-2.60.0.dist-info/RECORD").decode()
        assert wheel.read("ray/dashboard/head.py") == b"# kept\n"
    assert names == {"ray/__init__.py", "ray/dashboard/head.py", "ray-2.60.0.dist-info/RECORD"}
    assert [line.split(",")[0] for line in record.splitlines()] == [
        "ray/__init__.py",
        "ray/dashboard/head.py",
        "ray-2.60.0.dist-info/RECORD",
    ]
    assert ray_entry["dropped_files"] == 2 and ray_entry["dropped_prefixes"] == list(
        download.SLIM["ray"]
    )
    upstream = staged / ray_entry["file"]
    assert ray_entry["upstream_sha256"] == hashlib.sha256(upstream.read_bytes()).hexdigest()
    for entry in (ray_entry, lz4_entry):
        data = (dest / entry["file"]).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert "upstream_sha256" not in lz4_entry
    assert manifest["total_bytes"] == ray_entry["size"] + lz4_entry["size"]


def test_a_pin_pip_did_not_download_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"no wheel for \['lz4==4.4.5'\]"):
        download.build_kit([("lz4", "4.4.5")], tmp_path, tmp_path / "wheels")
