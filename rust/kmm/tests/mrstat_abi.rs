//! MR-STAT through the C ABI: the magnetization and its derivatives, the signal, the Jacobian
//! and its adjoint against the f64 reference, the adjoint identity on f32 buffers, and bad
//! input. Host backend in CI; the CUDA kernels with KMM_TEST_GPU=1 (relative errors to 1e-4).

mod common;
mod qmri_common;
use common::*;
use kmm::ffi::mrstat::*;
use kmm::qmri::mrstat::{self, AtomF64, Cartesian, Model, Param, Trajectory, VoxelParam, Voxels};
use qmri_common::*;

struct Problem {
    nvox: usize,
    nr: usize,
    ns: usize,
    nc: usize,
    records: Vec<[f32; 6]>,
    coils: Vec<Cf>,
    kspace: Vec<Cf>,
    dt: f32,
}

/// The problem of the reference tests: an n x n grid, `nr` readouts of `ns` samples, three
/// coils (with KMM_MRSTAT_COILS_PER_PRODUCT=2 the CUDA products take a group of two and a
/// short one); B0 runs over -b0_hz, 0, b0_hz; every seventh voxel has T2 = +Inf in the model.
fn problem_sized(n: usize, nr: usize, ns: usize, b0_hz: f32) -> Problem {
    let nc = 3usize;
    let nvox = n * n;
    let fov = 0.2f32;
    let mut records = Vec::new();
    for i in 0..nvox {
        let (ix, iy) = ((i % n) as f32, (i / n) as f32);
        let t2 = if i % 7 == 3 { f32::INFINITY } else { 0.05 + 0.01 * (i % 5) as f32 };
        records.push([(ix - n as f32 / 2.0) * fov / n as f32, (iy - n as f32 / 2.0) * fov / n as f32, t2, ((i % 3) as f32 - 1.0) * b0_hz, 0.5 + 0.05 * (i % 4) as f32, 0.1 * ((i % 2) as f32 - 0.5)]);
    }
    let coils: Vec<Cf> = (0..nvox * nc).map(|i| [1.0 + 0.3 * ((i * 7 % 11) as f32 / 11.0), 0.2 * ((i * 3 % 5) as f32 / 5.0 - 0.5)]).collect();
    let dk = 2.0 * std::f32::consts::PI / fov;
    let mut kspace = Vec::new();
    for r in 0..nr {
        let ky = ((r % n) as f32 - n as f32 / 2.0) * dk;
        kspace.push([-(ns as f32) / 2.0 * dk, ky]);
        kspace.push([dk, 0.0]);
    }
    Problem { nvox, nr, ns, nc, records, coils, kspace, dt: 4e-6 }
}

fn problem_with(b0_hz: f32) -> Problem {
    problem_sized(6, 24, 6, b0_hz)
}

fn problem() -> Problem {
    problem_with(1.0)
}

/// The problem's model (Cartesian) on `m`'s buffers.
fn upload_model(m: &Mgr, p: &Problem) -> KmmMrstatModel {
    KmmMrstatModel {
        nvoxels: p.nvox as u64,
        nreadouts: p.nr as u64,
        nsamples: p.ns as u64,
        ncoils: p.nc as u64,
        voxels: upload(m, &p.records),
        coils: upload(m, &p.coils),
        trajectory: KMM_TRAJECTORY_CARTESIAN,
        dt: p.dt,
        kspace: upload(m, &p.kspace),
    }
}

/// The voxels' atoms (a T2 of +Inf in the model is 0.08 s in the magnetization's atom).
fn atoms(p: &Problem) -> Vec<[f32; 4]> {
    (0..p.nvox).map(|i| [0.4 + 0.1 * (i % 7) as f32, p.records[i][2].min(0.08), 1.0, p.records[i][3]]).collect()
}

