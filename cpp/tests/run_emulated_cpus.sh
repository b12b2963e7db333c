#!/usr/bin/env bash
# The tests again on CPUs this machine is not: each C++ test binary (and, with --python, a set of
# Python tests) under QEMU's user-mode emulator posing as an older x86 CPU, so that the run-time
# dispatch and the AVX2 / generic code paths run where the CPU really lacks AVX-512 (an AVX-512
# machine only reaches them through PAGEDCORE_KERNEL_ISA, which cannot catch an AVX-512
# instruction leaking into them, or a CPUID check that picks the wrong path).
#
#   cpp/tests/run_emulated_cpus.sh [--python] [build_dir=build/cpp]
#
# CPU models (QEMU's names; QEMU 7.2's TCG emulates AVX2/FMA/F16C but no AVX-512 or AMX):
#   EPYC-Rome   AMD Zen 2, AVX2 only: the AVX2 EPYC of this project's machines
#   Haswell-v4  Intel, AVX2 only
#   Westmere    SSE4.2, no AVX: the generic kernels (C++ tests only)
# Needs qemu-x86_64 (Debian: apt-get install qemu-user). Emulation is ~10-50x slower than the CPU:
# timings here mean nothing, only pass/fail and the ISA each run reports.
set -euo pipefail
cd "$(dirname "$0")/../.."
python_tests=0
if [ "${1:-}" = "--python" ]; then python_tests=1; shift; fi
build_dir=${1:-build/cpp}
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "run_emulated_cpus.sh: qemu-x86_64 not found; install QEMU's user-mode emulator (apt-get install qemu-user)" >&2
  exit 2
fi
if [ ! -d "$build_dir/cpp/tests" ]; then
  echo "run_emulated_cpus.sh: no test binaries under $build_dir/cpp/tests; build them first (make test-cpp)" >&2
  exit 2
fi
# pool_survives_fork forks a process whose thread pool is running: qemu-user (7.2) aborts in its own
# fork handling there (an assertion in QEMU, not in the test), so it is skipped under emulation.
export PAGEDCORE_TEST_SKIP=pool_survives_fork
# QEMU warns about every CPUID feature its TCG lacks (clzero, xsaves, ...): not ours to read.
quiet() { grep -v "TCG doesn't support requested feature" || true; }

failed=0
for cpu in EPYC-Rome Haswell-v4 Westmere; do
  echo "== C++ tests on an emulated $cpu"
  for t in "$build_dir"/cpp/tests/test_*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    if out=$(qemu-x86_64 -cpu "$cpu" "$t" 2>&1); then status=ok; else status=FAILED; failed=1; fi
    summary=$(printf '%s\n' "$out" | quiet | tail -n 1)
    echo "  $(basename "$t"): $status ($summary)"
    [ "$status" = ok ] || printf '%s\n' "$out" | quiet | tail -n 30
  done
done

if [ "$python_tests" = 1 ]; then
  py=.venv/bin/python
  cpu=EPYC-Rome  # one CPU model: the Python suites take minutes under emulation
  echo "== Python tests on an emulated $cpu"
  # The ISA the kernels chose by themselves (no PAGEDCORE_KERNEL_ISA): must be avx2 there.
  isa=$(env -u PAGEDCORE_KERNEL_ISA qemu-x86_64 -cpu "$cpu" $py -c \
        "from pagedcore import _core; print(_core.kernel_isa())" 2>&1 | quiet)
  echo "  kernel ISA chosen at run time: $isa"
  if [ "$isa" != avx2 ]; then echo "  expected avx2 on $cpu"; failed=1; fi
  # Kernels against their naive oracles, quantized kernels against dequantise-then-matmul, and the
  # model path against HF transformers token for token (tiny random models and the default GGUF).
  if ! qemu-x86_64 -cpu "$cpu" $py -m pytest -q -p no:cacheprovider -m "not gpu and not multi_gpu" \
      tests/kernels tests/quantization tests/models/test_llama_parity.py tests/models/test_default_gguf.py \
      2>&1 | quiet | tail -n 25; then
    failed=1
  fi
fi
exit $failed
