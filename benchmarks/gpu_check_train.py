"""Steps 1, 2 and 4 of ``benchmarks/gpu_check.py``: the AMP learner, PPO runs, tutorial chapter 4.

Each ``run_*`` function returns the step's rows (plain dicts, JSON-ready); every row has a
``case``, a one-line ``summary`` and a ``check`` (``"pass"``, ``"FAIL ..."`` or ``"-"``) for the
table. Sizes come from a :class:`Sizes` (the GPU run's or ``--dry-run``'s tiny ones).

Run as a script only by ``gpu_check.py --dry-run`` (the chapter 4 config with a tiny batch)::

    python benchmarks/gpu_check_train.py chapter4-tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
CHAPTER4 = REPO / "examples" / "tutorial" / "chapter4.py"
AMP_MODES = ("fp32", "fp16", "bf16", "auto")
SPEED_TARGET = 1.8  # x fp32 samples/s, fp16 and bf16 on the ~25M model (issue 30)
MEMORY_TARGET = 0.7  # x fp32 peak CUDA memory, same rows
TARGET_SIZE = "mlp25m"
PPO_PRESETS = ("cartpole", "smax-3s5z_vs_3s6z")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and ``--dry-run``."""

    amp_models: dict[str, tuple[int, int]]
    """Model name -> (hidden units, hidden layers) of the policy and the value MLP."""
    amp_minibatch: int
    amp_steps: int
    ppo_iterations: int
    """Timed iterations after one warm-up iteration."""
    ppo_training: dict[str, dict[str, Any]]
    """Per preset: ``training`` overrides (empty: the preset's own batch sizes)."""
    ppo_envs: dict[str, int]
    """Per preset: ``num_envs_per_env_runner`` override (0: the preset's)."""
    codec_numel: int
    """Elements of the throughput bucket (fp32)."""
    codec_matrix: tuple[int, int]
    chapter4_iterations: int


GPU_SIZES = Sizes(
    amp_models={"preset": (256, 2), "mlp3x1024": (1024, 3), TARGET_SIZE: (2048, 4)},
    amp_minibatch=16384,
    amp_steps=5,
    ppo_iterations=3,
    ppo_training={p: {} for p in PPO_PRESETS},
    ppo_envs={p: 0 for p in PPO_PRESETS},
    codec_numel=1 << 25,
    codec_matrix=(4096, 4096),
    chapter4_iterations=2,
)
DRY_SIZES = Sizes(
    amp_models={"preset": (16, 2), "mlp3x1024": (32, 3), TARGET_SIZE: (48, 4)},
    amp_minibatch=64,
    amp_steps=1,
    ppo_iterations=1,
    ppo_training={
        "cartpole": {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1},
        "smax-3s5z_vs_3s6z": {"train_batch_size": 64, "minibatch_size": 64, "num_epochs": 1},
    },
    ppo_envs={"cartpole": 2, "smax-3s5z_vs_3s6z": 4},
    codec_numel=1 << 16,
    codec_matrix=(128, 96),
    chapter4_iterations=1,
)


def _verdict(ok: bool, what: str) -> str:
    return f"{what} pass" if ok else f"{what} FAIL"


def error_row(case: str, **fields: Any) -> dict[str, Any]:
    """The row of a case that raised (called in an ``except`` block): the traceback is kept,
    the other cases of the step still run."""
    error = traceback.format_exc()
    last = error.strip().splitlines()[-1]
    return {
        **fields,
        "case": case,
        "summary": last[:100],
        "check": "FAIL error",
        "failed": True,
        "error": error,
    }


# -- 1. AMP learner ------------------------------------------------------------------------


