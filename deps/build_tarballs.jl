# BinaryBuilder recipe for Yggdrasil: builds libkmm (the cdylib of rust/kmm) and ships the header.
# Run: julia --project=<env with BinaryBuilder> deps/build_tarballs.jl --debug --verbose
# Each release pins the commit below; the resulting libkmm_jll tarballs' tree hashes and
# sha256 sums go into Artifacts.toml (see README.md, "Releasing libkmm").
using BinaryBuilder, Pkg

name = "libkmm"
version = v"0.1.0"

sources = [
    # REPLACE at release: the repository's URL and the commit of the release
    GitSource("https://github.com/REPLACE-ORG/Kmm.jl.git", "0000000000000000000000000000000000000000"),
]

script = raw"""
cd ${WORKSPACE}/srcdir/Kmm*/rust
cargo build --release -p kmm
if [[ "${target}" == *-mingw* ]]; then
    install -Dvm 755 "target/${rust_target}/release/kmm.${dlext}" "${libdir}/libkmm.${dlext}"
else
    install -Dvm 755 "target/${rust_target}/release/libkmm.${dlext}" "${libdir}/libkmm.${dlext}"
fi
install -Dvm 644 ../gen/kmm.h "${includedir}/kmm.h"
install_license ../LICENSE* || true
"""

# The platforms a Rust cdylib supports in BinaryBuilder: not 32-bit Windows (unwinding across
# the ABI), not riscv64 or FreeBSD on aarch64 (no Rust toolchain there), not musl (a cdylib
# needs a dynamic C runtime).
platforms = supported_platforms()
filter!(p -> !(Sys.iswindows(p) && arch(p) == "i686"), platforms)
filter!(p -> arch(p) != "riscv64", platforms)
filter!(p -> !(Sys.isfreebsd(p) && arch(p) == "aarch64"), platforms)
filter!(p -> libc(p) != "musl", platforms)

products = [
    LibraryProduct("libkmm", :libkmm),
    FileProduct("include/kmm.h", :kmm_h),
]

dependencies = Dependency[]

build_tarballs(ARGS, name, version, sources, script, platforms, products, dependencies;
               compilers = [:c, :rust], julia_compat = "1.6")