fn reference_model(p: &Problem) -> (Voxels, Vec<[f64; 2]>, Trajectory) {
    let f = |j: usize| p.records.iter().map(|r| r[j] as f64).collect::<Vec<_>>();
    let voxels = Voxels { x: f(0), y: f(1), t2: f(2), b0: f(3), rho: p.records.iter().map(|r| [r[4] as f64, r[5] as f64]).collect() };
    let coils = p.coils.iter().map(|c| [c[0] as f64, c[1] as f64]).collect();
    let k: Vec<[f64; 2]> = p.kspace.iter().map(|c| [c[0] as f64, c[1] as f64]).collect();
    let traj = Trajectory::Cartesian(Cartesian { nsamples: p.ns, dt: p.dt as f64, k0: k.iter().step_by(2).copied().collect(), dk: k.iter().skip(1).step_by(2).copied().collect() });
    (voxels, coils, traj)
}

fn rel(a: &[Cf], b: &[[f64; 2]]) -> f64 {
    let (mut n, mut d) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        n += (x[0] as f64 - y[0]).powi(2) + (x[1] as f64 - y[1]).powi(2);
        d += y[0] * y[0] + y[1] * y[1];
    }
    (n / d).sqrt()
}

#[test]
fn mrstat_operations_through_the_abi_equal_the_reference() {
    operations_equal_the_reference(&problem());
}

/// Off-resonance of 8 kHz: the column path's series takes 10 terms over the readout.
#[test]
fn strong_off_resonance_equal_the_reference() {
    operations_equal_the_reference(&problem_with(8000.0));
}

/// A larger grid: columns of 12 voxels (two blocks of the column adjoint's warps), 300
/// readouts (two blocks of the column kernels' threads), an odd number of samples.
#[test]
fn larger_problem_equal_the_reference() {
    operations_equal_the_reference(&problem_sized(12, 300, 9, 200.0));
}

/// Decay during the readout that the series must follow: T2 of 2 to 6 ms over a readout of
/// 0.35 ms (7 samples, so the column path's pieces differ in length).
#[test]
fn fast_decay_equal_the_reference() {
    let mut p = problem_sized(6, 24, 7, 1.0);
    p.dt = 5e-5;
    for r in p.records.iter_mut().filter(|r| r[2].is_finite()) {
        r[2] = 0.002 + 0.1 * (r[2] - 0.05);
    }
    operations_equal_the_reference(&p);
}

/// The voxels in reverse order: the same positions in other records, so a column path that kept
/// the grouping of the problem before (the tests run in one process in the child runs) would
/// sum the wrong voxels.
#[test]
fn reordered_voxels_equal_the_reference() {
    let mut p = problem();
    p.records.reverse();
    let nv = p.nvox;
    p.coils = (0..p.nc).flat_map(|c| (0..nv).rev().map(move |v| (c, v))).map(|(c, v)| p.coils[c * nv + v]).collect();
    operations_equal_the_reference(&p);
}