def run_amp(sizes: Sizes, device: torch.device) -> list[dict[str, Any]]:
    """``benchmarks/amp.py``'s update step per model and mode, ratios against fp32 per model.

    All modes run in this process (``amp.py`` spawns one per mode): the peak is read after
    ``reset_peak_memory_stats`` and whatever an earlier learner left allocated is subtracted
    (``leftover_mb``, normally 0 after ``gc.collect``).
    """
    from amp import run_mode  # benchmarks/amp.py, next to this file

    rows = []
    for model, (hidden, layers) in sizes.amp_models.items():
        base: dict[str, Any] | None = None
        for mode in AMP_MODES:
            args = argparse.Namespace(
                hidden=hidden,
                layers=layers,
                minibatch=sizes.amp_minibatch,
                steps=sizes.amp_steps,
                obs_dim=128,
                n_actions=16,
            )
            gc.collect()
            leftover_mb = 0.0
            if device.type == "cuda":
                torch.cuda.empty_cache()
                leftover_mb = torch.cuda.memory_allocated(device) / 2**20
            try:
                row = {"model": model, "hiddens": [hidden] * layers, **run_mode(mode, args)}
            except Exception:  # noqa: BLE001 - e.g. one dtype failing on this device
                rows.append(error_row(f"{model} {mode}", model=model, mode=mode))
                continue
            row["leftover_mb"] = leftover_mb
            row["peak_mb"] -= leftover_mb
            if mode == "fp32":
                base = row
            rows.append(_amp_row(row, base, device))
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the later steps start from an empty allocator
    return rows


def _amp_row(
    row: dict[str, Any], base: dict[str, Any] | None, device: torch.device
) -> dict[str, Any]:
    """Ratios against ``base`` (fp32 of the same model; ``None`` when it failed) and targets."""
    speed = memory = None
    if base is not None:
        speed = row["samples_per_s"] / base["samples_per_s"]
        # On the CPU amp.py reads peak RSS growth, meaningless for modes in one process.
        if device.type == "cuda":
            memory = row["peak_mb"] / max(base["peak_mb"], 1e-9)
    row["x_fp32_speed"], row["x_fp32_memory"] = speed, memory
    targeted = row["model"] == TARGET_SIZE and row["mode"] in ("fp16", "bf16")
    row["target_speed_pass"] = speed >= SPEED_TARGET if targeted and speed is not None else None
    row["target_memory_pass"] = memory <= MEMORY_TARGET if targeted and memory is not None else None
    row["case"] = f"{row['model']} ({row['params']:,} params) {row['mode']}->{row['dtype']}"
    ratio = f" x{speed:.2f}" if speed is not None else ""
    peak = f"peak {row['peak_mb']:.0f} MB" + (f" x{memory:.2f}" if memory is not None else "")
    if device.type != "cuda":
        peak = "peak n/a (CPU)"
    row["summary"] = (
        f"{row['samples_per_s']:.0f} samples/s{ratio}, {peak}, skipped {row['skipped_steps']}"
    )
    checks = []
    if row["target_speed_pass"] is not None:
        checks.append(_verdict(row["target_speed_pass"], f"speed>={SPEED_TARGET}x"))
    if row["target_memory_pass"] is not None:
        checks.append(_verdict(row["target_memory_pass"], f"mem<={MEMORY_TARGET}x"))
    row["check"] = ", ".join(checks) or "-"
    row["failed"] = False  # targets are measurements, not errors
    return row


# -- 2. PPO with the learner on the GPU and on the CPU -------------------------------------


def _flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def expected_metrics(preset: str, module_id: str, amp_dtype: torch.dtype | None) -> list[str]:
    """The component metrics a run of ``preset`` must report (the package's own keys)."""
    from rllib_ext.connectors.batching import BATCHING_IMPL_KEY
    from rllib_ext.connectors.death_mask import DEAD_FRACTION_KEY
    from rllib_ext.connectors.gae import GAE_IMPL_KEY, GAE_TIME_KEY
    from rllib_ext.connectors.value_norm import MEAN_KEY, STD_KEY
    from rllib_ext.envs.smac.env_runner import SMAX_BATCHED_METRIC, SMAX_FUSED_METRIC
    from rllib_ext.learners.amp import AMP_METRIC

    learner = [GAE_IMPL_KEY, GAE_TIME_KEY, BATCHING_IMPL_KEY]
    runner: list[str] = []
    if preset.startswith("smax"):
        learner += [MEAN_KEY, STD_KEY, DEAD_FRACTION_KEY]
        runner += [SMAX_BATCHED_METRIC, SMAX_FUSED_METRIC]
        if amp_dtype is not None:
            learner.append(f"{AMP_METRIC}/dtype")
        if amp_dtype == torch.float16:
            learner += [f"{AMP_METRIC}/loss_scale", f"{AMP_METRIC}/skipped_steps"]
    return [f"learners/{module_id}/{k}" for k in learner] + [f"env_runners/{k}" for k in runner]


