#!/usr/bin/env bash
# On a GPU machine with two or more GPUs (issue 21): the multi-device suite, the core's GPU
# suite on each device (KMM_TEST_DEVICE), compute-sanitizer memcheck and racecheck over the
# multi-device suite, and the multi-device benchmark. Usage: run_devices.sh [suite|bench|all].
# Logs go to $OUT; the benchmark's figures replace bench/results/devices.md.
set -u
. "$(dirname "$0")/cuda_libs.sh"
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
what=${1:-all}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
nvidia-smi topo -m 2>&1 | head -8 | tee -a "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
export KMM_TEST_GPU=1 NCCL_NVLS_ENABLE=0
if [ "$what" != bench ]; then
  {
    for mode in pool cuda_async direct; do
      echo "== multi_device, alloc mode $mode"
      KMM_TEST_ALLOC_MODE=$mode timeout 120 .gpu/tests/multi_device --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|not run"
    done
    ndev=$(nvidia-smi -L | wc -l)
    export KMM_HOST_DEVICES=$ndev    # the suites' host-backend managers follow KMM_TEST_DEVICE too
    for d in $(seq 0 $((ndev - 1))); do    # the devices at once, one log each
      for t in .gpu/tests/*; do
        n=$(basename "$t")
        case $n in header|multi_device|*_on_cpu|trust_stress) continue;; esac
        printf '== device %s %s: ' "$d" "$n"
        KMM_TEST_DEVICE=$d timeout 150 "$t" --test-threads=1 2>&1 | grep -E "test result|panicked|last kmm error" | tr '\n' ' '
        echo
      done > "$out/device$d.log" 2>&1 &
    done
    wait
    cat "$out"/device*.log
  } 2>&1 | tee "$out/gpu_tests.log"
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool multi_device"
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 .gpu/tests/multi_device --test-threads=1 2>&1 \
      | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|Program hit|Invalid|hazard" | head -20
  done 2>&1 | tee "$out/sanitizer.log"
fi
if [ "$what" != suite ]; then
  .gpu/devices-bench 2>&1 | tee "$out/bench_devices.md"
fi
