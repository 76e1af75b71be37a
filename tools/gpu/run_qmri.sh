#!/usr/bin/env bash
# On the GPU machine: qMRI and run-time module tests on CUDA, then the qMRI benchmark. Logs go to
# $OUT; the figures replace bench/results/qmri.md.
set -u
out=${OUT:-/tmp/kmm-out}
. "$(dirname "$0")/cuda_libs.sh"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
export KMM_TEST_GPU=1
{
  for t in qmri_gpu module_gpu qmri_physics qmri_match qmri_errors; do
    echo "== $t"
    timeout 240 .gpu/tests/$t --test-threads=1 --nocapture 2>&1 | grep -vE "^\s*$" | tail -40
  done
} 2>&1 | tee "$out/qmri_gpu_tests.log"
timeout 300 .gpu/qmri-bench 2>&1 | tee "$out/qmri_bench.txt"
