"""The tested version ranges: one home (``rllib_ext._versions``), the files that must agree with
it, ``rllib-ext doctor``'s notes and the one-line warning for an untested Ray."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from rllib_ext import _versions
from rllib_ext._versions import TESTED, untested_packages, warn_if_untested
from rllib_ext.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip()] = version.strip()
    return pins


def test_constraints_pin_the_newest_tested_release_of_each_package() -> None:
    pins = _pins()
    for distribution, (_, newest) in TESTED.items():
        assert pins[distribution] == newest, distribution


def test_the_makefile_tests_the_oldest_ray_of_the_range() -> None:
    found = re.search(r"^OLDEST_RAY\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found is not None
    assert found.group(1) == TESTED["ray"][0]


def test_pyproject_admits_the_tested_ray_range_and_nothing_newer() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    (spec,) = re.findall(r'"(ray\[rllib\][^"]*)"', text)
    requirement = Requirement(spec)
    oldest, newest = (Version(v) for v in TESTED["ray"])
    assert oldest in requirement.specifier and newest in requirement.specifier
    next_minor = Version(f"{newest.major}.{newest.minor + 1}.0")
    assert next_minor not in requirement.specifier


@pytest.mark.parametrize(
    ("version", "tested"),
    [("2.58.0", True), ("2.59.1", True), ("2.60.0", True), ("2.57.0", False), ("2.61.0", False)],
)
def test_tested_note_for_ray(version: str, tested: bool) -> None:
    note = _versions.tested_note("ray", version)
    if tested:
        assert note == "tested"
    else:
        assert note == "untested: rllib-ext is tested with 2.58.0-2.60.0"


def test_a_local_build_suffix_is_still_the_tested_release() -> None:
    assert _versions.tested_note("torch", "2.13.0+cpu") == "tested"
    assert _versions.tested_note("torch", "2.14.1") == "untested: rllib-ext is tested with 2.13.0"


def test_the_installed_versions_are_the_tested_ones() -> None:
    assert untested_packages() == {}


def test_an_untested_ray_gives_one_warning_line_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_versions, "_warned", False)
    monkeypatch.setattr(_versions, "installed_version", lambda name: "2.61.0")
    with caplog.at_level(logging.WARNING, logger="rllib_ext"):
        warn_if_untested()
        warn_if_untested()
    (record,) = caplog.records
    assert record.getMessage() == (
        "Ray 2.61.0 is not a release rllib-ext was tested with (2.58.0-2.60.0); it runs, but "
        "`rllib-ext doctor` checks the private RLlib names it relies on."
    )


def test_a_tested_ray_gives_no_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_versions, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="rllib_ext"):
        warn_if_untested()
    assert caplog.records == []


def test_doctor_notes_the_tested_range_and_checks_the_private_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  ray +2\.\d+\.\d+ \(tested\)$", out, re.M), out
    assert re.search(r"^  gymnasium +\S+ \(tested\)$", out, re.M), out
    assert "[rllib internals]" in out
    assert re.search(r"^  private names +all \d+ present$", out, re.M), out


def test_doctor_names_an_untested_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("rllib_ext.cli.doctor.installed_version", lambda name: "0.0.1")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "(untested: rllib-ext is tested with 2.58.0-2.60.0)" in out
