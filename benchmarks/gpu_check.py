"""The GPU half of rllib_ext, run for real in one call (issue 30); prints one table, writes JSON.

Steps, each timed and recorded even when another fails:

1. ``amp``: ``benchmarks/amp.py``'s learner update on CUDA, fp32 / fp16 / bf16 / auto, for the
   presets' [256, 256], a 3x1024 and a ~25M-parameter (4x2048, policy + value) MLP: samples/s,
   peak ``torch.cuda.max_memory_allocated``, loss-scale skips, ratios against fp32; targets on
   the 25M model: fp16 and bf16 >= 1.8x fp32 samples/s and peak memory <= 0.7x fp32;
2. ``ppo``: the ``cartpole`` preset (``rllib-ext train``'s config), a few iterations with
   ``num_gpus_per_learner=1`` against the same run with the learner on the CPU (env steps/s),
   and the component metrics present in the results; ``smax``, last and on its own: the same
   for ``smax-3s5z_vs_3s6z`` (JAX and jaxmarl: a failure there sinks no torch row);
3. ``codecs``: fp16 / bf16 / PowerSGD / 1-bit on CUDA tensors against their ``*_reference.py``
   (the unit tests' tolerances), and GB/s; ``ranks``: every comm hook under DDP on two spawned
   ranks over gloo with CUDA tensors (NCCL needs one GPU per rank: run only with two GPUs);
4. ``chapter4``: ``examples/tutorial/chapter4.py`` as ``tests/tutorial/test_chapters.py`` runs
   it (``RLLIB_EXT_FIT_RESOURCES=1``, an iteration cap), its learner on the GPU.

Commands (on a bare GPU machine: ``benchmarks/gpu_kit/launch.sh``, benchmarks/README.md)::

    python benchmarks/gpu_check.py                        # one CUDA GPU; --budget 360 s
    python benchmarks/gpu_check.py --steps amp,codecs     # a subset
    flock /tmp/cpu.lock python benchmarks/gpu_check.py --dry-run --json /tmp/gpu_dry.json

Ray starts first (``num_gpus`` from torch, or ``--address``), before any step: RLlib would
otherwise start a plain one inside the ``amp`` step. Each step runs under a time cap
(``STEP_CAPS_S``, cut to what is left of ``--budget``; a step that no longer fits is skipped),
and the JSON is rewritten after every step (``"complete": false`` until the end), so a command
cut short still returns the steps it finished.

``--dry-run`` runs every step on the CPU with tiny sizes (CI: ``tests/benchmarks``), so the
script cannot rot. The JSON (default ``benchmarks/results/gpu/gpu_check_<gpu>.json``) starts
with a header: GPU, driver, torch/CUDA/Ray/JAX versions, commit, command line. Exit status 1
when a step raised, was cut or skipped, or a correctness check (codec tolerance, metrics, ranks)
failed; 2 without CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import logging
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# JAX (SMAX) must not take 75% of the GPU's memory before torch runs there.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

RESULTS = Path(__file__).resolve().parent / "results" / "gpu"
STEPS = ("amp", "codecs", "ranks", "ppo", "chapter4", "smax")
BUDGET_S = 360  # issue 38: inside a 420 s command, twice within 15 min of device time
STEP_CAPS_S = {"amp": 100, "codecs": 45, "ranks": 60, "ppo": 90, "chapter4": 120, "smax": 100}
"""Per step, well inside one 10-minute device command; cut to what is left of ``--budget``."""
MIN_STEP_S = 15  # a step that would get less than this is skipped
VERSIONS = ("ray", "numpy", "jax", "jaxlib", "jaxmarl", "gymnasium", "pettingzoo", "numba")


class StepCapReached(BaseException):
    """Raised in the main thread when a step's time cap is reached; a ``BaseException`` so that
    the steps' per-case ``except Exception`` cannot swallow it and run on past the cap."""


