#!/usr/bin/env bash
# Runs every test suite of Kmm on the default backend (host when there is no GPU):
# Rust (unit, C-ABI integration, header staleness, qMRI, trust suite at CI size; Valgrind on a
# C driver; AddressSanitizer over the host suite when a nightly toolchain is there), the Julia
# package (bindings staleness, tests, doc examples) and the Python package. Prints each
# runner's summary lines at the end and exits non-zero when any suite failed.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
status=0
step() {
  local name=$1; shift
  echo "=== $name: $*"
  if "$@" 2>&1 | tee "$logs/$name.log"; then echo "=== $name: ok"; else echo "=== $name: FAILED"; status=1; fi
}

step rust-build cargo build --release --manifest-path rust/Cargo.toml --workspace
step rust-test cargo test --release --manifest-path rust/Cargo.toml --workspace
step valgrind bash tools/valgrind_c_abi.sh
if cargo +nightly --version >/dev/null 2>&1; then
  step asan bash tools/asan.sh
else
  echo "=== asan: SKIPPED (no nightly Rust toolchain for -Zsanitizer=address)"
fi
step julia-bindings julia gen/generator.jl --check
step julia-test julia --project=. test/runtests.jl
# The Numba plugin's compiled calls, in place (a wheel build compiles them too); the tests then
# require them instead of skipping their half.
step python-build bash -c "cd python && python3 setup.py -q build_ext --inplace"
KMM_REQUIRE_COMPILED=1 step python-test python3 -m pytest python/tests -q -rs -p no:cacheprovider

echo
echo "=== summary"
grep -h "^test result:" "$logs/rust-test.log" | awk '{p+=$4; f+=$6; i+=$8} END {printf "rust: %d passed, %d failed, %d ignored (cargo test, %d binaries)\n", p, f, i, NR}'
tail -n 1 "$logs/valgrind.log"
[ -f "$logs/asan.log" ] && grep -h "^test result:" "$logs/asan.log" | awk '{p+=$4; f+=$6} END {printf "asan: %d passed, %d failed (host suite under AddressSanitizer)\n", p, f}'
grep -hE "^(Test Summary|Kmm\.jl|  [A-Za-z].*\|)" "$logs/julia-test.log" | tail -3
tail -n 1 "$logs/python-test.log"
rust_passed=$(grep -h "^test result:" "$logs/rust-test.log" | awk '{p+=$4} END {print p+0}')
rust_failed=$(grep -h "^test result:" "$logs/rust-test.log" | awk '{f+=$6} END {print f+0}')
julia_line=$(grep -hE "^Kmm\.jl +\|" "$logs/julia-test.log" | tail -1)
julia_passed=$(echo "$julia_line" | awk -F'|' '{split($2, a, " "); print a[1]+0}')
julia_total=$(echo "$julia_line" | awk -F'|' '{split($2, a, " "); print a[length(a)]+0}')
py_passed=$(tail -n 1 "$logs/python-test.log" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || echo 0)
py_failed=$(tail -n 1 "$logs/python-test.log" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+" || echo 0)
julia_failed=$(( julia_total - julia_passed ))
[ "$status" -eq 0 ] || julia_failed=$(( julia_failed > 0 ? julia_failed : 0 ))
total_passed=$(( rust_passed + julia_passed + py_passed ))
total_failed=$(( rust_failed + julia_failed + py_failed + (status != 0 && rust_failed + julia_failed + py_failed == 0 ? 1 : 0) ))
echo "all: $total_passed passed, $total_failed failed"
rm -rf "$logs"
exit $status
