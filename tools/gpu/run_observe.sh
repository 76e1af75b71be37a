#!/usr/bin/env bash
# Issue 20 on the GPU machine (after tools/gpu/build.sh here, with the base build's kmm-bench in
# .gpu/base/ and traces in .gpu/traces/): tracing's cost (kmm-bench --traces, this build with
# the trace off and recording to a ring, against the base build without traces, alternating),
# the observe tests in the three allocation modes, and replays of recorded traces.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/gpu/cuda_libs.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "code: $(cat .gpu/COMMIT)"
for i in 1 2 3; do
  echo "== new $i"; .gpu/kmm-bench --traces | grep "trace "
  echo "== base $i"; .gpu/base/kmm-bench --traces | grep "trace "
done
for mode in pool cuda_async direct; do
  echo "== observe, $mode"
  KMM_TEST_GPU=1 KMM_TEST_ALLOC_MODE=$mode .gpu/tests/observe -q 2>&1 | grep -E "test result|panicked|FAILED"
done
for t in abi_buffers abi_compaction stream_model; do
  echo "== $t"; KMM_TEST_GPU=1 .gpu/tests/$t -q 2>&1 | grep -E "test result|panicked|FAILED"
done
for trace in .gpu/traces/*.csv; do
  echo "== replay $trace"; .gpu/replay "$trace" --repeat 5
done
echo "== python test_observe.py on CUDA"
PYTHONPATH=python KMM_LIBRARY=$PWD/.gpu/libkmm.so KMM_TEST_BACKEND=cuda python3 -m pytest -q -p no:cacheprovider python/tests/test_observe.py 2>&1 | tail -3
