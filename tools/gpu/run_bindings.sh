#!/usr/bin/env bash
# On the GPU machine: the Python and Julia suites on CUDA without their benchmarks (a check of
# binding changes where the allocation paths did not move; run_python.sh and run_julia.sh run
# the suites and the benchmarks). Needs .whl/, python/kmm/_plugin_calls.abi3.so and .gpu-julia/
# carried, as those scripts do. Logs go to $OUT.
set -u
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
(
  export PYTHONPATH=/tmp/site KMM_LIBRARY=/tmp/site/kmm/libkmm.so KMM_TEST_GPU=1 KMM_REQUIRE_COMPILED=1
  timeout 300 python3 -m pytest python/tests -q -rs -x -p no:cacheprovider 2>&1 | tail -15 | tee "$out/python_gpu_tests.log"
  timeout 300 python3 tools/run_doc_blocks.py --gpu README.md docs/*.md 2>&1 | tail -3 | tee "$out/doc_blocks_gpu.log"
)
. "$(dirname "$0")/cuda_libs.sh"
tar -xJf .gpu-julia/julia-bundle.tar.xz -C /tmp
mkdir -p /tmp/oblas /tmp/julia-bundle/deps && tar -xJf .gpu-julia/oblas.tar.xz -C /tmp/oblas &&
  cp -a /tmp/oblas/jl/* /tmp/julia-bundle/usr/lib/x86_64-linux-gnu/julia/ && cp -a /tmp/oblas/deps/* /tmp/julia-bundle/deps/
export KMM_LIBRARY=$PWD/.gpu-julia/libkmm.so JULIA_NUM_THREADS=4
timeout 300 /tmp/julia-bundle/julia --project=. test/runtests.jl 2>&1 | grep -vE "^\s*$|CHOLMOD|exception =|libcholmod|SuiteSparse" | tail -25 | tee "$out/julia_gpu_tests.log"