def _learner_module_and_device(algo: Any) -> tuple[str, str]:
    """The (first) module id and the device of its parameters on the (local) learner."""

    def probe(learner: Any) -> tuple[str, str]:
        module_id = next(iter(learner.module.keys()))
        return module_id, str(next(learner.module[module_id].parameters()).device)

    return next(iter(algo.learner_group.foreach_learner(probe))).get()


def _ppo_one(preset: str, gpus: int, sizes: Sizes) -> dict[str, Any]:
    from rllib_ext.amp_choice import resolve_amp_dtype
    from rllib_ext.cli.ppo_config import build_algo_config, check_settings
    from rllib_ext.cli.runconfig import resolve_settings

    overrides = sizes.ppo_training[preset]
    settings = resolve_settings(
        {}, preset=preset, set_values=[f"{k}={v}" for k, v in overrides.items()]
    )
    replace: dict[str, Any] = {"num_gpus_per_learner": float(gpus), "seed": 0}
    if sizes.ppo_envs[preset]:
        replace["num_envs_per_env_runner"] = sizes.ppo_envs[preset]
    settings = dataclasses.replace(settings, **replace)
    check_settings(settings)
    started = time.perf_counter()
    algo = build_algo_config(settings).build_algo()
    try:
        build_s = time.perf_counter() - started
        module_id, learner_device = _learner_module_and_device(algo)
        algo.train()  # warm-up: compilation, allocator, first weight sync
        steps, started = 0, time.perf_counter()
        for _ in range(sizes.ppo_iterations):
            result = algo.train()
            steps += int(result["env_runners"]["num_env_steps_sampled"])
        seconds = time.perf_counter() - started
    finally:
        algo.stop()
    flat = _flatten(result)
    amp_dtype = resolve_amp_dtype(settings.extensions["amp"], torch.device(learner_device))
    expected = expected_metrics(preset, module_id, amp_dtype)
    jax = sys.modules.get("jax")
    return {
        "preset": preset,
        "num_gpus_per_learner": gpus,
        "learner_device": learner_device,
        "module_id": module_id,
        "build_s": build_s,
        "iterations": sizes.ppo_iterations,
        "env_steps": steps,
        "seconds": seconds,
        "env_steps_per_s": steps / seconds,
        "amp_dtype": flat.get(f"learners/{module_id}/rllib_ext/amp/dtype", "float32"),
        "metrics": {k: flat[k] for k in expected if k in flat},
        "missing_metrics": [k for k in expected if k not in flat],
        "jax_backend": jax.default_backend() if jax is not None else None,
    }


def run_ppo(
    sizes: Sizes, device: torch.device, presets: tuple[str, ...] | list[str] = PPO_PRESETS
) -> list[dict[str, Any]]:
    """Each preset twice, learner on ``device`` (1 GPU) and on the CPU; env steps/s compared."""
    rows = []
    gpus = 1 if device.type == "cuda" else 0
    for preset in presets:
        arms: dict[str, dict[str, Any]] = {}
        for arm, arm_gpus in (("gpu", gpus), ("cpu", 0)):
            try:
                arms[arm] = {"arm": arm, **_ppo_one(preset, arm_gpus, sizes)}
            except Exception:  # noqa: BLE001 - the other arm and preset still run
                rows.append(error_row(f"{preset} learner={arm}", preset=preset, arm=arm))
        speedup = None
        if len(arms) == 2:
            speedup = arms["gpu"]["env_steps_per_s"] / arms["cpu"]["env_steps_per_s"]
        for arm, row in arms.items():
            row["x_cpu_learner"] = (speedup if arm == "gpu" else 1.0) if speedup else None
            row["case"] = f"{preset} learner={arm} ({row['learner_device']})"
            ratio = f" x{row['x_cpu_learner']:.2f}" if row["x_cpu_learner"] else ""
            row["summary"] = (
                f"{row['env_steps_per_s']:.0f} env steps/s{ratio}, amp {row['amp_dtype']}, "
                f"{len(row['metrics'])} component metrics"
            )
            missing = row["missing_metrics"]
            row["failed"] = bool(missing)
            checks = [f"FAIL missing {missing}" if missing else "metrics pass"]
            if arm == "gpu" and preset.startswith("smax") and speedup is not None:
                row["target_faster_pass"] = speedup > 1.0
                checks.append(_verdict(speedup > 1.0, "gpu>cpu"))
            row["check"] = ", ".join(checks)
            rows.append(row)
    return rows


