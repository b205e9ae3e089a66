"""Downloads here the wheels the bare, offline GPU machine lacks (``wheels.txt``), for its
Python 3.12 on manylinux x86_64, into ``benchmarks/gpu_kit/wheels/`` (ignored), and writes
``manifest.json`` there: name, version, file, size and sha256 of each wheel, and their total.

Ray's wheel (79 MB) is slimmed to what the check runs: its Java jar and the dashboard's web page
go (``SLIM``; the check starts Ray without a dashboard), and its ``RECORD`` is rewritten to match;
the manifest keeps the upstream file's sha256 beside the slim one. Refuses a kit over
``--limit-mib`` (60: a device command carries at most 64 MiB with the working tree)::

    python3 benchmarks/gpu_kit/download.py            # then benchmarks/gpu_kit/launch.sh there
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

KIT = Path(__file__).resolve().parent
PINS = KIT / "wheels.txt"
WHEELS = KIT / "wheels"
LIMIT_MIB = 60
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
SLIM = {"ray": ("ray/jars/", "ray/dashboard/client/build/")}
"""Per distribution: path prefixes left out of its wheel (what the check never loads)."""


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503 / 427): ``dm-tree`` ->
    ``dm_tree``."""
    return re.sub(r"[-_.]+", "_", name).lower()


def read_pins(text: str) -> list[tuple[str, str]]:
    """``NAME==VERSION`` lines (``#`` comments, blank lines ignored), one version per name.

    Raises:
        ValueError: a line that is not ``NAME==VERSION``, or a name pinned twice.
    """
    pins: dict[str, tuple[str, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if match is None:
            raise ValueError(
                f"wheels.txt line {number}: {line!r} is not NAME==VERSION; allowed: one exact "
                "pin per line, comments after '#'. Fix: e.g. 'gymnasium==1.2.2'."
            )
        name, version = match.groups()
        if normalize(name) in pins:
            raise ValueError(
                f"wheels.txt line {number}: {name} pinned twice ({pins[normalize(name)][1]} and "
                f"{version}); allowed: one version per name (two stop pip --no-index). Fix: keep "
                "one line."
            )
        pins[normalize(name)] = (name, version)
    return list(pins.values())


def wheel_key(filename: str) -> tuple[str, str]:
    """``(normalized name, version)`` of a wheel file name."""
    name, version = filename.split("-")[:2]
    return normalize(name), version


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def slim_wheel(source: Path, target: Path, drop: tuple[str, ...]) -> list[str]:
    """``source`` rewritten to ``target`` without the files under the ``drop`` prefixes, its
    ``RECORD`` listing only what stays. Returns the dropped file names."""
    dropped = []
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        record = None
        for info in src.infolist():
            if info.filename.startswith(drop):
                dropped.append(info.filename)
            elif info.filename.endswith(".dist-info/RECORD"):
                record = info
            else:
                dst.writestr(info, src.read(info), compress_type=info.compress_type)
        if record is None:
            raise ValueError(f"{source.name} has no .dist-info/RECORD: not a wheel")
        kept = [
            line
            for line in src.read(record).decode().splitlines()
            if line and not line.split(",", 1)[0].startswith(drop)
        ]
        dst.writestr(record, "\n".join(kept) + "\n", compress_type=record.compress_type)
    return dropped


def pip_download(pins: list[tuple[str, str]], into: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms]
    command += ["-d", str(into), *[f"{name}=={version}" for name, version in pins]]
    subprocess.run(command, check=True)


def build_kit(pins: list[tuple[str, str]], staged: Path, dest: Path) -> dict[str, Any]:
    """The staged downloads of ``pins`` into ``dest`` (slimmed where ``SLIM`` says), stale
    wheels removed; returns the manifest."""
    files = {wheel_key(p.name): p for p in staged.glob("*.whl")}
    missing = [f"{n}=={v}" for n, v in pins if (normalize(n), v) not in files]
    if missing:
        raise RuntimeError(f"pip downloaded no wheel for {missing}")
    dest.mkdir(parents=True, exist_ok=True)
    keep = set()
    entries = []
    for name, version in pins:
        source = files[(normalize(name), version)]
        target = dest / source.name
        entry: dict[str, Any] = {"name": name, "version": version, "file": source.name}
        drop = SLIM.get(normalize(name), ())
        if drop:
            entry["upstream_sha256"] = sha256(source)
            entry["upstream_size"] = source.stat().st_size
            entry["dropped_prefixes"] = list(drop)
            entry["dropped_files"] = len(slim_wheel(source, target, drop))
        else:
            target.write_bytes(source.read_bytes())
        entry["size"] = target.stat().st_size
        entry["sha256"] = sha256(target)
        entries.append(entry)
        keep.add(target.name)
    for stale in dest.glob("*.whl"):
        if stale.name not in keep:
            stale.unlink()
    total = sum(e["size"] for e in entries)
    return {
        "python": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "wheels": entries,
        "total_bytes": total,
        "total_mib": round(total / 2**20, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", type=Path, default=PINS)
    parser.add_argument("--dest", type=Path, default=WHEELS)
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(argv)
    pins = read_pins(args.pins.read_text())
    with tempfile.TemporaryDirectory(prefix="gpu_kit_") as tmp:
        pip_download(pins, Path(tmp))
        manifest = build_kit(pins, Path(tmp), args.dest)
    (args.dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for e in manifest["wheels"]:
        print(f"{e['size'] / 2**20:7.2f} MiB  {e['file']}")
    print(f"{manifest['total_mib']:7.2f} MiB  total, {len(pins)} wheels -> {args.dest}")
    if manifest["total_mib"] > args.limit_mib:
        print(
            f"download.py: the kit is {manifest['total_mib']} MiB, over --limit-mib "
            f"{args.limit_mib:g}; a device command carries 64 MiB with the working tree. Fix: "
            "drop a wheel from wheels.txt or add a prefix to SLIM.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