fn operations_equal_the_reference(p: &Problem) {
    let m = Mgr::new();
    let seq = FispSpec::mrf(p.nr, 8);
    let raw = seq.raw();
    let at = atoms(p);
    let params = upload(&m, &at);
    let n = p.nr * p.nvox;
    let (mb, d1, d2) = (m.alloc(n as u64 * 8, DEVICE), m.alloc(n as u64 * 8, DEVICE), m.alloc(n as u64 * 8, DEVICE));
    ok(kmm_qmri_fisp_derivatives(m.0, &raw, params, 0, p.nvox as u64, mb, d1, d2, 0));
    // The host backend computes in f64 and rounds once; the CUDA kernels work in f32.
    let tol = if gpu() { 1e-4 } else { 1e-6 };
    // Derivatives against the f64 reference.
    let fisp = seq.rust();
    let a64: Vec<AtomF64> = at.iter().map(|a| AtomF64 { t1: a[0] as f64, t2: a[1] as f64, b1: a[2] as f64, b0: a[3] as f64 }).collect();
    let (mut rm, mut r1, mut r2) = (vec![[0f64; 2]; n], vec![[0f64; 2]; n], vec![[0f64; 2]; n]);
    mrstat::fisp_derivatives_batch(&fisp, &a64, Param::T1, &mut rm, &mut r1).unwrap();
    mrstat::fisp_derivatives_batch(&fisp, &a64, Param::T2, &mut rm, &mut r2).unwrap();
    let (gm, g1, g2): (Vec<Cf>, Vec<Cf>, Vec<Cf>) = (download(&m, mb, n), download(&m, d1, n), download(&m, d2, n));
    let errs = [rel(&gm, &rm), rel(&g1, &r1), rel(&g2, &r2)];
    println!("magnetization, dm/dT1, dm/dT2 through the ABI vs f64: {:.2e} {:.2e} {:.2e}", errs[0], errs[1], errs[2]);
    assert!(errs.iter().all(|&e| e < tol), "{errs:?}");

    // The model.
    let kmodel = upload_model(&m, p);
    let (voxels, coils, traj) = reference_model(p);
    let model = Model { voxels: &voxels, coils: &coils, traj: &traj };
    let ns = p.nc * p.nr * p.ns;
    let gm64: Vec<[f64; 2]> = gm.iter().map(|c| [c[0] as f64, c[1] as f64]).collect();
    let (g164, g264): (Vec<[f64; 2]>, Vec<[f64; 2]>) = (g1.iter().map(|c| [c[0] as f64, c[1] as f64]).collect(), g2.iter().map(|c| [c[0] as f64, c[1] as f64]).collect());
    let out = m.alloc(ns as u64 * 8, DEVICE);
    ok(kmm_qmri_mrstat_signal(m.0, &kmodel, mb, out));
    let mut want = vec![[0f64; 2]; ns];
    mrstat::signal(&model, &gm64, &mut want).unwrap();
    let e = rel(&download(&m, out, ns), &want);
    println!("signal through the ABI vs f64: {e:.2e}");
    assert!(e < tol);

    // The same k positions given sample by sample (a spiral trajectory, the direct kernels on
    // CUDA): the same signal, J v and J^H w.
    let spiral_k: Vec<Cf> = (0..p.nr)
        .flat_map(|r| {
            let (k0, dk) = (p.kspace[2 * r], p.kspace[2 * r + 1]);
            (0..p.ns).map(move |s| [k0[0] + s as f32 * dk[0], k0[1] + s as f32 * dk[1]])
        })
        .collect();
    let spiral = KmmMrstatModel { trajectory: KMM_TRAJECTORY_SPIRAL, kspace: upload(&m, &spiral_k), ..kmodel };
    let out2 = m.alloc(ns as u64 * 8, DEVICE);
    ok(kmm_qmri_mrstat_signal(m.0, &spiral, mb, out2));
    let e = rel(&download(&m, out2, ns), &want);
    println!("signal of the spiral form vs f64: {e:.2e}");
    assert!(e < tol);

    // J v and the adjoint, and the adjoint identity <J v, w> = <v, J^H w> on the f32 buffers.
    let v: Vec<f32> = (0..4 * p.nvox).map(|i| ((i * 37 % 17) as f32 / 17.0 - 0.5) * if i % 4 < 2 { 0.01 } else { 1.0 }).collect();
    let w: Vec<Cf> = (0..ns).map(|i| [((i * 13 % 7) as f32 / 7.0 - 0.5), ((i * 5 % 11) as f32 / 11.0 - 0.5)]).collect();
    let (vb, wb, jv, jw) = (upload(&m, &v), upload(&m, &w), m.alloc(ns as u64 * 8, DEVICE), m.alloc(4 * p.nvox as u64 * 4, DEVICE));
    ok(kmm_qmri_jacobian_mul(m.0, &kmodel, mb, d1, d2, vb, jv));
    ok(kmm_qmri_jacobian_adjoint_mul(m.0, &kmodel, mb, d1, d2, wb, jw));
    let params = [VoxelParam::T1, VoxelParam::T2, VoxelParam::RhoRe, VoxelParam::RhoIm];
    let v64: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    let mut jv_want = vec![[0f64; 2]; ns];
    mrstat::jacobian_mul(&model, &gm64, &params, &[&g164, &g264, &[], &[]], &v64, &mut jv_want).unwrap();
    let jv_got: Vec<Cf> = download(&m, jv, ns);
    let e = rel(&jv_got, &jv_want);
    println!("J v through the ABI vs f64: {e:.2e}");
    assert!(e < tol);
    let jw_got: Vec<f32> = download(&m, jw, 4 * p.nvox);
    let lhs: f64 = jv_got.iter().zip(&w).map(|(a, b)| a[0] as f64 * b[0] as f64 + a[1] as f64 * b[1] as f64).sum();
    let rhs: f64 = v.iter().zip(&jw_got).map(|(a, b)| *a as f64 * *b as f64).sum();
    let e = (lhs - rhs).abs() / lhs.abs().max(rhs.abs());
    println!("adjoint identity on f32 buffers: <Jv, w> = {lhs:.6e}, <v, J^H w> = {rhs:.6e}, relative difference {e:.2e}");
    assert!(e < 1e-5);
    // The adjoint against the f64 reference.
    let w64: Vec<[f64; 2]> = w.iter().map(|c| [c[0] as f64, c[1] as f64]).collect();
    let mut jw_want = vec![0f64; 4 * p.nvox];
    mrstat::jacobian_adjoint_mul(&model, &gm64, &params, &[&g164, &g264, &[], &[]], &w64, &mut jw_want).unwrap();
    let num: f64 = jw_got.iter().zip(&jw_want).map(|(a, b)| (*a as f64 - b).powi(2)).sum();
    let den: f64 = jw_want.iter().map(|b| b * b).sum();
    let e = (num / den).sqrt();
    println!("J^H w through the ABI vs f64: {e:.2e}");
    assert!(e < tol);
    // The spiral form's J v and J^H w agree with the Cartesian form's.
    let (jv2, jw2) = (m.alloc(ns as u64 * 8, DEVICE), m.alloc(4 * p.nvox as u64 * 4, DEVICE));
    ok(kmm_qmri_jacobian_mul(m.0, &spiral, mb, d1, d2, vb, jv2));
    ok(kmm_qmri_jacobian_adjoint_mul(m.0, &spiral, mb, d1, d2, wb, jw2));
    let e1 = rel(&download(&m, jv2, ns), &jv_want);
    let jw2: Vec<f32> = download(&m, jw2, 4 * p.nvox);
    let num: f64 = jw2.iter().zip(&jw_want).map(|(a, b)| (*a as f64 - b).powi(2)).sum();
    let e2 = (num / den).sqrt();
    println!("spiral form: J v {e1:.2e}, J^H w {e2:.2e} vs f64");
    assert!(e1 < tol && e2 < tol);
}

