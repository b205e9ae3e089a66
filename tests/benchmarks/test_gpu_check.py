"""``benchmarks/gpu_check.py``: its ``--dry-run`` (every step on the CPU, tiny sizes) and its
one-line refusal without CUDA, so the GPU check cannot rot between GPU sessions.

The dry run runs once per module, in a subprocess joined to the session's Ray; the tests read its
JSON report. About a minute on a 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
STEPS = ["amp", "codecs", "ranks", "ppo", "chapter4", "smax"]
AMP_MODELS = ["preset", "mlp3x1024", "mlp25m"]
AMP_MODES = ["fp32", "fp16", "bf16", "auto"]
HOOKS = ["fp16", "bf16", "powersgd", "onebit"]
DRY_RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, ray_session: Any) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("gpu_check") / "dry_run.json"
    address = ray_session.get_runtime_context().gcs_address
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--json", str(path), "--address", address],
        capture_output=True,
        text=True,
        timeout=DRY_RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    data = json.loads(path.read_text())
    data["printed"] = proc.stdout
    return data


def _rows(report: dict[str, Any], step: str) -> list[dict[str, Any]]:
    entry = report["steps"][step]
    assert "error" not in entry, entry["error"]
    return entry["rows"]


def test_header_and_every_step_present(report: dict[str, Any]) -> None:
    header = report["header"]
    for key in ("gpu", "driver", "torch", "cuda", "ray", "commit", "command"):
        assert key in header
    assert header["dry_run"] is True and header["torch"] == torch.__version__
    assert header["ray"] == ray.__version__ and header["capability"] is None
    assert "--dry-run" in header["command"]
    assert list(report["steps"]) == STEPS
    assert report["ok"] and report["failures"] == [] and report["complete"] is True
    for step in STEPS:  # each under its cap, none skipped
        assert 0 < report["steps"][step]["cap_s"] <= report["budget_s"]
    for step in STEPS:  # one table, every step in it
        assert any(line.startswith(step) for line in report["printed"].splitlines())


def test_amp_rows_every_model_and_mode_with_ratios(report: dict[str, Any]) -> None:
    from rllib_ext.amp_choice import resolve_amp_dtype

    rows = _rows(report, "amp")
    assert [(r["model"], r["mode"]) for r in rows] == [
        (model, mode) for model in AMP_MODELS for mode in AMP_MODES
    ]
    auto = str(resolve_amp_dtype("auto", torch.device("cpu")) or torch.float32)
    dtypes = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "auto": auto}
    for row in rows:
        assert row["dtype"] == dtypes[row["mode"]].removeprefix("torch.")
        assert row["samples_per_s"] > 0 and row["params"] > 0 and row["skipped_steps"] >= 0
        if row["mode"] == "fp32":
            assert row["x_fp32_speed"] == 1.0
        targeted = row["model"] == "mlp25m" and row["mode"] in ("fp16", "bf16")
        assert (row["target_speed_pass"] is not None) == targeted
        assert row["target_memory_pass"] is None  # no CUDA memory reading on the CPU


def test_codecs_within_their_reference_tolerance(report: dict[str, Any]) -> None:
    rows = _rows(report, "codecs")
    assert [r["codec"] for r in rows] == HOOKS
    for row in rows:
        assert row["kernel"] == "torch"  # the code path CUDA tensors take
        assert row["errors_over_tolerance"], row
        for check, excess in row["errors_over_tolerance"].items():
            assert isinstance(excess, float) and excess <= 1.0, (row["codec"], check, excess)
        assert row["within_tolerance"] is True
        assert row["encode_gbps"] > 0 and row["decode_gbps"] > 0


def test_two_ranks_identical_under_every_hook(report: dict[str, Any]) -> None:
    rows = _rows(report, "ranks")
    gloo = [r for r in rows if r["backend"] == "gloo"]
    assert [r["hook"] for r in gloo] == HOOKS
    for row in gloo:
        assert row["ranks_identical"] is True, row
        assert row["stats"]["bytes_sent"] > 0
        assert row["rel_err_first_step"] < 1e-2  # fp16/bf16 cast, or a warm-up all-reduce
    (nccl,) = [r for r in rows if r["backend"] == "nccl"]
    assert nccl["check"].startswith("not run: ")


@pytest.mark.parametrize(("step", "preset"), [("ppo", "cartpole"), ("smax", "smax-3s5z_vs_3s6z")])
def test_ppo_runs_report_every_component_metric(
    report: dict[str, Any], step: str, preset: str
) -> None:
    rows = _rows(report, step)
    assert [(r["preset"], r["arm"]) for r in rows] == [(preset, "gpu"), (preset, "cpu")]
    for row in rows:
        assert row["learner_device"] == "cpu"
        assert row["missing_metrics"] == [], row["missing_metrics"]
        assert row["env_steps"] > 0 and row["env_steps_per_s"] > 0
        metrics, mid = row["metrics"], row["module_id"]
        assert metrics[f"learners/{mid}/rllib_ext/gae/compiled"] == 1.0
        assert metrics[f"learners/{mid}/rllib_ext/batching/vectorized"] == 1.0
        if row["preset"].startswith("smax"):
            assert metrics["env_runners/rllib_ext/smax_batched_envs"] > 1
            assert f"learners/{mid}/rllib_ext/value_norm/std" in metrics
            assert f"learners/{mid}/rllib_ext/death_mask/dead_fraction" in metrics


def test_chapter4_trains_with_fp16(report: dict[str, Any]) -> None:
    (row,) = _rows(report, "chapter4")
    assert row["iterations"] == 1 and row["tiny_batch"] is True
    assert row["amp"] == "fp16" and row["amp_dtype"] == "float16"
    assert row["loss_scale"] is not None and row["env_steps"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_and_without_dry_run_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no CUDA device found" in lines[0] and "--dry-run" in lines[0]
    assert not (tmp_path / "x.json").exists()
