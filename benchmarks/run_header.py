"""The ``{"header": ...}`` row of a benchmark's JSON-lines results (command, commit, machine, load),
and appending rows to such a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_header(**extra: Any) -> dict[str, Any]:
    """Command line, commit of the checkout the script runs from, CPU model and whether it has
    AVX512-BF16 (``lscpu``), core count and load average, plus ``extra`` (settings, versions)."""
    here = Path(__file__).resolve().parent
    commit = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    lscpu = subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu if "Model name" in ln), "")
    flags = next((ln for ln in lscpu if ln.startswith("Flags")), "")
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": commit,
        "machine": f"{model}, {os.cpu_count()} CPUs, avx512_bf16={'avx512_bf16' in flags}",
        "load_average": os.getloadavg(),
        **extra,
    }


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Appends ``rows`` (the header first) to the JSON-lines file ``path``, one per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
