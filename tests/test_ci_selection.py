"""CI's selection: ``make test`` (the README's test command) leaves out the long suites that have
their own targets. A ``-m`` on the command line replaces the one in pyproject's ``addopts``, so
the Makefile's expression alone decides what runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG_SUITES = ("test_examples_conform", "test_more_examples_conform")


def _make_test_markers() -> str:
    found = re.search(r"^TEST_MARKERS\s*=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found is not None, "Makefile: TEST_MARKERS (make test's -m expression) is missing"
    return found.group(1).strip()


def _collected(markers: str) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            markers,
            "tests/conformance",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_make_test_leaves_out_the_conformance_suites() -> None:
    collected = _collected(_make_test_markers())
    assert collected, "make test's selection collects nothing from tests/conformance"
    assert not [t for t in collected if t.split("::")[1].startswith(LONG_SUITES)]


def test_not_conformance_alone_leaves_out_the_whole_set() -> None:
    collected = _collected("not conformance")
    assert not [t for t in collected if "test_more_examples_conform" in t]
