#!/usr/bin/env bash
# Builds libkmm and the C ABI driver (rust/kmm/tests/c/abi_driver.c, -Wall -Wextra -Werror) and
# runs it under Valgrind memcheck. Fails on any memcheck error, any definite leak, or any check
# the program itself failed. Usage: tools/valgrind_c_abi.sh   (env CARGO_TARGET_DIR respected)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/rust/target}"
cargo build --release --manifest-path "$root/rust/Cargo.toml" -p kmm
out="$(mktemp -d)"
gcc -std=c11 -O1 -g -Wall -Wextra -Werror -I "$root/gen" "$root/rust/kmm/tests/c/abi_driver.c" \
    -L "$target/release" -lkmm -Wl,-rpath,"$target/release" -lpthread -o "$out/abi_driver"
"$out/abi_driver"   # plain run first: its own checks
valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --track-origins=yes --fair-sched=yes "$out/abi_driver"
echo "valgrind_c_abi: clean"
