#!/usr/bin/env bash
# GPU part of the trust suite (run by hand on a CUDA machine): the model, fault and stress tests
# on the CUDA backend, then the same binaries under compute-sanitizer memcheck (with leak check)
# and racecheck. Fails on the first error. Usage: tools/gpu_sanitizers.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/rust"
export KMM_TEST_GPU=1
cargo test --release -p kmm --test trust_model --test trust_faults --test trust_stress -- --nocapture
bins=$(cargo test --release -p kmm --test trust_model --test trust_faults --test trust_stress --no-run \
         --message-format=json 2>/dev/null | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable"): print(m["executable"])')
# Smaller runs: the sanitizers slow every CUDA call down by one to two orders of magnitude.
export KMM_TRUST_CASES=3 KMM_TRUST_STEPS=600 KMM_TRUST_STRESS_SECS=3 KMM_TRUST_FAULT_ROUNDS=60
for bin in $bins; do
    echo "== memcheck $bin"
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 "$bin" --test-threads=1
    echo "== racecheck $bin"
    compute-sanitizer --tool racecheck --error-exitcode 1 "$bin" --test-threads=1
done
echo "gpu_sanitizers: clean"
