#!/usr/bin/env bash
# On the GPU machine: the stream-ordering checks of the core. The GPU suite in all three
# allocation modes (pool: every binary; cuda_async and direct: the binaries whose checks hold in
# any mode), compute-sanitizer memcheck and racecheck over the stream tests, and the allocation
# benchmark. Logs go to $OUT; the figures replace bench/results/core.md.
set -u
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
export KMM_TEST_GPU=1
run_suite() {
  local mode=$1; shift
  for t in "$@"; do
    [ "$t" = header ] && continue
    echo "== $mode $t"
    KMM_TEST_ALLOC_MODE=$mode timeout 150 ".gpu/tests/$t" --test-threads=1 2>&1 | grep -E "^test .*FAILED|test result|panicked" | head -20
  done
}
{
  run_suite pool $(ls .gpu/tests)
  for mode in cuda_async direct; do
    run_suite $mode abi_buffers abi_copies abi_streams abi_smoke gpu_streams stream_model qmri_gpu module_gpu
  done
} 2>&1 | tee "$out/gpu_tests.log"
{
  for tool in memcheck racecheck; do
    for t in gpu_streams abi_stream_order abi_buffers abi_copies abi_streams abi_compaction abi_lanes; do
      echo "== compute-sanitizer $tool $t"
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 .gpu/tests/$t --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|Program hit|Invalid|Race" | head -8
    done
  done
} 2>&1 | tee "$out/sanitizer.log"
.gpu/kmm-bench 2>&1 | tee "$out/bench_core.md"
