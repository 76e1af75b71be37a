#!/usr/bin/env bash
# On the GPU machine: qMRI and run-time module tests on CUDA, then the qMRI benchmark.
set -u
out=${OUT:-/tmp/kmm-out}
. "$(dirname "$0")/cuda_libs.sh"
export KMM_TEST_GPU=1
{
  for t in qmri_gpu module_gpu qmri_physics qmri_match qmri_errors; do
    echo "== $t"
    timeout 240 .gpu/tests/$t --test-threads=1 --nocapture 2>&1 | grep -vE "^\s*$" | tail -40
  done
} 2>&1 | tee "$out/qmri_gpu_tests.log"
timeout 300 .gpu/qmri-bench 2>&1 | tee "$out/qmri_bench.txt"
