#!/usr/bin/env bash
# On the GPU machine: the Julia package's tests on the CUDA backend, the Julia allocation
# benchmark beside its C-ABI peer, and the MRF notebook end to end. Needs .gpu-julia/ carried
# (julia-bundle.tar.xz from ../shared/tools/julia-device-bundle.sh, oblas.tar.xz, libkmm.so,
# kmm-bench, and optionally base/ with a base commit's Project.toml and src/). Logs go to $OUT;
# the figures replace bench/results/julia_alloc.md and bench/results/mrf_pipeline.md.
set -u
out=${OUT:-/tmp/kmm-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
echo "date $(date -u +%FT%TZ), commit $(cat .gpu/COMMIT 2>/dev/null || echo unknown)" | tee -a "$out/device.txt"
. "$(dirname "$0")/cuda_libs.sh"
tar -xJf .gpu-julia/julia-bundle.tar.xz -C /tmp
# OpenBLAS beside the bundle (left out of it to fit the carry; the qMRI tests' linear algebra
# needs it): .gpu-julia/oblas.tar.xz holds jl/libopenblas64_* and deps/libgfortran*.
if [ -f .gpu-julia/oblas.tar.xz ]; then
  mkdir -p /tmp/oblas /tmp/julia-bundle/deps && tar -xJf .gpu-julia/oblas.tar.xz -C /tmp/oblas &&
    cp -a /tmp/oblas/jl/* /tmp/julia-bundle/usr/lib/x86_64-linux-gnu/julia/ && cp -a /tmp/oblas/deps/* /tmp/julia-bundle/deps/
else
  echo "no .gpu-julia/oblas.tar.xz: the tests that need OpenBLAS will error" | tee -a "$out/device.txt"
fi
export KMM_LIBRARY=$PWD/.gpu-julia/libkmm.so JULIA_NUM_THREADS=4
julia=/tmp/julia-bundle/julia
timeout 400 $julia --project=. test/runtests.jl 2>&1 | grep -vE "^\s*$" | tail -40 | tee "$out/julia_gpu_tests.log"
timeout 120 $julia --project=. bench/julia_alloc.jl 100000 2>&1 | tail -15 | tee "$out/julia_alloc.txt"
# The base's Kmm.jl (its Project.toml and src/ in .gpu-julia/base), alternating with this one's.
if [ -d .gpu-julia/base/src ]; then
  for i in 1 2; do
    for p in .gpu-julia/base .; do
      echo "== $p"
      timeout 60 $julia --project=$p bench/julia_alloc.jl 100000 2>&1 | grep -E "pair"
    done
  done 2>&1 | tee "$out/julia_alloc_ab.txt"
fi
.gpu-julia/kmm-bench --quick 2>&1 | grep -E "kmm-bench|pair" | tee -a "$out/julia_alloc.txt"
timeout 150 $julia --project=. examples/mrf_pipeline.jl 2>&1 | tail -30 | tee "$out/mrf_pipeline.txt"
cp examples/output/*.svg examples/output/errors.txt "$out/" 2>/dev/null
ls examples/output
