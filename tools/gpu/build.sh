#!/usr/bin/env bash
# Builds the release test binaries and benchmarks into .gpu/ (ignored by git) for the GPU
# machine, which has no Rust toolchain. Usage: tools/gpu/build.sh [cargo test target flags...]
# e.g. tools/gpu/build.sh --lib --test abi_copies
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/tests
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(--tests --lib)
cargo test --release --manifest-path rust/Cargo.toml -p kmm "${targets[@]}" --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: msg = json.loads(line)
    except ValueError: continue
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe and msg["profile"]["test"]:
        name = msg["target"]["name"]
        name = "unit" if name == "kmm" else name
        shutil.copy(exe, os.path.join(".gpu/tests", name))
        print("built", name)
'
cargo build --release --manifest-path rust/Cargo.toml -p kmm-bench -p kmm
cp rust/target/release/kmm-bench .gpu/
cp rust/target/release/qmri .gpu/qmri-bench     # tools/gpu/run_qmri.sh runs it
cp rust/target/release/devices .gpu/devices-bench   # the multi-device benchmark
cp rust/target/release/replay .gpu/replay          # replays allocation traces (docs/observability.md)
cp rust/target/release/spill .gpu/spill-bench     # spill to host under a hard limit (bench/results/spill.md)
cp rust/target/release/libkmm.so .gpu/
strip --strip-debug .gpu/kmm-bench .gpu/qmri-bench .gpu/devices-bench .gpu/replay .gpu/spill-bench .gpu/libkmm.so .gpu/tests/*
# the commit these binaries come from, for the results page (the GPU machine has no git)
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- rust || commit="$commit with uncommitted changes to rust/"
echo "$commit" > .gpu/COMMIT
du -sh .gpu