/// Runs the reference tests again in a child process with `env` set (the variables are read
/// per call; setting them here would race the other tests' threads).
fn rerun_reference_tests(env: &[(&str, &str)]) {
    rerun("equal_the_reference", 5, env);
}

/// Runs the tests whose names hold `filter` (`count` of them) in a child process with `env`.
fn rerun(filter: &str, count: usize, env: &[(&str, &str)]) {
    if std::env::var_os("KMM_MRSTAT_CHILD").is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([filter, "--nocapture", "--test-threads=1"])
        .env("KMM_MRSTAT_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success() && text.contains(&format!("{count} passed")), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// The CUDA products in several groups of coils, the last one short (two, then one), each
/// group's adjoint adding to the earlier ones'.
#[test]
fn products_in_coil_groups_match_the_reference() {
    rerun_reference_tests(&[("KMM_MRSTAT_COILS_PER_PRODUCT", "2"), ("KMM_MRSTAT_PATH", "products")]);
}

/// The column path on CUDA (the problems are too small for it to pay, so it is forced): whole
/// columns; columns cut into segments of at most four voxels with coils in groups of two;
/// readouts cut into three pieces, and into four (of unequal lengths) with coils in groups of
/// two. The direct sums on a Cartesian trajectory too.
#[test]
fn column_path_equals_the_reference() {
    rerun_reference_tests(&[("KMM_MRSTAT_PATH", "columns")]);
    rerun_reference_tests(&[("KMM_MRSTAT_PATH", "columns"), ("KMM_MRSTAT_SEGMENT_VOXELS", "4"), ("KMM_MRSTAT_COILS_PER_PRODUCT", "2")]);
    rerun_reference_tests(&[("KMM_MRSTAT_PATH", "columns"), ("KMM_MRSTAT_PIECES", "3")]);
    rerun_reference_tests(&[("KMM_MRSTAT_PATH", "columns"), ("KMM_MRSTAT_PIECES", "4"), ("KMM_MRSTAT_COILS_PER_PRODUCT", "2")]);
    rerun_reference_tests(&[("KMM_MRSTAT_PATH", "direct")]);
    rerun("path_that_cannot_run", 1, &[("KMM_MRSTAT_PATH", "columns")]);
    rerun("path_that_cannot_run", 1, &[("KMM_MRSTAT_PATH", "sideways")]);
    rerun("path_that_cannot_run", 1, &[("KMM_MRSTAT_PATH", "columns"), ("KMM_MRSTAT_PIECES", "9")]);
}

/// On CUDA, in the child processes of `column_path_equals_the_reference`: a path asked for that
/// cannot run is an error that names it (columns: off-resonance of 1 MHz, past what the pieces
/// of the series hold; an unknown path; a test setting out of its range), and the output is
/// left as it was.
#[test]
fn path_that_cannot_run_is_an_error() {
    let Ok(path) = std::env::var("KMM_MRSTAT_PATH") else { return };
    if !gpu() {
        return;
    }
    let m = Mgr::new();
    let p = problem_with(1e6);
    let kmodel = upload_model(&m, &p);
    let n = p.nr * p.nvox;
    let mag = upload(&m, &vec![[0.5f32, 0.0]; n]);
    let ns = p.nc * p.nr * p.ns;
    let out = upload(&m, &vec![[7f32, 7.0]; ns]);
    let st = kmm_qmri_mrstat_signal(m.0, &kmodel, mag, out);
    assert_eq!(st, KmmStatus::KMM_ERROR_INVALID_ARGUMENT);
    let msg = last_error();
    match std::env::var("KMM_MRSTAT_PIECES") {
        Ok(_) => assert!(msg.contains("KMM_MRSTAT_PIECES = \"9\" must be a whole number in 1..=8"), "{msg}"),
        Err(_) if path == "columns" => assert!(msg.contains("KMM_MRSTAT_PATH = \"columns\" cannot run") && msg.contains("more than 6 pieces of 12 terms"), "{msg}"),
        Err(_) => assert!(msg.contains("KMM_MRSTAT_PATH = \"sideways\" must be"), "{msg}"),
    }
    assert!(download::<Cf>(&m, out, ns).iter().all(|c| *c == [7.0, 7.0]));
}

#[test]
fn bad_mrstat_arguments_are_rejected() {
    let m = Mgr::new();
    let p = problem();
    let n = (p.nr * p.nvox) as u64;
    let mb = m.alloc(n * 8, DEVICE);
    let good = upload_model(&m, &p);
    let out = m.alloc((p.nc * p.nr * p.ns) as u64 * 8, DEVICE);
    let before: Vec<u8> = m.download(out, 0, 64);
    expect_err(kmm_qmri_mrstat_signal(m.0, std::ptr::null(), mb, out), KMM_ERROR_NULL_POINTER, &["model"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { trajectory: 7, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["model->trajectory = 7"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { dt: 0.0, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["model->dt"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { nvoxels: 0, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["model->nvoxels = 0"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { nvoxels: p.nvox as u64 + 1, ..good }, mb, out), KMM_ERROR_OUT_OF_RANGE, &["model->voxels"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { ncoils: 4, ..good }, mb, out), KMM_ERROR_OUT_OF_RANGE, &["model->coils"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { trajectory: KMM_TRAJECTORY_SPIRAL, ..good }, mb, out), KMM_ERROR_OUT_OF_RANGE, &["model->kspace"]);
    let mut bad = p.records.clone();
    bad[3][2] = -0.1;
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { voxels: upload(&m, &bad), ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["model", "t2[3]"]);
    // Several bad values: the first in the host's order (voxels, trajectory, coils) is named,
    // on both backends.
    let mut bad = p.records.clone();
    bad[0][0] = f32::NAN;
    let mut badk = p.kspace.clone();
    badk[0][0] = f32::NAN;
    let mut badc = p.coils.clone();
    badc[0][0] = f32::NAN;
    let (vb, kb, cb) = (upload(&m, &bad), upload(&m, &badk), upload(&m, &badc));
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { voxels: vb, kspace: kb, coils: cb, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["voxels.x[0]"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { kspace: kb, coils: cb, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["trajectory.k0"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { coils: cb, ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["coils[0]"]);
    // On CUDA the records and coils are checked on the device: the last entries too, for every
    // operation, and +Inf is a valid T2.
    let mut bad = p.records.clone();
    bad[p.nvox - 1][0] = f32::INFINITY;
    let (v4, w) = (m.alloc(16 * p.nvox as u64, DEVICE), m.alloc((p.nc * p.nr * p.ns) as u64 * 8, DEVICE));
    let g = m.alloc(16 * p.nvox as u64, DEVICE);
    expect_err(kmm_qmri_jacobian_adjoint_mul(m.0, &KmmMrstatModel { voxels: upload(&m, &bad), ..good }, mb, mb, mb, w, g), KMM_ERROR_INVALID_ARGUMENT, &["voxels.x[35]", "not finite"]);
    let mut bad = p.records.clone();
    bad[p.nvox - 1][5] = f32::NAN;
    expect_err(kmm_qmri_jacobian_mul(m.0, &KmmMrstatModel { voxels: upload(&m, &bad), ..good }, mb, mb, mb, v4, out), KMM_ERROR_INVALID_ARGUMENT, &["voxels.rho[35]", "not finite"]);
    let mut badc = p.coils.clone();
    badc[p.coils.len() - 1][1] = f32::NAN;
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { coils: upload(&m, &badc), ..good }, mb, out), KMM_ERROR_INVALID_ARGUMENT, &["coils[107]", "not finite"]);
    let mut inf_t2 = p.records.clone();
    inf_t2[0][2] = f32::INFINITY;
    let scratch = m.alloc((p.nc * p.nr * p.ns) as u64 * 8, DEVICE);
    ok(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { voxels: upload(&m, &inf_t2), ..good }, mb, scratch));
    let small = m.alloc(8, DEVICE);
    expect_err(kmm_qmri_mrstat_signal(m.0, &good, mb, small), KMM_ERROR_OUT_OF_RANGE, &["out"]);
    expect_err(kmm_qmri_mrstat_signal(m.0, &good, small, out), KMM_ERROR_OUT_OF_RANGE, &["m holds"]);
    expect_err(kmm_qmri_jacobian_mul(m.0, &good, mb, mb, mb, small, out), KMM_ERROR_OUT_OF_RANGE, &["v holds"]);
    expect_err(kmm_qmri_jacobian_adjoint_mul(m.0, &good, mb, mb, small, out, out), KMM_ERROR_OUT_OF_RANGE, &["dm_dt2"]);
    let seq = FispSpec::mrf(p.nr, 8);
    let raw = seq.raw();
    let params = upload(&m, &vec![[1.0f32, 0.1, 1.0, 0.0]; 2]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, &raw, params, 1, 2, mb, 0, 0, 0), KMM_ERROR_OUT_OF_RANGE, &["params"]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, &raw, params, 0, 2, mb, 0, 0, 1), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, std::ptr::null(), params, 0, 2, mb, 0, 0, 0), KMM_ERROR_NULL_POINTER, &["seq"]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, &raw, params, 0, 2, small, 0, 0, 0), KMM_ERROR_OUT_OF_RANGE, &["m holds"]);
    let badp = upload(&m, &vec![[1.0f32, -0.1, 1.0, 0.0]; 2]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, &raw, badp, 0, 2, mb, 0, 0, 0), KMM_ERROR_INVALID_ARGUMENT, &["T2"]);
    assert_eq!(m.download(out, 0, 64), before, "refused calls wrote nothing");
}

/// An output sharing memory with an input or another output is refused before anything is
/// written: with `dm_dt1 == m` the derivatives returned `KMM_OK` and the buffer held m alone.
#[test]
fn outputs_that_share_memory_with_an_argument_are_refused() {
    let m = Mgr::new();
    let p = problem();
    let model = upload_model(&m, &p);
    let n = (p.nr * p.nvox) as u64;
    let seq = FispSpec::mrf(p.nr, 8);
    let params = upload(&m, &atoms(&p));
    let (mb, d1, d2) = (m.alloc(n * 8, DEVICE), m.alloc(n * 8, DEVICE), m.alloc(n * 8, DEVICE));
    let shared = "an output may not overlap another argument";
    expect_err(kmm_qmri_fisp_derivatives(m.0, &seq.raw(), params, 0, p.nvox as u64, mb, mb, d2, 0), KMM_ERROR_INVALID_ARGUMENT, &["dm_dt1 and m", shared]);
    expect_err(kmm_qmri_fisp_derivatives(m.0, &seq.raw(), params, 0, p.nvox as u64, mb, d1, d1, 0), KMM_ERROR_INVALID_ARGUMENT, &["dm_dt2 and dm_dt1"]);
    ok(kmm_qmri_fisp_derivatives(m.0, &seq.raw(), params, 0, p.nvox as u64, mb, d1, d2, 0));
    let ns = (p.nc * p.nr * p.ns) as u64;
    // Large enough for every product's output, so that only the sharing is wrong.
    let big = m.alloc(ns.max(n) * 8, DEVICE);
    ok(kmm_qmri_mrstat_signal(m.0, &model, mb, big));
    let signal: Vec<Cf> = download(&m, big, ns as usize);
    let mags: Vec<Cf> = download(&m, mb, n as usize);
    // Valid voxel records at the start of a buffer large enough for the signal.
    let records = bytes_of(&p.records);
    let vo = m.alloc((ns * 8).max(records.len() as u64), DEVICE);
    m.upload(vo, 0, &records);
    expect_err(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { voxels: vo, ..model }, mb, vo), KMM_ERROR_INVALID_ARGUMENT, &["out and model->voxels"]);
    let (mbig, vbig) = (m.alloc(ns.max(n) * 8, DEVICE), m.alloc(ns.max(n) * 8, DEVICE));
    ok(kmm_qmri_fisp_derivatives(m.0, &seq.raw(), params, 0, p.nvox as u64, mbig, 0, 0, 0));
    expect_err(kmm_qmri_mrstat_signal(m.0, &model, mbig, mbig), KMM_ERROR_INVALID_ARGUMENT, &["out and m", shared]);
    let v = upload(&m, &vec![0.01f32; 4 * p.nvox]);
    ok(kmm_copy_buffer(m.0, vbig, 0, m.0, v, 0, 16 * p.nvox as u64));
    expect_err(kmm_qmri_jacobian_mul(m.0, &model, mb, d1, d2, vbig, vbig), KMM_ERROR_INVALID_ARGUMENT, &["out and v"]);
    expect_err(kmm_qmri_jacobian_mul(m.0, &model, mb, d1, d2, v, d1), KMM_ERROR_INVALID_ARGUMENT, &["out and dm_dt1"]);
    expect_err(kmm_qmri_jacobian_adjoint_mul(m.0, &model, mb, d1, d2, big, big), KMM_ERROR_INVALID_ARGUMENT, &["out and w"]);
    expect_err(kmm_qmri_jacobian_adjoint_mul(m.0, &model, mb, d1, d2, big, model.coils), KMM_ERROR_INVALID_ARGUMENT, &["out and model->coils"]);
    assert_eq!(download::<Cf>(&m, big, ns as usize), signal, "the refused calls wrote nothing");
    assert_eq!(download::<Cf>(&m, mb, n as usize), mags);
}
