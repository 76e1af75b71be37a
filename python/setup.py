"""Builds libkmm with cargo and bundles it in the wheel as kmm/libkmm.so.

The Rust workspace is found at $KMM_RUST_DIR or ../rust (the repository layout). With
KMM_LIBRARY set to an existing libkmm.so, that file is bundled and cargo is not run.
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools
    from wheel.bdist_wheel import bdist_wheel

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


class PlatformWheel(bdist_wheel):
    """ctypes, no extension modules: any Python 3, but one platform (the bundled .so)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildPyWithLibkmm, "bdist_wheel": PlatformWheel})
