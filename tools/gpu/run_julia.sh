#!/usr/bin/env bash
# On the GPU machine: the Julia package's tests on the CUDA backend, the Julia allocation
# benchmark beside its C-ABI peer, and the MRF notebook end to end. Needs .gpu-julia/ carried
# (julia-bundle.tar.xz from ../shared/tools/julia-device-bundle.sh, libkmm.so, kmm-bench) and
# Manifest.toml. Logs go to $OUT; the figures replace bench/results/julia_alloc.md and
# bench/results/mrf_pipeline.md.
set -u
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
. "$(dirname "$0")/cuda_libs.sh"
tar -xJf .gpu-julia/julia-bundle.tar.xz -C /tmp
export KMM_LIBRARY=$PWD/.gpu-julia/libkmm.so JULIA_NUM_THREADS=4
julia=/tmp/julia-bundle/julia
timeout 300 $julia --project=. test/runtests.jl 2>&1 | grep -vE "^\s*$" | tail -40 | tee "$out/julia_gpu_tests.log"
timeout 120 $julia --project=. bench/julia_alloc.jl 100000 2>&1 | tail -15 | tee "$out/julia_alloc.txt"
.gpu-julia/kmm-bench --quick 2>&1 | grep -E "kmm-bench|pair" | tee -a "$out/julia_alloc.txt"
timeout 150 $julia --project=. examples/mrf_pipeline.jl 2>&1 | tail -30 | tee "$out/mrf_pipeline.txt"
cp examples/output/*.svg examples/output/errors.txt "$out/" 2>/dev/null
ls examples/output
