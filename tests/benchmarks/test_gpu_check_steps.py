"""``benchmarks/gpu_check.py``'s step runner, with fake steps (no Ray, no model): Ray started
before the first step, the report rewritten after every step, a step cut at its cap, steps past
the budget skipped. The real steps run in ``test_gpu_check.py``'s dry run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check  # noqa: E402


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Fake Ray start; ``fake["steps"]`` maps a step name to its fake body."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main() sets it for --dry-run
    seen: dict[str, Any] = {"events": [], "steps": {}, "path": tmp_path / "report.json"}

    def start_ray(address: str | None, num_gpus: int) -> str:
        seen["events"].append(("ray", address, num_gpus))
        return "fake:6379"

    def run_step(name: str, args: Any, device: Any, state: dict[str, Any]) -> list[Any]:
        path = seen["path"]
        on_disk = json.loads(path.read_text()) if path.exists() else None
        seen["events"].append((name, on_disk, state["ray_address"]))
        return seen["steps"].get(name, lambda: [{"case": name, "summary": "-", "check": "-"}])()

    monkeypatch.setattr(gpu_check, "start_ray", start_ray)
    monkeypatch.setattr(gpu_check, "_run_step", run_step)
    return seen


def _main(fake: dict[str, Any], *flags: str) -> tuple[int, dict[str, Any]]:
    rc = gpu_check.main(["--dry-run", "--json", str(fake["path"]), *flags])
    return rc, json.loads(fake["path"].read_text())


def test_ray_first_and_the_report_rewritten_after_every_step(fake: dict[str, Any]) -> None:
    def codecs_fails() -> list[Any]:
        raise RuntimeError("codec broke")

    fake["steps"]["codecs"] = codecs_fails
    rc, report = _main(fake, "--steps", "amp,codecs,ranks", "--address", "head:1234")
    events = fake["events"]
    assert events[0] == ("ray", "head:1234", 0)  # before any step, --address honoured
    assert [e[0] for e in events[1:]] == ["amp", "codecs", "ranks"]
    assert all(e[2] == "fake:6379" for e in events[1:])
    assert events[1][1] is None  # nothing written before the first step
    on_disk_at_codecs, on_disk_at_ranks = events[2][1], events[3][1]
    assert list(on_disk_at_codecs["steps"]) == ["amp"] and on_disk_at_codecs["complete"] is False
    assert list(on_disk_at_ranks["steps"]) == ["amp", "codecs"]
    assert "codec broke" in on_disk_at_ranks["steps"]["codecs"]["error"]
    assert on_disk_at_ranks["failures"] == ["codecs raised"] and not on_disk_at_ranks["ok"]
    assert rc == 1 and report["complete"] is True and report["failures"] == ["codecs raised"]
    assert list(report["steps"]) == ["amp", "codecs", "ranks"]


def test_a_step_past_its_cap_is_cut_and_the_next_step_runs(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check, "STEP_CAPS_S", {**gpu_check.STEP_CAPS_S, "amp": 1})
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 0)

    def hangs() -> list[Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:  # the steps catch Exception per case: the cap must get through
                time.sleep(0.05)
            except Exception:  # noqa: BLE001
                pass
        raise AssertionError("the cap did not stop the step")

    fake["steps"]["amp"] = hangs
    rc, report = _main(fake, "--steps", "amp,codecs")
    assert "step cap of 1 s reached" in report["steps"]["amp"]["error"]
    assert report["steps"]["amp"]["cap_s"] == 1
    assert report["steps"]["codecs"]["rows"][0]["case"] == "codecs"
    assert rc == 1 and report["failures"] == ["amp raised"]


def test_steps_that_no_longer_fit_the_budget_are_skipped(fake: dict[str, Any]) -> None:
    rc, report = _main(fake, "--steps", "amp,codecs", "--budget", "10")
    assert [e[0] for e in fake["events"]] == ["ray"]  # no step ran
    for name in ("amp", "codecs"):
        assert "of the 10 s budget" in report["steps"][name]["skipped"]
    assert rc == 1 and [f.split(":")[0] for f in report["failures"]] == [
        "amp skipped",
        "codecs skipped",
    ]


def test_bad_budget_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--budget", "0"])
    assert "--budget 0 must be > 0 seconds" in capsys.readouterr().err
