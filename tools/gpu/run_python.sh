#!/usr/bin/env bash
# On the GPU machine: the Python package's GPU tests and the allocator benchmark against RMM.
# Needs .whl/ carried (kmm wheel built here, rmm-cu13 and friends for Python 3.12) and
# python/kmm/_plugin_calls.abi3.so (`python setup.py build_ext --inplace` in python/): the tests
# import kmm from the source tree, and require the compiled module. Logs and JSON go to $OUT; the
# figures replace bench/results/python_alloc.md.
set -u
out=${OUT:-/tmp/kmm-out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
[ -f .gpu/COMMIT ] && export KMM_COMMIT="$(cat .gpu/COMMIT)"
export PYTHONPATH=/tmp/site KMM_LIBRARY=/tmp/site/kmm/libkmm.so KMM_TEST_GPU=1 KMM_REQUIRE_COMPILED=1
timeout 300 python3 -m pytest python/tests -q -rs -x -p no:cacheprovider 2>&1 | tail -40 | tee "$out/python_gpu_tests.log"
# The documentation's python blocks that need a GPU (CI runs the others on the host backend).
timeout 300 python3 tools/run_doc_blocks.py --gpu README.md docs/*.md 2>&1 | tail -40 | tee "$out/doc_blocks_gpu.log"
timeout 290 python3 bench/python_alloc.py "$out/python_alloc.json" 2>&1 | tail -30 | tee "$out/python_alloc.txt"
timeout 120 python3 bench/python_alloc.py "$out/numba_interleaved.json" --only numba --numba-interleaved --repeats 11 2>&1 |
  tail -24 | tee "$out/numba_interleaved.txt"
timeout 120 python3 bench/python_alloc.py "$out/cupy_interleaved.json" --only cupy --cupy-interleaved --repeats 11 2>&1 |
  tail -16 | tee "$out/cupy_interleaved.txt"
# PyTorch cannot swap allocators in one process: more fresh-process rounds instead, for a
# tighter interval on its ratio than the main run's five.
timeout 150 python3 bench/python_alloc.py "$out/torch_rounds.json" --only torch --repeats 11 2>&1 |
  tail -12 | tee "$out/torch_rounds.txt"
# CuPy's allocators alone (no array around the allocation), beside the floor of any allocator
# outside CuPy's pool: where the cupy.empty ratio's difference comes from.
timeout 120 python3 bench/python_alloc.py "$out/cupy_allocator_only.json" --only cupy --cupy-interleaved \
  --allocator-only --repeats 11 2>&1 | tail -16 | tee "$out/cupy_allocator_only.txt"
# The JSON (for bench/pooled_ratio.py) in one file: at most eight files come back.
(cd "$out" && tar czf python_alloc_json.tgz ./*.json && rm -f ./*.json)
