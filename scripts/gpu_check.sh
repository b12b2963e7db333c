#!/usr/bin/env bash
# The device check, in one run on a machine with an NVIDIA GPU (an H200 in mind), ~5 minutes:
#   1. a Python whose torch has CUDA: $PYTHON, else python3, else .venv/bin/python; if none has it,
#      a fresh build/venv-gpu with torch==2.14.1 (PyPI's default wheel is a CUDA build) and nvidia-nccl-cu13
#   2. build and install pagedcore into it (editable, --no-deps: it must not download anything else)
#   3. pytest -m gpu tests/gpu
#   4. bench/bench_cuda.py: us per call and K/V GB/s (decode), TFLOP/s (prefill)
# Usage: scripts/gpu_check.sh [extra pytest args]      Logs: $OUT (if set) or build/gpu-check
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-build/gpu-check}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
step() { printf '\n==== %s (%s)\n' "$1" "$(date +%T)"; }

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)' 2>/dev/null; }

step "1. python with CUDA torch"
PY=""
for candidate in "${PYTHON:-}" python3 .venv/bin/python; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null && has_cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
  echo "no Python here has a CUDA torch: creating build/venv-gpu (needs a package index)"
  python3 -m venv build/venv-gpu && PY=build/venv-gpu/bin/python
  "$PY" -m pip install -q torch==2.14.1 nvidia-nccl-cu13 numpy pytest pybind11 scikit-build-core cmake ninja \
    || { echo "FAILED: could not install a CUDA torch (offline?); set PYTHON to a Python with one"; exit 2; }
  has_cuda_torch "$PY" || { echo "FAILED: the installed torch sees no GPU"; exit 2; }
fi
# pyproject.toml sets a pytest timeout, which --strict-config refuses without the plugin.
"$PY" -c 'import pytest_timeout' 2>/dev/null || "$PY" -m pip install -q pytest-timeout \
  || { echo "FAILED: pytest-timeout is missing (pip install pytest-timeout)"; exit 2; }
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "|", torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import nvidia.nccl' 2>/dev/null && echo "nvidia-nccl: present" || echo "nvidia-nccl: absent (NCCL tests will fail)"

step "2. build (CUDA kernels for sm_90)"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if ! timeout 420 "$PY" -m pip install -q --no-build-isolation --no-deps -e . >"$LOGS/build.log" 2>&1; then
  tail -40 "$LOGS/build.log"; echo "FAILED: build (log: $LOGS/build.log)"; exit 3
fi
"$PY" -c 'import pagedcore._core as c; print("has_cuda", c.has_cuda, "devices", c.cuda_device_count())'

step "3. pytest -m gpu tests/gpu"
timeout 300 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider --junitxml="$LOGS/gpu-tests.xml" "$@" 2>&1 \
  | tee "$LOGS/gpu-tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}

step "4. bench/bench_cuda.py"
timeout 180 "$PY" bench/bench_cuda.py 2>&1 | tee "$LOGS/bench.log"
bench_rc=${PIPESTATUS[0]}

step "done: tests rc=$tests_rc, bench rc=$bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