@contextlib.contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raises :class:`StepCapReached` after ``seconds`` (SIGALRM; the main thread only)."""

    def reached(signum: int, frame: Any) -> None:
        raise StepCapReached(f"step cap of {seconds:.0f} s reached")

    previous = signal.signal(signal.SIGALRM, reached)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU, tiny sizes")
    parser.add_argument("--json", type=Path, default=None, help=f"output (default: {RESULTS}/)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {STEPS}")
    parser.add_argument(
        "--address", default=None, help="join this Ray cluster (default: a new local one)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"seconds for all steps (default {BUDGET_S}); each step also has its own cap",
    )
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget {args.budget:g} must be > 0 seconds; e.g. --budget {BUDGET_S}")
    args.steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown:
        parser.error(f"--steps {unknown} unknown; allowed: {', '.join(STEPS)}")
    return args


def _command(command: list[str]) -> str | None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def header(dry_run: bool, argv: list[str]) -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cuda = torch.cuda.is_available()
    driver = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": dry_run,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver": driver.splitlines()[0] if driver else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        **{name: _version(name) for name in VERSIONS},
        "jax_platforms": os.environ.get("JAX_PLATFORMS"),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": _command(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"]
        ),
        "command": shlex.join([sys.executable, *argv]),
    }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_step(
    name: str, args: argparse.Namespace, device: Any, state: dict[str, Any]
) -> list[dict[str, Any]]:
    import gpu_check_codecs as codecs
    import gpu_check_ranks as ranks
    import gpu_check_train as train

    sizes = train.DRY_SIZES if args.dry_run else train.GPU_SIZES
    cap = state["cap_s"]
    if name == "amp":
        return train.run_amp(sizes, device)
    if name == "codecs":
        return codecs.run_codecs(sizes, device)
    if name == "ranks":  # the spawned ranks stop on their own before the cap
        return ranks.run_two_ranks(device, timeout_s=max(cap - 10, 5))
    if name in ("ppo", "smax"):
        presets = [p for p in train.PPO_PRESETS if p.startswith("smax") == (name == "smax")]
        return train.run_ppo(sizes, device, presets)
    return train.run_chapter4(
        sizes,
        dry_run=args.dry_run,
        ray_address=state["ray_address"],
        timeout_s=max(cap - 10, 5),
    )


def start_ray(address: str | None, num_gpus: int) -> str:
    """Ray for every step, started before the first one (RLlib's ``get_device()`` would start a
    plain ``ray.init()`` inside the ``amp`` step): a new local Ray with ``num_gpus`` GPUs, or the
    cluster at ``address``. Returns the GCS address the chapter 4 subprocess joins."""
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "logging_level": logging.WARNING,
            "log_to_driver": False,
        }
        if address is None:
            # A new Ray, never a stale one; 4 logical CPUs on a small machine so chapter 4's
            # trial (driver + fitted env runners) fits.
            kwargs.update(address="local", num_cpus=max(4, os.cpu_count() or 1), num_gpus=num_gpus)
        else:
            kwargs["address"] = address
        ray.init(**kwargs)
    return str(ray.get_runtime_context().gcs_address)


def render(report: dict[str, Any]) -> str:
    """The one table: step, case, measurement, check."""
    lines = []
    h = report["header"]
    lines.append(
        f"# {h['gpu'] or 'CPU (dry run)'}, driver {h['driver']}, torch {h['torch']} "
        f"(CUDA {h['cuda']}), ray {h['ray']}, commit {str(h['commit'])[:10]}, {h['cpu']}"
    )
    lines.append(f"# {h['command']}")
    for note in report["notes"]:
        lines.append(f"# {note}")
    table = [("step", "case", "measurement", "check")]
    for name, step in report["steps"].items():
        if "error" in step:
            last = step["error"].strip().splitlines()[-1]
            table.append((name, "(step raised)", last[:90], "FAIL error"))
        if "skipped" in step:
            table.append((name, "(skipped)", step["skipped"], "FAIL skipped"))
        for row in step.get("rows", []):
            table.append(
                (name, row.get("case", "?"), row.get("summary", "-"), row.get("check", "-"))
            )
        table.append((name, f"({step['seconds']:.0f} s)", "", ""))
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    for i, row in enumerate(table):
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 5)
    lines.append(
        f"# total {report['seconds']:.0f} s of a {report['budget_s']:.0f} s budget; "
        + ("OK" if report["ok"] else "FAILED: " + "; ".join(report["failures"]))
    )
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """JSON without NaN/Infinity: non-finite floats as strings; tensors as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "tolist"):
        return _finite(value.tolist())
    return value


