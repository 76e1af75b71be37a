#!/usr/bin/env bash
# Runs every test suite of Kmm on the default backend (host when there is no GPU):
# Rust (unit, C-ABI integration, header staleness, qMRI, trust suite at CI size; Valgrind on a
# C driver; AddressSanitizer over the host suite when a nightly toolchain is there), the Julia
# package (bindings staleness; its tests, with the julia blocks of the docs, through Pkg.test as
# a user runs them: Pkg.develop into a fresh depot with an empty registry), the Python package,
# and the python and sh blocks of README.md and docs/ (tools/run_doc_blocks.py). Prints each
# runner's summary line at the end and exits non-zero when any suite failed.
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
# Pkg.test("Kmm") as a newcomer runs it: a fresh depot whose only registry is an empty local one
# (no network needed; README.md, "Without network"), a fresh environment, Pkg.develop of this
# checkout. It runs test/runtests.jl, so the suite is not run a second time without Pkg.
julia_pkg_test() {
  local tmp; tmp=$(mktemp -d)
  mkdir -p "$tmp/depot/registries/Empty" "$tmp/env"
  printf 'name = "Empty"\nuuid = "e6d3f5b4-7c21-4e0a-9c43-1d0b2a8f6e15"\nrepo = ""\n\n[packages]\n' \
    > "$tmp/depot/registries/Empty/Registry.toml"
  env -u JULIA_LOAD_PATH -u JULIA_PROJECT JULIA_DEPOT_PATH="$tmp/depot" JULIA_PKG_OFFLINE=true \
    julia --project="$tmp/env" -e 'using Pkg; Pkg.develop(path = ARGS[1]); Pkg.test("Kmm")' "$PWD"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
step julia-bindings julia gen/generator.jl --check
step julia-test julia_pkg_test
# The Numba plugin's compiled calls, in place (a wheel build compiles them too); the tests then
# require them instead of skipping their half.
step python-build bash -c "cd python && python3 setup.py -q build_ext --inplace"
KMM_REQUIRE_COMPILED=1 step python-test python3 -m pytest python/tests -q -rs -p no:cacheprovider
step docs python3 tools/run_doc_blocks.py

echo
echo "=== summary"
grep -h "^test result:" "$logs/rust-test.log" | awk '{p+=$4; f+=$6; i+=$8} END {printf "rust: %d passed, %d failed, %d ignored (cargo test, %d binaries)\n", p, f, i, NR}'
tail -n 1 "$logs/valgrind.log"
[ -f "$logs/asan.log" ] && grep -h "^test result:" "$logs/asan.log" | awk '{p+=$4; f+=$6} END {printf "asan: %d passed, %d failed (host suite under AddressSanitizer)\n", p, f}'
# Julia: the row of the top testset, Kmm.jl, read by the column names of the "Test Summary:"
# header above it (Pass, Fail, Error, Broken, Total and, on newer Julia, Time; empty ones are
# left out), so that the printed line carries the numbers.
julia_counts=$(awk -F'|' '
  /^Test Summary:/ { n = split($2, names, " "); next }
  /^Kmm\.jl +\|/ { split($2, vals, " "); delete c; for (i = 1; i <= n; i++) c[names[i]] = vals[i]
                    line = sprintf("%d %d %d %d %d", c["Pass"], c["Fail"], c["Error"], c["Broken"], c["Total"]) }
  END { print (line == "" ? "0 0 0 0 0" : line) }' "$logs/julia-test.log")
read -r julia_passed julia_fail julia_error julia_broken julia_total <<<"$julia_counts"
if [ "$julia_total" -gt 0 ]; then
  echo "julia: $julia_passed passed, $julia_fail failed, $julia_error errored, $julia_broken broken of $julia_total (Test Summary of Kmm.jl, Pkg.test in a fresh depot)"
else
  echo "julia: no Test Summary of Kmm.jl (Pkg.test did not get to run the tests; see the julia-test log above)"
fi
tail -n 1 "$logs/python-test.log"
tail -n 1 "$logs/docs.log"
rust_passed=$(grep -h "^test result:" "$logs/rust-test.log" | awk '{p+=$4} END {print p+0}')
rust_failed=$(grep -h "^test result:" "$logs/rust-test.log" | awk '{f+=$6} END {print f+0}')
py_passed=$(tail -n 1 "$logs/python-test.log" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || echo 0)
py_failed=$(tail -n 1 "$logs/python-test.log" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+" || echo 0)
docs_passed=$(tail -n 1 "$logs/docs.log" | grep -oE "^docs: [0-9]+ passed" | grep -oE "[0-9]+" || echo 0)
docs_failed=$(tail -n 1 "$logs/docs.log" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+" || echo 0)
julia_failed=$(( julia_fail + julia_error ))
total_passed=$(( rust_passed + julia_passed + py_passed + docs_passed ))
total_failed=$(( rust_failed + julia_failed + py_failed + docs_failed ))
[ "$status" -ne 0 ] && [ "$total_failed" -eq 0 ] && total_failed=1   # a step failed without a failing test
echo "all: $total_passed passed, $total_failed failed"
rm -rf "$logs"
exit $status
