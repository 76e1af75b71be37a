#!/usr/bin/env bash
# Runs the host-backend test suite of the kmm crate under AddressSanitizer (nightly rustc,
# -Zsanitizer=address; LeakSanitizer on). Miri does not apply: the suite crosses FFI (libc
# sysinfo/malloc/free), spawns stream worker threads that run raw-pointer copies, and Miri is
# not installed here; ASan covers heap/stack use-after-free, overflows and leaks instead.
# Usage: tools/asan.sh [extra cargo test args]   Env: KMM_ASAN_TARGET_DIR (default rust/target/asan:
# per checkout, since test binaries keep the source path they were built from)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${KMM_ASAN_TARGET_DIR:-$root/rust/target/asan}"
export RUSTFLAGS="-Zsanitizer=address -Cdebuginfo=1"
export RUSTDOCFLAGS="-Zsanitizer=address"
# allocator_may_return_null: the model test asks for 2^47 bytes and expects OUT_OF_MEMORY.
export ASAN_OPTIONS="${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1:abort_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tools/lsan.supp}"
# Smaller runs: ASan is ~3x slower.
export KMM_TRUST_CASES="${KMM_TRUST_CASES:-12}" KMM_TRUST_STEPS="${KMM_TRUST_STEPS:-1500}"
export KMM_TRUST_STRESS_SECS="${KMM_TRUST_STRESS_SECS:-5}" KMM_TRUST_FAULT_ROUNDS="${KMM_TRUST_FAULT_ROUNDS:-200}"
cd "$root/rust"
cargo +nightly test -p kmm --target x86_64-unknown-linux-gnu --lib --tests "$@"
echo "asan: clean"