def _failures(report: dict[str, Any]) -> list[str]:
    """Ray that did not start, steps that raised, were cut or skipped, and rows whose
    correctness check failed (``row["failed"]``: codec tolerance, component metrics, ranks,
    chapter 4's fp16); missed speed/memory targets are only reported in the rows."""
    failures = ["ray.init raised"] if "ray_error" in report else []
    for name, step in report["steps"].items():
        if "error" in step:
            failures.append(f"{name} raised")
        if "skipped" in step:
            failures.append(f"{name} skipped: {step['skipped']}")
        failures += [
            f"{name} {r['case']}: {r['check']}" for r in step.get("rows", []) if r.get("failed")
        ]
    return failures


def result_path(args: argparse.Namespace, header: dict[str, Any]) -> Path:
    if args.json is not None:
        return Path(args.json)
    gpu = (header["gpu"] or "cpu").replace(" ", "_")
    return RESULTS / f"gpu_check_{gpu}{'_dry_run' if args.dry_run else ''}.json"


def write_report(path: Path, report: dict[str, Any], started: float, complete: bool) -> None:
    """The report as it stands (after every step, and at the end with ``complete``); written to
    a temporary file first, so a kill mid-write leaves the previous version."""
    report["seconds"] = time.perf_counter() - started
    report["failures"] = _failures(report)
    report["ok"] = complete and not report["failures"]
    report["complete"] = complete
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(_finite(report), indent=1, allow_nan=False) + "\n")
    partial.replace(path)


def run_steps(
    args: argparse.Namespace, device: Any, report: dict[str, Any], path: Path, started: float
) -> None:
    """Ray first, then each step under its cap; the report is rewritten after each step."""
    import torch

    state: dict[str, Any] = {}
    try:
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        state["ray_address"] = start_ray(args.address, gpus)
    except Exception:  # noqa: BLE001 - recorded; the steps still run (and say what failed)
        report["ray_error"] = traceback.format_exc()
    report["ray_address"] = state.get("ray_address")
    for name in [s for s in STEPS if s in args.steps]:
        left = args.budget - (time.perf_counter() - started)
        cap = min(STEP_CAPS_S[name], left)
        step: dict[str, Any] = {"cap_s": cap}
        step_started = time.perf_counter()
        if cap < MIN_STEP_S:
            step["skipped"] = f"{left:.0f} s left of the {args.budget:.0f} s budget"
        else:
            state["cap_s"] = cap
            try:
                with time_cap(cap):
                    step["rows"] = _run_step(name, args, device, state)
            except StepCapReached as exc:  # the step's rows so far are lost, not the others
                step["error"] = f"{exc}\n{traceback.format_exc()}"
            except Exception:  # noqa: BLE001 - one step's failure must not lose the others
                step["error"] = traceback.format_exc()
        step["seconds"] = time.perf_counter() - step_started
        report["steps"][name] = step
        write_report(path, report, started, complete=False)
        note = " (raised)" if "error" in step else " (skipped)" if "skipped" in step else ""
        print(f"# {name}: {step['seconds']:.1f} s{note}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.dry_run:  # the CPU only, here and in every process the steps start
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device found (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); run with --dry-run to check the script on the CPU.",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    report: dict[str, Any] = {
        "header": header(args.dry_run, [sys.argv[0], *argv]),
        "budget_s": args.budget,
        "notes": [],
        "steps": {},
    }
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        report["notes"].append(
            "1 GPU: NCCL needs one GPU per rank, so the two-rank hooks run over gloo with CUDA "
            "tensors"
        )
    path = result_path(args, report["header"])
    import ray

    ours = not ray.is_initialized()  # a Ray this process started is stopped at the end
    try:
        run_steps(args, device, report, path, started)
    finally:
        if ours:
            ray.shutdown()
    write_report(path, report, started, complete=True)
    print(render(report), flush=True)
    print(f"# wrote {path}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
