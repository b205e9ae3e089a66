"""CI's selection: ``make test`` (the README's test command) leaves out the long suites that have
their own targets. A ``-m`` on the command line replaces the one in pyproject's ``addopts``, so
the Makefile's expression alone decides what runs."""

from __future__ import annotations

import functools
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


@functools.cache  # one collection per expression and session
def _collected(markers: str) -> tuple[str, ...]:
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
    return tuple(line for line in done.stdout.splitlines() if "::" in line)


def test_make_test_leaves_out_the_conformance_suites() -> None:
    collected = _collected(_make_test_markers())
    assert collected, "make test's selection collects nothing from tests/conformance"
    assert not [t for t in collected if t.split("::")[1].startswith(LONG_SUITES)]


def test_not_conformance_alone_leaves_out_the_whole_set() -> None:
    collected = _collected("not conformance")
    assert not [t for t in collected if "test_more_examples_conform" in t]


def _ci_conformance_markers() -> str:
    found = re.search(
        r'make conformance CONFORMANCE_MARKERS="([^"]+)"', (ROOT / ".ci/run").read_text()
    )
    assert found is not None, ".ci/run: `make conformance CONFORMANCE_MARKERS=...` is missing"
    return found.group(1)


def test_ci_runs_each_core_example_once() -> None:
    from tests.conformance import rllib_examples as rx

    def examples(collected: tuple[str, ...]) -> list[str]:
        return [t.split("[", 1)[1].rstrip("]") for t in collected if "examples_conform[" in t]

    in_test = examples(_collected(_make_test_markers()))
    in_conformance = examples(_collected(_ci_conformance_markers()))
    assert sorted(in_test + in_conformance) == sorted(
        e.name for e in rx.EXAMPLES if e.core or e.fast
    )
