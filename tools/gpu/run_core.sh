#!/usr/bin/env bash
# On the GPU machine: the core's test suite on the CUDA backend, compute-sanitizer memcheck over
# it, and the allocation/copy benchmark. Logs go to $OUT (the device tool's output folder); the
# figures replace bench/results/core.md.
set -u
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
export KMM_TEST_GPU=1
{
  for t in .gpu/tests/*; do
    # header: compares against cbindgen's output, which needs cargo (a host-side CI check)
    [ "$(basename "$t")" = header ] && continue
    echo "== $(basename "$t")"
    timeout 120 "$t" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|error" | head -60
  done
} 2>&1 | tee "$out/gpu_tests.log"
{
  for t in abi_buffers abi_copies abi_streams abi_manager abi_compaction abi_lanes; do
    [ -x .gpu/tests/$t ] || continue
    echo "== compute-sanitizer memcheck $t"
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 99 .gpu/tests/$t --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result|Program hit|Invalid" | head -20
    echo "exit $?"
  done
} 2>&1 | tee "$out/sanitizer.log"
.gpu/kmm-bench 2>&1 | tee "$out/bench_core.md"
