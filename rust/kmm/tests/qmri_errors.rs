//! Bad input to the qMRI and module calls: the right status and a message naming the argument.

mod common;
mod qmri_common;
use common::*;
use qmri_common::*;
use std::ffi::CString;

fn sim(m: &Mgr, seq: &KmmFispSequence, params: KmmBuffer, natoms: u64, out: KmmBuffer) -> KmmStatus {
    kmm_qmri_simulate_fisp(m.0, seq, params, 0, natoms, out, 0)
}

#[test]
fn bad_fisp_sequences_are_invalid_arguments() {
    let m = Mgr::new();
    let spec = FispSpec::constant(10, 0.3);
    let p = upload(&m, &[atom(1.0, 0.1, 1.0, 0.0)]);
    let out = m.alloc(80, DEVICE);
    let mut s = spec.raw();
    s.ntr = 0;
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_INVALID_ARGUMENT, &["seq.ntr", "1..="]);
    for bad in [0, 513] {
        let mut s = spec.raw();
        s.max_state = bad;
        expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_INVALID_ARGUMENT, &["seq.max_state", "1..=512"]);
    }
    let mut s = spec.raw();
    s.te = 0.02;
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_INVALID_ARGUMENT, &["seq.te", "seq.tr"]);
    let mut s = spec.raw();
    s.tr = -1.0;
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_INVALID_ARGUMENT, &["seq.tr", ">= 0"]);
    let mut s = spec.raw();
    s.flip_angle = std::ptr::null();
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_NULL_POINTER, &["seq.flip_angle"]);
    let mut s = spec.raw();
    s.nprofile = 2; // profile pointer is NULL
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_NULL_POINTER, &["seq.profile"]);
    let nan = vec![f32::NAN; 10];
    let mut s = spec.raw();
    s.flip_angle = nan.as_ptr();
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_INVALID_ARGUMENT, &["seq.flip_angle[0]", "not finite"]);
    expect_err(kmm_qmri_simulate_fisp(m.0, std::ptr::null(), p, 0, 1, out, 0), KMM_ERROR_NULL_POINTER, &["seq"]);
    expect_err(sim(&m, &spec.raw(), p, 0, out), KMM_ERROR_INVALID_ARGUMENT, &["natoms = 0"]);
    expect_err(kmm_qmri_simulate_fisp(m.0, &spec.raw(), p, 0, 1, out, 4), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
}

#[test]
fn a_profile_of_2_pow_32_values_is_not_taken_for_none() {
    // ntr * nprofile was multiplied in 32 bits: 2^20 TRs x 4096 positions wrapped to 0 values,
    // and the profile (here NULL) was silently ignored.
    let m = Mgr::new();
    let ntr = 1u32 << 20;
    let spec = FispSpec::constant(ntr as usize, 0.3);
    let p = upload(&m, &[atom(1.0, 0.1, 1.0, 0.0)]);
    let out = m.alloc(8 * ntr as u64, DEVICE);
    let mut s = spec.raw();
    s.nprofile = 4096;
    expect_err(sim(&m, &s, p, 1, out), KMM_ERROR_NULL_POINTER, &["seq.profile", "4294967296"]);
}

#[test]
fn bad_atoms_and_short_buffers_are_rejected() {
    let m = Mgr::new();
    let spec = FispSpec::constant(10, 0.3);
    let out = m.alloc(160, DEVICE);
    for (a, word) in [(atom(0.0, 0.1, 1.0, 0.0), "T1"), (atom(-1.0, 0.1, 1.0, 0.0), "T1"), (atom(1.0, 0.0, 1.0, 0.0), "T2"), (atom(1.0, f32::NAN, 1.0, 0.0), "T2"), (atom(1.0, 0.1, f32::INFINITY, 0.0), "B1")] {
        let p = upload(&m, &[atom(1.0, 0.1, 1.0, 0.0), a]);
        expect_err(sim(&m, &spec.raw(), p, 2, out), KMM_ERROR_INVALID_ARGUMENT, &["atom 1", word]);
        m.free(p);
    }
    let p = upload(&m, &[atom(1.0, 0.1, 1.0, 0.0); 3]);
    expect_err(sim(&m, &spec.raw(), p, 3, out), KMM_ERROR_OUT_OF_RANGE, &["out", "240"]);
    expect_err(sim(&m, &spec.raw(), p, 4, out), KMM_ERROR_OUT_OF_RANGE, &["params", "64"]);
    expect_err(sim(&m, &spec.raw(), 0xB000_0000_0000_0001, 1, out), KMM_ERROR_INVALID_HANDLE, &[]);
    // Skipping the checks lets a bad atom through (NaN out) but still checks sizes.
    let bad = upload(&m, &[atom(-1.0, 0.1, 1.0, 0.0)]);
    ok(kmm_qmri_simulate_fisp(m.0, &spec.raw(), bad, 0, 1, out, KMM_QMRI_SKIP_CHECKS));
    // first_atom past the end of params.
    expect_err(kmm_qmri_simulate_fisp(m.0, &spec.raw(), p, 2, 2, out, 0), KMM_ERROR_OUT_OF_RANGE, &["params", "64"]);
    m.sync();
}

