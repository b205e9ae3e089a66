#!/usr/bin/env bash
# The GPU check on a bare, offline machine, as one command (benchmarks/README.md, "GPU check"):
# installs the kit's wheels (download.py, here beforehand) into a clean folder with no index and
# no dependency resolution, puts it and the repository on PYTHONPATH, prints the versions, runs
# benchmarks/gpu_check.py under its time budget, and leaves everything under $OUT.
#
#   bash benchmarks/gpu_kit/launch.sh [gpu_check.py flags: --dry-run, --steps amp,codecs, ...]
#
# Environment: OUT (results, default /tmp/gpu_kit_out), PYTHON (python3), GPU_KIT_SITE (the
# install folder, /tmp/site: emptied first), GPU_CHECK_BUDGET_S (360), JAX_PLATFORMS (cpu: the
# SMAX rows simulate on the CPU, as env runners without a GPU do; set cuda to try JAX's GPU).
# $OUT gets: launch.log (everything printed), versions.json, gpu_check.json (rewritten after
# every step), launch.json (times, exit codes, the kit's size), ray_logs.tar.gz.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT="$REPO/benchmarks/gpu_kit"
OUT=${OUT:-/tmp/gpu_kit_out}
PYTHON=${PYTHON:-python3}
SITE=${GPU_KIT_SITE:-/tmp/site}
BUDGET=${GPU_CHECK_BUDGET_S:-360}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/launch.log") 2>&1
t0=$(date +%s.%N)
since() { "$PYTHON" -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$1"; }

shopt -s nullglob
wheels=("$KIT"/wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "launch.sh: no wheels in $KIT/wheels; run python3 benchmarks/gpu_kit/download.py first and carry benchmarks/gpu_kit/wheels" >&2
  exit 3
fi
kit_bytes=$(cat "${wheels[@]}" | wc -c)
rm -rf "$SITE"
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$SITE" "${wheels[@]}"; then
  echo "launch.sh: pip install of the kit into $SITE failed" >&2
  exit 3
fi
install_s=$(since "$t0")
echo "# installed ${#wheels[@]} wheels ($((kit_bytes / 1048576)) MiB) into $SITE in ${install_s} s"

export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
# Ray's session (and logs) under a short path of our own; unix socket paths must stay short.
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/gk_ray}
"$PYTHON" - "$OUT/versions.json" <<'EOF'
import importlib.metadata as md, json, platform, sys
names = ["torch", "numpy", "jax", "jaxlib", "numba", "ray", "gymnasium", "pettingzoo",
         "tensorboardX", "jaxmarl", "gymnax", "pydantic", "pytest"]
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
found = {"python": platform.python_version(), "executable": sys.executable}
found.update({n: version(n) for n in names})
import torch
found["cuda"] = torch.version.cuda
found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
import ray
found["ray_file"] = ray.__file__
print("# versions:", json.dumps(found))
open(sys.argv[1], "w").write(json.dumps(found, indent=1) + "\n")
EOF

t1=$(date +%s.%N)
timeout --kill-after=10 "$((${BUDGET%.*} + 30))" \
  "$PYTHON" "$REPO/benchmarks/gpu_check.py" --budget "$BUDGET" --json "$OUT/gpu_check.json" "$@"
check_rc=$?
check_s=$(since "$t1")

logs=$(ls -d "$RAY_TMPDIR"/ray/session_*/logs "$RAY_TMPDIR"/session_*/logs 2>/dev/null | tail -n 1)
if [ -n "$logs" ]; then
  tar -czf "$OUT/ray_logs.tar.gz" -C "$(dirname "$logs")" logs
fi
wall_s=$(since "$t0")
cat > "$OUT/launch.json" <<EOF
{"check_rc": $check_rc, "install_s": $install_s, "check_s": $check_s, "wall_s": $wall_s,
 "wheels": ${#wheels[@]}, "wheel_bytes": $kit_bytes, "budget_s": $BUDGET,
 "jax_platforms": "$JAX_PLATFORMS", "args": "$*"}
EOF
echo "# gpu_check exit $check_rc; check ${check_s} s, wall ${wall_s} s; results in $OUT"
exit $check_rc
