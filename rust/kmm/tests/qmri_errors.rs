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

/// An output sharing memory with another argument: the simulation wrote atom 0's signal over
/// atom 1's parameters before simulating atom 1, and returned `KMM_OK`.
#[test]
fn outputs_that_share_memory_with_an_argument_are_refused() {
    let m = Mgr::new();
    let spec = FispSpec::constant(2, 0.3);
    let atoms = [atom(1.0, 0.1, 1.0, 0.0), atom(0.5, 0.05, 1.0, 0.0)];
    let p = upload(&m, &atoms);
    let shared = "an output may not overlap another argument";
    expect_err(kmm_qmri_simulate_fisp(m.0, &spec.raw(), p, 0, 2, p, 0), KMM_ERROR_INVALID_ARGUMENT, &["out and params", shared]);
    expect_err(kmm_qmri_simulate_pssfp(m.0, &PssfpSpec::mrf(2, 2).raw(), p, 0, 2, p, 0), KMM_ERROR_INVALID_ARGUMENT, &["out and params", shared]);
    assert_eq!(download::<[f32; 4]>(&m, p, 2), atoms, "the refused calls left the parameters alone");
    // Disjoint ranges of one buffer are allowed: atoms 2 and 3 of a buffer whose first 32 bytes
    // take the two signals (2 TRs x 2 atoms x 8 bytes).
    let both = upload(&m, &[[0f32; 4], [0f32; 4], atoms[0], atoms[1]]);
    ok(kmm_qmri_simulate_fisp(m.0, &spec.raw(), both, 2, 2, both, 0));
    let want = fisp(&m, &spec, &atoms);
    assert_eq!(download::<Cf>(&m, both, 4), want);
    // Atoms 1 and 2 start at byte 16, inside the signals' 32 bytes.
    expect_err(kmm_qmri_simulate_fisp(m.0, &spec.raw(), both, 1, 2, both, 0), KMM_ERROR_INVALID_ARGUMENT, &["out and params", "both are buffer"]);

    // Matching: outputs against inputs and against each other.
    let (ntr, natoms, nvox) = (2u64, 2u64, 2u64);
    let dict = upload(&m, &want);
    let signals = upload(&m, &want);
    let (idx, score, pd) = (m.alloc(4 * nvox, DEVICE), m.alloc(4 * nvox, DEVICE), m.alloc(8 * nvox, DEVICE));
    let run = |outs: KmmMatchOutputs, d, s, params| kmm_qmri_match(m.0, d, ntr, natoms, 0, s, nvox, 0, params, &outs, 0);
    let o = KmmMatchOutputs { index: idx, score, pd, ..Default::default() };
    expect_err(run(KmmMatchOutputs { score: idx, ..o }, dict, signals, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->score and outputs->index"]);
    expect_err(run(KmmMatchOutputs { pd: signals, ..o }, dict, signals, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->pd and signals"]);
    expect_err(run(KmmMatchOutputs { index: dict, ..o }, dict, signals, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->index and dictionary"]);
    expect_err(run(KmmMatchOutputs { params: p, ..o }, dict, signals, p), KMM_ERROR_INVALID_ARGUMENT, &["outputs->params and params"]);
    // Inputs may share: the dictionary matched against itself.
    ok(run(o, dict, dict, 0));
    assert_eq!(download::<i32>(&m, idx, 2), [0, 1]);
    let basis = m.alloc(8 * ntr * 2, DEVICE);
    expect_err(kmm_qmri_compression_basis(m.0, dict, ntr, natoms, 2, dict), KMM_ERROR_INVALID_ARGUMENT, &["basis and dictionary"]);
    ok(kmm_qmri_compression_basis(m.0, dict, ntr, natoms, 2, basis));
    let outs = KmmMatchOutputs { index: idx, score: basis, ..Default::default() };
    expect_err(kmm_qmri_match_in_basis(m.0, dict, ntr, natoms, 0, signals, nvox, basis, 2, 0, &outs, 0), KMM_ERROR_INVALID_ARGUMENT, &["outputs->score and basis"]);

    // Wrapped memory inside another buffer: the handles differ, the memory is the same.
    let mut addr = 0u64;
    ok(kmm_buffer_map(m.0, p, &mut addr));
    let mut alias = 0;
    ok(kmm_buffer_wrap(m.0, addr as *mut std::ffi::c_void, 16, DEVICE, KmmOwnership::KMM_BORROW as u32, &mut alias));
    let two = FispSpec::constant(2, 0.3);
    expect_err(kmm_qmri_simulate_fisp(m.0, &two.raw(), p, 0, 1, alias, 0), KMM_ERROR_INVALID_ARGUMENT, &["out and params", "their memory overlaps"]);
    // Atom 1 lies after the wrapped range: its signal may go over atom 0's record.
    ok(kmm_qmri_simulate_fisp(m.0, &two.raw(), p, 1, 1, alias, 0));
    assert_eq!(download::<Cf>(&m, alias, 2), fisp(&m, &two, &atoms[1..]));
    m.free(alias);
    ok(kmm_buffer_unmap(m.0, p));
    assert_eq!(download::<[f32; 4]>(&m, p, 2)[1], atoms[1], "atom 1 was only read");
}
