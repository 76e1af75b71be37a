"""Builds libkmm with cargo and bundles it in the wheel as kmm/libkmm.so, and compiles
kmm/_plugin_calls.c and kmm/_cupy_calls.c (the Numba and CuPy allocators' per-allocation calls;
CPython's stable ABI, 3.10 on).

The Rust workspace is found at $KMM_RUST_DIR or ../rust (the repository layout). With
KMM_LIBRARY set to an existing libkmm.so, that file is bundled and cargo is not run. Without
Python's headers the extension is skipped (kmm then makes those calls through ctypes) and the
wheel is tagged py3-none; with it, cp310-abi3.
"""

import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # neither: only in-place builds (build_ext --inplace) work
        bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))


def build_libkmm():
    prebuilt = os.environ.get("KMM_LIBRARY")
    if prebuilt and os.path.exists(prebuilt):
        return prebuilt
    rust = os.environ.get("KMM_RUST_DIR") or os.path.join(HERE, "..", "rust")
    manifest = os.path.join(rust, "Cargo.toml")
    if not os.path.exists(manifest):
        raise RuntimeError("kmm: cannot find the Rust sources (%s); set KMM_RUST_DIR or KMM_LIBRARY" % manifest)
    subprocess.check_call(["cargo", "build", "--release", "--manifest-path", manifest, "-p", "kmm"])
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(rust, "target")
    return os.path.join(target, "release", "libkmm.so")


class BuildPyWithLibkmm(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "kmm", "libkmm.so")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(build_libkmm(), dest)
        if shutil.which("strip") and not os.environ.get("KMM_KEEP_DEBUG"):
            subprocess.call(["strip", "--strip-debug", dest])  # the release profile keeps debuginfo


PLUGIN_CALLS = Extension(
    "kmm._plugin_calls",
    ["kmm/_plugin_calls.c", "kmm/_cupy_calls.c"],
    depends=["kmm/_plugin_calls.h"],
    py_limited_api=True,  # the source defines Py_LIMITED_API
    optional=True,
)

commands = {"build_py": BuildPyWithLibkmm}
if bdist_wheel is not None:

    class PlatformWheel(bdist_wheel):
        """One platform (the bundled .so); any CPython 3.10+ when the extension (stable ABI) was
        built, any Python 3 when it was not."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            build_ext = self.get_finalized_command("build_ext")
            built = any(os.path.exists(build_ext.get_ext_fullpath(e.name)) for e in build_ext.extensions)
            return ("cp310", "abi3", plat) if built else ("py3", "none", plat)

    commands["bdist_wheel"] = PlatformWheel

setup(ext_modules=[PLUGIN_CALLS], cmdclass=commands)