# -- 4. The tutorial's chapter 4 -----------------------------------------------------------


def run_chapter4(
    sizes: Sizes, *, dry_run: bool, ray_address: str, timeout_s: float
) -> list[dict[str, Any]]:
    """Chapter 4 as ``tests/tutorial/test_chapters.py`` runs it: a subprocess joined to this
    Ray, ``RLLIB_EXT_FIT_RESOURCES=1``, an iteration cap, killed after ``timeout_s`` (inside the
    step's cap). ``dry_run``: the chapter's own config with a tiny batch
    (:func:`chapter4_tiny`), since the printed one takes ~70 s per iteration of fp16 on a CPU."""
    token = Path.home() / ".ray" / "auth_token"  # Ray's token file, before HOME moves
    with tempfile.TemporaryDirectory(prefix="gpu_check_ch4_") as tmp:
        env = dict(os.environ)
        if token.is_file():
            env.setdefault("RAY_AUTH_TOKEN_PATH", str(token))
        env.update(
            RLLIB_EXT_FIT_RESOURCES="1",
            RLLIB_EXT_MAX_ITERATIONS=str(sizes.chapter4_iterations),
            RAY_ADDRESS=ray_address,
            HOME=tmp,  # Tune's default storage, ~/ray_results
            PYTHONUNBUFFERED="1",
        )
        command = [sys.executable, str(CHAPTER4)]
        if dry_run:
            command = [sys.executable, __file__, "chapter4-tiny"]
        started = time.perf_counter()
        proc = subprocess.run(
            command, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(
                f"chapter 4 exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
            )
        (path,) = Path(tmp, "ray_results").rglob("result.json")
        results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = results[-1]
    learner = last["learners"]["default_policy"]
    config = last["config"]
    row = {
        "iterations": len(results),
        "seconds": seconds,
        "env_steps": int(last["num_env_steps_sampled_lifetime"]),
        "episode_reward_mean": last.get("episode_reward_mean"),
        "num_gpus_per_learner": config["num_gpus_per_learner"],
        "amp": config["learner_config_dict"]["amp"],
        "amp_dtype": learner.get("rllib_ext/amp/dtype"),
        "loss_scale": learner.get("rllib_ext/amp/loss_scale"),
        "skipped_steps_lifetime": learner.get("rllib_ext/amp/skipped_steps_lifetime"),
        "tiny_batch": dry_run,
    }
    ok = (
        row["iterations"] == sizes.chapter4_iterations
        and row["amp_dtype"] == "float16"
        and row["loss_scale"] is not None
        and (dry_run or row["num_gpus_per_learner"] >= 1)  # the fitting kept the GPU learner
    )
    row["case"] = "chapter4.py" + (" (tiny batch)" if dry_run else "")
    row["summary"] = (
        f"{row['iterations']} it in {seconds:.0f} s, gpus/learner {row['num_gpus_per_learner']}, "
        f"amp {row['amp_dtype']}, scale {row['loss_scale']}, "
        f"skipped {row['skipped_steps_lifetime']}"
    )
    row["check"] = _verdict(ok, "fp16 active")
    row["failed"] = not ok
    return [row]


def chapter4_tiny() -> None:
    """Chapter 4's config object and its ``tune.run`` call, with a tiny train batch."""
    from rllib_ext import tune

    config = runpy.run_path(str(CHAPTER4), run_name="chapter4_config")["config"]
    config.training(train_batch_size=128, minibatch_size=64, num_epochs=1)
    config.env_runners(num_env_runners=0)
    tune.run("PPO", config=config.to_dict(), stop={"episode_reward_mean": 450}, verbose=1)


if __name__ == "__main__":
    if sys.argv[1:] != ["chapter4-tiny"]:
        sys.exit(f"usage: {sys.argv[0]} chapter4-tiny   (called by gpu_check.py --dry-run)")
    chapter4_tiny()
