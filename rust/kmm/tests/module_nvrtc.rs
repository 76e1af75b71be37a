//! The qMRI kernels and a broken source through NVRTC alone (no GPU or driver needed): runs
//! where libnvrtc is on the library path (e.g. `pip install nvidia-cuda-nvrtc` and
//! LD_LIBRARY_PATH to its lib folder with a libnvrtc.so link), and is skipped elsewhere.

use kmm::backend::cuda::module::compile_image;
use kmm::qmri::gpu::{fisp_defines, fisp_layouts, options, KERNELS};
use kmm::KmmStatus;

fn nvrtc() -> bool {
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !present {
        eprintln!("skipped: libnvrtc not found on the library path");
    }
    present
}

/// The ptxas lines of the log that name `kernel`.
fn usage(log: &str, kernel: &str) -> String {
    let mut lines = log.lines();
    let mut out = String::new();
    while let Some(l) = lines.next() {
        if l.contains("Compiling entry function") && l.contains(kernel) {
            for l in lines.by_ref().take(3) {
                if l.contains("registers") || l.contains("spill") {
                    out += l.trim_start_matches("ptxas info    : ").trim();
                    out += "; ";
                }
            }
        }
    }
    out
}

#[test]
fn qmri_kernels_compile_for_every_state_count_and_arch() {
    if !nvrtc() {
        return;
    }
    for arch in ["sm_80", "sm_90"] {
        // Each state count in the layouts `fisp_lanes` chooses between (for few and for many
        // atoms), each layout once: CUDA 13's NVRTC gives an empty log for a program it compiled
        // before in the process.
        let mut layouts: Vec<(u32, u32)> =
            [1u32, 5, 8, 17, 32, 64, 100, 512].into_iter().flat_map(|ns| fisp_layouts(ns).map(|lanes| (ns, lanes))).collect();
        layouts.dedup();
        for (ns, lanes) in layouts {
            let mut opts = options(&fisp_defines(ns, lanes));
            opts.push(format!("--gpu-architecture={arch}"));
            opts.push("--ptxas-options=-v".into());
            let (image, log) = compile_image(KERNELS, &opts).unwrap_or_else(|e| panic!("{arch} Ns {ns}: {e:?}"));
            assert!(!image.is_empty());
            let fisp = usage(&log, "kmm_fisp");
            println!("{arch} Ns {ns:>3}, {lanes} lanes: kmm_fisp {fisp}");
            if ns == 32 && lanes == 4 {
                println!("{arch}: kmm_pssfp {}", usage(&log, "kmm_pssfp"));
                println!("{arch}: kmm_argmax {}", usage(&log, "kmm_argmax"));
            }
            assert!(fisp.contains("0 bytes spill stores"), "Ns {ns} on {lanes} lanes spills on {arch}: {fisp}");
        }
    }
}

#[test]
fn compile_errors_carry_the_log() {
    if !nvrtc() {
        return;
    }
    let err = compile_image("extern \"C\" __global__ void k(float* y) { y[0] = nope; }", &["--gpu-architecture=sm_80".into()]).unwrap_err();
    assert_eq!(err.status, KmmStatus::KMM_ERROR_COMPILE);
    assert!(err.message.contains("nope"), "{}", err.message);
}

/// The MR-STAT modules as `gpu_mrstat` compiles them (the column path with the Cartesian
/// helpers, for 1 to 12 terms and 1 to 8 pieces); the column kernels keep their series' terms in registers,
/// without spills.
#[test]
fn mrstat_kernels_compile_without_spills() {
    if !nvrtc() {
        return;
    }
    let cartesian = include_str!("../src/qmri/mrstat_cartesian.cu");
    let columns = format!("{cartesian}{}", include_str!("../src/qmri/mrstat_columns.cu"));
    let mut sources = vec![("cartesian".to_string(), cartesian.to_string(), vec![]), ("model".into(), include_str!("../src/qmri/mrstat_model.cu").into(), vec![])];
    for (terms, pieces) in [(1, 1), (4, 1), (12, 1), (10, 2), (12, 8)] {
        let defines = vec![format!("-DCOL_TERMS={terms}"), format!("-DCOL_PIECES={pieces}"), "-DMAX_SEGMENT=256".into()];
        sources.push((format!("columns, {terms} terms, {pieces} pieces"), columns.clone(), defines));
    }
    for arch in ["sm_80", "sm_90"] {
        for (name, src, defines) in &sources {
            let mut opts = options(defines);
            opts.push(format!("--gpu-architecture={arch}"));
            opts.push("--ptxas-options=-v".into());
            let (image, log) = compile_image(src, &opts).unwrap_or_else(|e| panic!("{arch} {name}: {e:?}"));
            assert!(!image.is_empty());
            for kernel in ["kmm_col_b_signal", "kmm_col_b_jv", "kmm_col_adjoint", "kmm_cart_adjoint"].iter().filter(|k| log.contains(*k)) {
                let use_ = usage(&log, kernel);
                println!("{arch} {name}: {kernel} {use_}");
                assert!(use_.contains("0 bytes spill stores"), "{kernel} spills on {arch}: {use_}");
            }
        }
    }
}