#[test]
fn bad_pssfp_sequences_are_invalid_arguments() {
    let m = Mgr::new();
    let spec = PssfpSpec::mrf(10, 2);
    let p = upload(&m, &[atom(1.0, 0.1, 1.0, 0.0)]);
    let out = m.alloc(80, DEVICE);
    let run = |s: &KmmPssfpSequence| kmm_qmri_simulate_pssfp(m.0, s, p, 0, 1, out, 0);
    let mut s = spec.raw();
    s.nrf = 0;
    expect_err(run(&s), KMM_ERROR_INVALID_ARGUMENT, &["seq.nrf", "1..=4096"]);
    let mut s = spec.raw();
    s.nz = 0;
    expect_err(run(&s), KMM_ERROR_INVALID_ARGUMENT, &["seq.nz"]);
    let mut s = spec.raw();
    s.dt_pr = f32::NAN;
    expect_err(run(&s), KMM_ERROR_INVALID_ARGUMENT, &["seq.dt_pr"]);
    let mut s = spec.raw();
    s.ntr = 0;
    expect_err(run(&s), KMM_ERROR_INVALID_ARGUMENT, &["seq.ntr"]);
}

#[test]
fn bad_match_arguments_are_rejected() {
    let m = Mgr::new();
    let d = m.alloc(8 * 10 * 3, DEVICE);
    let x = m.alloc(8 * 10 * 2, DEVICE);
    let idx = m.alloc(4 * 2, DEVICE);
    let call = |ntr, natoms, nvox, rank, idx| {
        let outs = KmmMatchOutputs { index: idx, ..Default::default() };
        kmm_qmri_match(m.0, d, ntr, natoms, 0, x, nvox, rank, 0, &outs, 0)
    };
    expect_err(call(10, 0, 2, 0, idx), KMM_ERROR_INVALID_ARGUMENT, &["natoms = 0", "empty"]);
    expect_err(call(0, 3, 2, 0, idx), KMM_ERROR_INVALID_ARGUMENT, &["ntr = 0"]);
    expect_err(call(10, 3, 0, 0, idx), KMM_ERROR_INVALID_ARGUMENT, &["nvoxels = 0"]);
    expect_err(call(10, 3, 2, 11, idx), KMM_ERROR_INVALID_ARGUMENT, &["rank = 11", "ntr (10)"]);
    expect_err(call(10, 3, 2, 0, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->index"]);
    expect_err(call(10, 4, 2, 0, idx), KMM_ERROR_OUT_OF_RANGE, &["dictionary", "320"]);
    expect_err(call(10, 3, 3, 0, idx), KMM_ERROR_OUT_OF_RANGE, &["signals"]);
    let op = m.alloc(32, DEVICE);
    let outs = KmmMatchOutputs { index: idx, params: op, ..Default::default() };
    expect_err(kmm_qmri_match(m.0, d, 10, 3, 0, x, 2, 0, 0, &outs, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->params", "params = 0"]);
    let outs = KmmMatchOutputs { index: idx, ..Default::default() };
    expect_err(
        kmm_qmri_match(m.0, d, 10, 3, 0, x, 2, 0, 0, &outs, KMM_MATCH_ACCUMULATE),
        KMM_ERROR_INVALID_ARGUMENT,
        &["KMM_MATCH_ACCUMULATE", "outputs->score"],
    );
    expect_err(kmm_qmri_match(m.0, d, 10, 3, 0, x, 2, 0, 0, std::ptr::null(), 0), KMM_ERROR_NULL_POINTER, &["outputs"]);
    expect_err(kmm_qmri_match(m.0, d, 10, 3, i32::MAX as u64, x, 2, 0, 0, &outs, 0), KMM_ERROR_INVALID_ARGUMENT, &["atom_offset"]);
    expect_err(kmm_qmri_match(m.0, d, 10, 3, 0, x, 2, 0, 0, &outs, 8), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
    // Buffers stay unpinned after failures.
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, d, &mut info));
    assert_eq!(info.pins, 0);
}

#[test]
fn modules_need_the_cuda_backend() {
    if gpu() {
        return;
    }
    let m = Mgr::new();
    let src = CString::new("extern \"C\" __global__ void k() {}").unwrap();
    let mut module = 0;
    expect_err(
        kmm_module_compile(m.0, src.as_ptr(), std::ptr::null(), 0, &mut module),
        KMM_ERROR_NOT_SUPPORTED,
        &["kmm_module_compile", "needs the CUDA backend"],
    );
    let name = CString::new("k").unwrap();
    let (grid, block) = ([1u32; 3], [1u32; 3]);
    expect_err(
        kmm_module_launch(m.0, 0xC000_0000_0000_0001, name.as_ptr(), grid.as_ptr(), block.as_ptr(), 0, std::ptr::null(), 0),
        KMM_ERROR_NOT_SUPPORTED,
        &["needs the CUDA backend"],
    );
    expect_err(kmm_module_destroy(0xC000_0000_0000_0001), KMM_ERROR_INVALID_HANDLE, &[]);
    let bad = [KmmKernelArg { kind: 9, reserved: 0, value: 0, offset: 0 }];
    expect_err(
        kmm_module_launch(m.0, 1, name.as_ptr(), grid.as_ptr(), block.as_ptr(), 0, bad.as_ptr(), 1),
        KMM_ERROR_INVALID_ARGUMENT,
        &["args[0].kind = 9"],
    );
    expect_err(
        kmm_module_launch(m.0, 1, name.as_ptr(), grid.as_ptr(), [2048u32, 1, 1].as_ptr(), 0, std::ptr::null(), 0),
        KMM_ERROR_INVALID_ARGUMENT,
        &["2048 threads"],
    );
}
