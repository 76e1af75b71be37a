//! Building the CPU harnesses of the CUDA kernels (`*_harness.cpp` with `cuda_shim.h`): shared by
//! the test binaries qmri_kernels_on_cpu and mrstat_kernels_on_cpu.

use std::path::{Path, PathBuf};
use std::process::Command;

/// True when a C++ compiler (`c++`) runs; else says that the test is skipped.
pub fn have_cxx() -> bool {
    if Command::new("c++").arg("--version").output().is_err() {
        eprintln!("skipped: no C++ compiler");
        return false;
    }
    true
}

/// Compiles `tests/qmri_common/{source}` with the kernels of `src/qmri/{kernels}` and the given
/// `-D` defines into `dir`; None when `c++` does not run.
pub fn compile(source: &str, kernels: &str, defines: &[(&str, u32)], dir: &Path) -> Option<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tag: String = defines.iter().map(|(k, v)| format!("_{k}{v}")).collect();
    let exe = dir.join(format!("{source}{tag}"));
    let status = Command::new("c++")
        .args(["-O2", "-std=c++14", "-D_GNU_SOURCE", "-Wno-unused-result"])
        .args(defines.iter().map(|(k, v)| format!("-D{k}={v}")))
        .arg(format!("-DKERNELS_CU=\"{}\"", here.join("src/qmri").join(kernels).display()))
        .arg(format!("-I{}", here.join("tests/qmri_common").display()))
        .arg(here.join("tests/qmri_common").join(source))
        .arg("-o")
        .arg(&exe)
        .arg("-lpthread")
        .status()
        .ok()?;
    assert!(status.success(), "the kernel harness did not compile");
    Some(exe)
}
