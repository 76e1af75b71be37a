//! qMRI benchmark: FISP and pSSFP dictionary simulation and dictionary matching on Kmm's
//! manager, against the CPU reference (on a subset of atoms, scaled) and against bare cuBLAS
//! CGEMM of the same shapes, all in one run.
//!
//! `qmri [--quick] [--cpu-atoms N]`. Full sizes: FISP 350,000 atoms x 1,120 TRs, Ns = 32;
//! matching 100,000 atoms x 1,000 TRs against 65,536 voxels. Without CUDA (host backend) the
//! sizes shrink so the run finishes on a laptop. `qmri --big [ATOMS]` runs only the large
//! compressed match: ATOMS atoms (default 1,000,000) x 1,000 TRs against as many voxels at
//! rank 32 (16 GB of dictionary and signals on the device).

use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::qmri::*;
use kmm::ffi::types::*;
use kmm::ffi::registry::with_manager;
use kmm::qmri::{cpu, gpu, Atom, Pssfp};

#[path = "../shared.rs"]
mod shared;
use shared::{atoms, fisp_seq, ok, DEVICE};
use std::time::Instant;

fn pssfp_seq(ntr: usize, nrf: usize, nz: usize) -> Pssfp {
    let flip: Vec<f32> = (0..ntr).map(|n| (n as f32 / 160.0 * std::f32::consts::PI).sin().abs() * 1.05 + 0.02).collect();
    let z = (0..nz).map(|i| (i as f32 - (nz as f32 - 1.0) / 2.0) * 0.02).collect();
    Pssfp {
        phase: vec![0.0; ntr],
        flip,
        rf_shape: vec![1.0 / nrf as f32; nrf],
        z,
        dt_ex: 1e-4,
        dt_inv: 0.015,
        dt_pr: 0.002,
        gz_ex: 2.0,
        gz_pr: -10.0,
    }
}

struct Mgr(KmmManager);
impl Mgr {
    fn alloc(&self, bytes: u64) -> KmmBuffer {
        let mut b = 0;
        ok(kmm_buffer_alloc(self.0, bytes, DEVICE, &mut b));
        b
    }
    fn upload<T: Copy>(&self, v: &[T]) -> KmmBuffer {
        let bytes = std::mem::size_of_val(v) as u64;
        let b = self.alloc(bytes);
        ok(kmm::ffi::copy::kmm_copy_to_device(self.0, b, 0, v.as_ptr().cast(), bytes));
        b
    }
    fn download<T: Copy + Default>(&self, b: KmmBuffer, count: usize) -> Vec<T> {
        let mut v = vec![T::default(); count];
        ok(kmm::ffi::copy::kmm_copy_to_host(self.0, v.as_mut_ptr().cast(), b, 0, std::mem::size_of_val(&v[..]) as u64));
        v
    }
    fn sync(&self) {
        ok(kmm_manager_synchronize(self.0));
    }
    fn free(&self, b: KmmBuffer) {
        ok(kmm_buffer_free(self.0, b, 0));
    }
    /// Best of `reps` timings of `f` followed by a synchronize, in seconds.
    fn time(&self, reps: usize, mut f: impl FnMut()) -> f64 {
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            self.sync();
            let t = Instant::now();
            f();
            self.sync();
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    }
}

/// The MR-STAT operations at issue 18's size: an `n x n` object (50,176 voxels at n = 224),
/// `nr` readouts of `n` samples (Cartesian), one coil; magnetization and derivatives, signal,
/// J·v and Jᴴw, each timed (best of 3).
fn mrstat_ops(m: &Mgr, n: usize, nr: usize) {
    use kmm::ffi::mrstat::*;
    let nv = n * n;
    let fov = 0.2f32;
    let dk = 2.0 * std::f32::consts::PI / fov;
    let recs: Vec<[f32; 6]> = (0..nv).map(|i| [((i % n) as f32 - n as f32 / 2.0) * fov / n as f32, ((i / n) as f32 - n as f32 / 2.0) * fov / n as f32, 0.05 + 0.001 * (i % 50) as f32, 0.0, 0.8, 0.0]).collect();
    let kspace: Vec<[f32; 2]> = (0..nr).flat_map(|r| [[-(n as f32) / 2.0 * dk, ((r % n) as f32 - n as f32 / 2.0) * dk], [dk, 0.0]]).collect();
    let model = KmmMrstatModel {
        nvoxels: nv as u64,
        nreadouts: nr as u64,
        nsamples: n as u64,
        ncoils: 1,
        voxels: m.upload(&recs),
        coils: m.upload(&vec![[1f32, 0.0]; nv]),
        trajectory: KMM_TRAJECTORY_CARTESIAN,
        dt: 5e-6,
        kspace: m.upload(&kspace),
    };
    let seq = fisp_seq(nr, 16);
    let raw = KmmFispSequence::view(&seq);
    let at: Vec<Atom> = (0..nv).map(|i| Atom { t1: 0.5 + 0.01 * (i % 100) as f32, t2: recs[i][2], b1: 1.0, b0: 0.0 }).collect();
    let p = m.upload(&at);
    let len = (nr * nv * 8) as u64;
    let (mb, d1, d2) = (m.alloc(len), m.alloc(len), m.alloc(len));
    let td = m.time(3, || ok(kmm_qmri_fisp_derivatives(m.0, &raw, p, 0, nv as u64, mb, d1, d2, 0)));
    row("magnetization + dT1 + dT2", &format!("{nv} atoms x {nr} TRs"), td, "", "FISP Ns 16, exact derivatives");
    let ns = nr * n;
    let out = m.alloc(ns as u64 * 8);
    let shape = format!("{nv} vox, {nr} x {n} samples");
    let v = m.upload(&(0..4 * nv).map(|i| 0.01 * (1.0 + (i % 7) as f32 / 7.0)).collect::<Vec<f32>>());
    let g = m.alloc(16 * nv as u64);
    // The three operations on `model`, each timed (best of 3); `what` follows each row's name.
    let time_ops = |model: &KmmMrstatModel, what: &str, note: &str, targets: bool| {
        let ts = m.time(3, || ok(kmm_qmri_mrstat_signal(m.0, model, mb, out)));
        let tj = m.time(3, || ok(kmm_qmri_jacobian_mul(m.0, model, mb, d1, d2, v, out)));
        let ta = m.time(3, || ok(kmm_qmri_jacobian_adjoint_mul(m.0, model, mb, d1, d2, out, g)));
        for (op, t, target) in [("signal", ts, "2.0"), ("J v", tj, "4.0"), ("J^H w", ta, "4.5")] {
            let note = if targets { format!("{note}; target <= {target} ms on an H200") } else { note.to_string() };
            row(&format!("{op}{what}"), &shape, t, "", &note);
        }
    };
    let cuda = with_manager(m.0, |mm| Ok(mm.backend_kind() == kmm::backend::BackendKind::Cuda)).unwrap();
    time_ops(&model, "", if cuda { "column path (auto)" } else { "host backend" }, true);
    if cuda {
        // The dense products' path and new positions (grouped again) in the same run. One
        // thread runs here, so setting the variable races nothing.
        std::env::set_var("KMM_MRSTAT_PATH", "products");
        time_ops(&model, "", "dense products (KMM_MRSTAT_PATH=products)", false);
        std::env::remove_var("KMM_MRSTAT_PATH");
        let moved: Vec<KmmBuffer> = (1..=3)
            .map(|k| m.upload(&recs.iter().map(|r| [r[0] + 1e-5 * k as f32, r[1], r[2], r[3], r[4], r[5]]).collect::<Vec<_>>()))
            .collect();
        let mut next = moved.iter();
        let t = m.time(3, || ok(kmm_qmri_mrstat_signal(m.0, &KmmMrstatModel { voxels: *next.next().unwrap(), ..model }, mb, out)));
        row("signal, new positions", &shape, t, "", "the column path groups the voxels again (a Gauss-Newton loop groups once)");
        for b in moved {
            m.free(b);
        }
        mrstat_products(m, nv as u64, nr as u64, n as u64);
    }
    mrstat_errors(m, &model, &recs, &kspace, [mb, d1, d2], v, n, nr, "");
    if cuda {
        // Off-resonance of up to +-440 Hz (fat at 3 T): the column path cuts the readout into
        // pieces where one series would need too many terms.
        let recs_b0: Vec<[f32; 6]> = recs.iter().enumerate().map(|(i, r)| [r[0], r[1], r[2], ((i % 9) as f32 - 4.0) * 110.0, r[4], r[5]]).collect();
        let model_b0 = KmmMrstatModel { voxels: m.upload(&recs_b0), ..model };
        time_ops(&model_b0, ", B0 +-440 Hz", "auto: the column path with the readout in pieces (the adjoint: dense products)", false);
        mrstat_errors(m, &model_b0, &recs_b0, &kspace, [mb, d1, d2], v, n, nr, ", B0 +-440 Hz");
        m.free(model_b0.voxels);
    }
    for b in [model.voxels, model.coils, model.kspace, p, mb, d1, d2, out, v, g] {
        m.free(b);
    }
}

/// Relative errors of the signal, J v and J^H w at full size against the f64 reference, on 16
/// readouts spread over the acquisition (the reference of all of them takes minutes): the
/// device's outputs of those readouts (for J^H w, of a w that is zero on the other readouts)
/// against the reference of a model of those readouts alone.
#[allow(clippy::too_many_arguments)]
fn mrstat_errors(m: &Mgr, model: &kmm::ffi::mrstat::KmmMrstatModel, recs: &[[f32; 6]], kspace: &[[f32; 2]], mag: [KmmBuffer; 3], v: KmmBuffer, n: usize, nr: usize, label: &str) {
    use kmm::ffi::mrstat::*;
    use kmm::qmri::mrstat::{self, Cartesian, Model, Trajectory, VoxelParam, Voxels};
    let nv = recs.len();
    let picks: Vec<usize> = (0..16).map(|j| j * nr / 16 + 3).collect();
    let c = |z: [f32; 2]| [z[0] as f64, z[1] as f64];
    let f = |j: usize| recs.iter().map(|r| r[j] as f64).collect::<Vec<_>>();
    let voxels = Voxels { x: f(0), y: f(1), t2: f(2), b0: f(3), rho: recs.iter().map(|r| [r[4] as f64, r[5] as f64]).collect() };
    let coils = vec![[1.0, 0.0]; nv];
    let (k0, dk) = picks.iter().map(|&r| (c(kspace[2 * r]), c(kspace[2 * r + 1]))).unzip();
    let traj = Trajectory::Cartesian(Cartesian { nsamples: n, dt: model.dt as f64, k0, dk });
    let sub = Model { voxels: &voxels, coils: &coils, traj: &traj };
    // The picked readouts of an nr x nv magnetization (readout fastest).
    let pick = |b: KmmBuffer| {
        let all: Vec<[f32; 2]> = m.download(b, nr * nv);
        let mut out = Vec::with_capacity(picks.len() * nv);
        for vx in 0..nv {
            out.extend(picks.iter().map(|&r| c(all[vx * nr + r])));
        }
        out
    };
    let (m0, m1, m2) = (pick(mag[0]), pick(mag[1]), pick(mag[2]));
    // The picked readouts of a signal-shaped buffer (one coil: readout-major, sample fastest).
    let rows = |all: &[[f32; 2]]| picks.iter().flat_map(|&r| all[r * n..(r + 1) * n].iter().map(|&z| c(z))).collect::<Vec<_>>();
    let rel = |got: &[[f64; 2]], want: &[[f64; 2]]| {
        let num: f64 = got.iter().zip(want).map(|(a, b)| (a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sum();
        (num / want.iter().map(|b| b[0] * b[0] + b[1] * b[1]).sum::<f64>()).sqrt()
    };
    let out = m.alloc((nr * n * 8) as u64);
    let mut want = vec![[0f64; 2]; picks.len() * n];
    ok(kmm_qmri_mrstat_signal(m.0, model, mag[0], out));
    mrstat::signal(&sub, &m0, &mut want).unwrap();
    let es = rel(&rows(&m.download(out, nr * n)), &want);
    let params = [VoxelParam::T1, VoxelParam::T2, VoxelParam::RhoRe, VoxelParam::RhoIm];
    let v64: Vec<f64> = m.download::<f32>(v, 4 * nv).iter().map(|&x| x as f64).collect();
    ok(kmm_qmri_jacobian_mul(m.0, model, mag[0], mag[1], mag[2], v, out));
    mrstat::jacobian_mul(&sub, &m0, &params, &[&m1, &m2, &[], &[]], &v64, &mut want).unwrap();
    let ej = rel(&rows(&m.download(out, nr * n)), &want);
    // w on the picked readouts only.
    let mut w = vec![[0f32; 2]; nr * n];
    let mut w_sub = Vec::with_capacity(picks.len() * n);
    for (j, &r) in picks.iter().enumerate() {
        for s in 0..n {
            let z = [((j * 13 + s * 7) % 11) as f32 / 11.0 - 0.5, ((j * 5 + s * 3) % 7) as f32 / 7.0 - 0.5];
            w[r * n + s] = z;
            w_sub.push(c(z));
        }
    }
    let (wb, g) = (m.upload(&w), m.alloc(16 * nv as u64));
    ok(kmm_qmri_jacobian_adjoint_mul(m.0, model, mag[0], mag[1], mag[2], wb, g));
    let mut g_want = vec![0f64; 4 * nv];
    mrstat::jacobian_adjoint_mul(&sub, &m0, &params, &[&m1, &m2, &[], &[]], &w_sub, &mut g_want).unwrap();
    let g_got = m.download::<f32>(g, 4 * nv);
    let num: f64 = g_got.iter().zip(&g_want).map(|(a, b)| (*a as f64 - b).powi(2)).sum();
    let ea = (num / g_want.iter().map(|b| b * b).sum::<f64>()).sqrt();
    for (what, e) in [("signal", es), ("J v", ej), ("J^H w", ea)] {
        println!("| {:<28} | {:<30} | {e:>10.2e} | {:>22} | relative error vs f64 on 16 readouts; target <= 1e-4 |", format!("  {what}{label}: error"), format!("{nv} vox, 16 x {n} samples"), if e <= 1e-4 { "met" } else { "NOT MET" });
    }
    for b in [out, wb, g] {
        m.free(b);
    }
}

/// The dense path's products alone: its floor, which the column path goes under.
fn mrstat_products(m: &Mgr, nv: u64, nr: u64, ns: u64) {
    use kmm::qmri::BareProducts;
    let shape = format!("{nv} vox, {nr} x {ns} samples");
    let flops = 8.0 * (nv * nr * ns) as f64;
    with_manager(m.0, |mm| {
        let bare = BareProducts::new(mm, nv, nr, ns)?;
        for (what, halves, adjoint) in [("signal", 1, false), ("J v", 2, false), ("J^H w", 2, true)] {
            let t = m.time(3, || bare.run(halves, adjoint).unwrap());
            let note = "the dense path's CGEMM alone (its floor)";
            row(&format!("  {what}: product"), &shape, t, &format!("{:.1} TFLOP/s", flops * halves as f64 / t / 1e12), note);
        }
        Ok(())
    })
    .unwrap();
}

/// `n` atoms x 1000 TRs against `n` voxels (every atom, noiseless) at rank 32: simulation, the
/// basis, and the match in it, each timed once.
fn big_match(m: &Mgr, n: usize) {
    let (ntr, rank) = (1000usize, 32u32);
    let seq = fisp_seq(ntr, 16);
    let raw = KmmFispSequence::view(&seq);
    let dat = atoms(n, 3);
    let dp = m.upload(&dat);
    let dict = m.alloc((n * ntr * 8) as u64);
    let sig = m.alloc((n * ntr * 8) as u64);
    let shape = format!("{n} x {ntr} vs {n} voxels");
    let ts = m.time(1, || {
        ok(kmm_qmri_simulate_fisp(m.0, &raw, dp, 0, n as u64, dict, KMM_QMRI_SKIP_CHECKS));
        ok(kmm_qmri_simulate_fisp(m.0, &raw, dp, 0, n as u64, sig, KMM_QMRI_SKIP_CHECKS));
    });
    row("simulate dictionary, signals", &shape, ts, "", "FISP Ns 16, twice");
    let basis = m.alloc(ntr as u64 * rank as u64 * 8);
    let tb = m.time(1, || ok(kmm_qmri_compression_basis(m.0, dict, ntr as u64, n as u64, rank, basis)));
    row("compression basis, rank 32", &format!("{n} x {ntr}"), tb, "", "");
    let idx = m.alloc(n as u64 * 4);
    let score = m.alloc(n as u64 * 4);
    let outs = KmmMatchOutputs { index: idx, score, pd: 0, params: 0 };
    let tm = m.time(1, || ok(kmm_qmri_match_in_basis(m.0, dict, ntr as u64, n as u64, 0, sig, n as u64, basis, rank, 0, &outs, KMM_MATCH_SKIP_CHECKS)));
    let mut found = vec![0i32; n];
    ok(kmm::ffi::copy::kmm_copy_to_host(m.0, found.as_mut_ptr().cast(), idx, 0, n as u64 * 4));
    let exact = found.iter().enumerate().filter(|(v, &j)| j as usize == *v).count();
    row("match in the basis, rank 32", &shape, tm, &format!("{:.3e} pairs/s", (n as f64) * (n as f64) / tm), &format!("{exact}/{n} exact"));
    row("basis and match", &shape, tb + tm, "", "target <= 15 s on an H200");
    for b in [dp, dict, sig, basis, idx, score] {
        m.free(b);
    }
}

fn row(what: &str, shape: &str, secs: f64, rate: &str, note: &str) {
    println!("| {what:<28} | {shape:<30} | {:>10.3} | {rate:>22} | {note} |", secs * 1e3);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let cpu_atoms: usize = args.iter().position(|a| a == "--cpu-atoms").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(2000);

    let mut handle = 0;
    ok(kmm_manager_create(std::ptr::null(), &mut handle));
    let m = Mgr(handle);
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(m.0, &mut info));
    let cuda = info.backend == KmmBackend::KMM_BACKEND_CUDA as u32;
    let name = with_manager(m.0, |mm| Ok(mm.device_name())).unwrap();
    if args.iter().any(|a| a == "--mrstat") {
        println!("# Kmm qMRI benchmark on {name}: MR-STAT operations");
        println!();
        println!("| {:<28} | {:<30} | {:>10} | {:>22} | note |", "what", "shape", "ms", "rate");
        println!("|{}|{}|{}|{}|---|", "-".repeat(30), "-".repeat(32), "-".repeat(12), "-".repeat(24));
        mrstat_ops(&m, if quick { 64 } else { 224 }, if quick { 320 } else { 1120 });
        ok(kmm_manager_destroy(m.0, 0));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--big") {
        let n = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        println!("# Kmm qMRI benchmark on {name}: the large compressed match");
        println!();
        println!("| {:<28} | {:<30} | {:>10} | {:>22} | note |", "what", "shape", "ms", "rate");
        println!("|{}|{}|{}|{}|---|", "-".repeat(30), "-".repeat(32), "-".repeat(12), "-".repeat(24));
        big_match(&m, n);
        ok(kmm_manager_destroy(m.0, 0));
        return;
    }
    let small = quick || !cuda;
    // (FISP atoms, matching atoms, voxels, pSSFP atoms): full, --quick on CUDA, host backend.
    let (fisp_atoms, m_atoms, m_vox, p_atoms) = match (cuda, quick) {
        (true, false) => (350_000, 100_000, 65_536, 100_000),
        (true, true) => (50_000, 20_000, 8_192, 20_000),
        (false, _) => (2_000, 1_000, 256, 500),
    };
    // `--fisp-atoms N`: FISP at N atoms, and only FISP (the lanes' sweep).
    let fisp_only: Option<usize> = args.iter().position(|a| a == "--fisp-atoms").map(|i| {
        args.get(i + 1).and_then(|v| v.parse().ok()).expect("--fisp-atoms needs a number")
    });
    let fisp_atoms = fisp_only.unwrap_or(fisp_atoms);
    let (fisp_ntr, ns, m_ntr) = (1120, 32, 1000);
    println!("# Kmm qMRI benchmark on {name} ({}), {}", if cuda { "CUDA" } else { "host backend" }, if small { "reduced sizes" } else { "full sizes" });
    println!();
    println!("| {:<28} | {:<30} | {:>10} | {:>22} | note |", "what", "shape", "ms", "rate");
    println!("|{}|{}|{}|{}|---|", "-".repeat(30), "-".repeat(32), "-".repeat(12), "-".repeat(24));

    // ---- FISP ----
    let seq = fisp_seq(fisp_ntr, ns);
    let raw = KmmFispSequence::view(&seq);
    let at = atoms(fisp_atoms, 7);
    let p = m.upload(&at);
    let out = m.alloc((fisp_atoms * fisp_ntr * 8) as u64);
    let first = m.time(1, || ok(kmm_qmri_simulate_fisp(m.0, &raw, p, 0, fisp_atoms as u64, out, KMM_QMRI_SKIP_CHECKS)));
    row("FISP first call", &format!("{fisp_atoms} x {fisp_ntr}, Ns {ns}"), first, "", "includes NVRTC compile or cache load");
    let t = m.time(if small { 2 } else { 5 }, || ok(kmm_qmri_simulate_fisp(m.0, &raw, p, 0, fisp_atoms as u64, out, KMM_QMRI_SKIP_CHECKS)));
    let work = (fisp_atoms * fisp_ntr) as f64;
    row(if cuda { "FISP GPU" } else { "FISP host backend" }, &format!("{fisp_atoms} x {fisp_ntr}, Ns {ns}"), t, &format!("{:.3e} atom-TR/s", work / t), "best of runs, parameter check skipped");
    if cuda {
        let sms = kmm::backend::cuda::module::device_info(0).map_or(132, |d| d.multiprocessors as u32);
        let default_lanes = gpu::fisp_lanes(ns, fisp_atoms, sms);
        for lanes in [1u32, 2, 4, 8, 32] {
            std::env::set_var("KMM_FISP_LANES", lanes.to_string());
            m.time(1, || ok(kmm_qmri_simulate_fisp(m.0, &raw, p, 0, fisp_atoms as u64, out, KMM_QMRI_SKIP_CHECKS)));
            let tl = m.time(3, || ok(kmm_qmri_simulate_fisp(m.0, &raw, p, 0, fisp_atoms as u64, out, KMM_QMRI_SKIP_CHECKS)));
            std::env::remove_var("KMM_FISP_LANES");
            row(&format!("  FISP GPU, {lanes} lanes/atom"), &format!("{fisp_atoms} x {fisp_ntr}, Ns {ns}"), tl, &format!("{:.3e} atom-TR/s", work / tl), &format!("default here is {}", default_lanes));
        }
    }
    if fisp_only.is_some() {
        ok(kmm_manager_destroy(m.0, 0));
        return;
    }
    let tc = m.time(1, || ok(kmm_qmri_simulate_fisp(m.0, &raw, p, 0, fisp_atoms as u64, out, 0)));
    row("FISP, checked parameters", &format!("{fisp_atoms} x {fisp_ntr}, Ns {ns}"), tc, &format!("{:.3e} atom-TR/s", work / tc), "copies parameters to the host and waits");
    // CPU reference on a subset, scaled.
    let sub = &at[..cpu_atoms.min(fisp_atoms)];
    let mut host_out = vec![[0f32; 2]; sub.len() * fisp_ntr];
    let t0 = Instant::now();
    cpu::simulate_fisp(&seq, sub, &mut host_out);
    let tcpu = t0.elapsed().as_secs_f64();
    let rate_cpu = (sub.len() * fisp_ntr) as f64 / tcpu;
    row(
        "FISP CPU reference (f64)",
        &format!("{} x {fisp_ntr}, scaled", sub.len()),
        work / rate_cpu,
        &format!("{rate_cpu:.3e} atom-TR/s"),
        &format!("{} threads; {} {:.0}x faster", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), if cuda { "GPU" } else { "host backend" }, (work / t) / rate_cpu),
    );
    if cuda {
        // Accuracy of this run's GPU output against the reference on the subset.
        let mut gpu_out = vec![[0f32; 2]; sub.len() * fisp_ntr];
        ok(kmm::ffi::copy::kmm_copy_to_host(m.0, gpu_out.as_mut_ptr().cast(), out, 0, (gpu_out.len() * 8) as u64));
        let worst = gpu_out
            .chunks(fisp_ntr)
            .zip(host_out.chunks(fisp_ntr))
            .map(|(g, c)| {
                let (mut n, mut d) = (0f64, 0f64);
                for (x, y) in g.iter().zip(c) {
                    n += ((x[0] - y[0]) as f64).powi(2) + ((x[1] - y[1]) as f64).powi(2);
                    d += (y[0] as f64).powi(2) + (y[1] as f64).powi(2);
                }
                (n / d.max(1e-300)).sqrt()
            })
            .fold(0.0, f64::max);
        println!("|   FISP GPU vs CPU, worst per-atom relative error: {worst:.2e} | | | | |");
    }
    m.free(out);
    m.free(p);

    // ---- pSSFP ----
    let (p_ntr, nrf, nz) = (1120, 10, 1);
    let pseq = pssfp_seq(p_ntr, nrf, nz);
    let praw = KmmPssfpSequence::view(&pseq);
    let pat = atoms(p_atoms, 11);
    let pp = m.upload(&pat);
    let pout = m.alloc((p_atoms * p_ntr * 8) as u64);
    m.time(1, || ok(kmm_qmri_simulate_pssfp(m.0, &praw, pp, 0, p_atoms as u64, pout, KMM_QMRI_SKIP_CHECKS)));
    let tp = m.time(3, || ok(kmm_qmri_simulate_pssfp(m.0, &praw, pp, 0, p_atoms as u64, pout, KMM_QMRI_SKIP_CHECKS)));
    let pwork = (p_atoms * p_ntr) as f64;
    row(if cuda { "pSSFP GPU" } else { "pSSFP host backend" }, &format!("{p_atoms} x {p_ntr}, {nrf} RF steps, {nz} z"), tp, &format!("{:.3e} atom-TR/s", pwork / tp), "");
    let psub = &pat[..(cpu_atoms / 2).min(p_atoms)];
    let mut phost = vec![[0f32; 2]; psub.len() * p_ntr];
    let t0 = Instant::now();
    cpu::simulate_pssfp(&pseq, psub, &mut phost);
    let prate = (psub.len() * p_ntr) as f64 / t0.elapsed().as_secs_f64();
    row("pSSFP CPU reference (f64)", &format!("{} x {p_ntr}, scaled", psub.len()), pwork / prate, &format!("{prate:.3e} atom-TR/s"), "");
    m.free(pout);
    m.free(pp);

    // ---- matching ----
    let mseq = fisp_seq(m_ntr, 16);
    let mraw = KmmFispSequence::view(&mseq);
    let dat = atoms(m_atoms, 3);
    let dp = m.upload(&dat);
    let dict = m.alloc((m_atoms * m_ntr * 8) as u64);
    ok(kmm_qmri_simulate_fisp(m.0, &mraw, dp, 0, m_atoms as u64, dict, KMM_QMRI_SKIP_CHECKS));
    // Voxels: atoms of the dictionary (every k-th), so the answer is known.
    let step = (m_atoms / m_vox).max(1);
    let vat: Vec<Atom> = (0..m_vox).map(|v| dat[(v * step) % m_atoms]).collect();
    let vp = m.upload(&vat);
    let sig = m.alloc((m_vox * m_ntr * 8) as u64);
    ok(kmm_qmri_simulate_fisp(m.0, &mraw, vp, 0, m_vox as u64, sig, KMM_QMRI_SKIP_CHECKS));
    let idx = m.alloc(m_vox as u64 * 4);
    let score = m.alloc(m_vox as u64 * 4);
    let pd = m.alloc(m_vox as u64 * 8);
    let shape = format!("{m_atoms} x {m_ntr} vs {m_vox} voxels");
    let outs = KmmMatchOutputs { index: idx, score, pd, params: 0 };
    let run_match = |rank: u32| ok(kmm_qmri_match(m.0, dict, m_ntr as u64, m_atoms as u64, 0, sig, m_vox as u64, rank, 0, &outs, 0));
    m.time(1, || run_match(0));
    let tm = m.time(3, || run_match(0));
    let flops = 8.0 * m_atoms as f64 * m_vox as f64 * m_ntr as f64;
    // The bare GEMM the match runs, on the same buffers (the match's floor).
    let time_bare_gemm = || {
        m.time(3, || {
            with_manager(m.0, |mm| {
                let (d, x) = (mm.map(dict)?, mm.map(sig)?);
                let r = gpu::bare_gemm(mm, d, m_ntr, m_atoms, x, m_vox);
                mm.unmap(dict)?;
                mm.unmap(sig)?;
                r
            })
            .unwrap()
        })
    };
    // Voxels whose match is the atom they were made from.
    let mut found = vec![0i32; m_vox];
    let mut count_exact = || {
        ok(kmm::ffi::copy::kmm_copy_to_host(m.0, found.as_mut_ptr().cast(), idx, 0, m_vox as u64 * 4));
        found.iter().enumerate().filter(|(v, &j)| j as usize == (v * step) % m_atoms).count()
    };
    let exact = count_exact();
    if cuda {
        let tg = time_bare_gemm();
        let chunk = with_manager(m.0, |mm| gpu::match_chunk(mm, m_atoms, m_vox)).unwrap();
        row("bare cuBLAS CGEMM", &shape, tg, &format!("{:.1} TFLOP/s", flops / tg / 1e12), &format!("same chunks ({chunk} voxels)"));
        row("match (GEMM + argmax)", &shape, tm, &format!("{:.1} TFLOP/s", flops / tm / 1e12), &format!("{:.3}x bare GEMM; {exact}/{m_vox} exact", tm / tg));
    } else {
        row("match host backend", &shape, tm, &format!("{:.3e} voxel/s", m_vox as f64 / tm), &format!("{exact}/{m_vox} exact"));
    }
    if cuda {
        // TF32 tensor cores for the GEMMs: same comparison.
        std::env::set_var("KMM_MATCH_MATH", "tf32");
        m.time(1, || run_match(0));
        let tm32 = m.time(3, || run_match(0));
        let tg32 = time_bare_gemm();
        std::env::remove_var("KMM_MATCH_MATH");
        let exact = count_exact();
        row("bare CGEMM, TF32", &shape, tg32, &format!("{:.1} TFLOP/s", flops / tg32 / 1e12), "KMM_MATCH_MATH=tf32");
        row("match, TF32", &shape, tm32, &format!("{:.1} TFLOP/s", flops / tm32 / 1e12), &format!("{:.3}x bare TF32 GEMM; {exact}/{m_vox} exact", tm32 / tg32));
    }
    for rank in [32u32, 64] {
        let tr = m.time(2, || run_match(rank));
        let exact = count_exact();
        row(&format!("match, rank {rank}, own basis"), &shape, tr, &format!("{:.2}x uncompressed", tm / tr), &format!("{exact}/{m_vox} exact; basis and match"));
        // The basis once, then the match in it: what a batched match costs per batch.
        let basis = m.alloc(m_ntr as u64 * rank as u64 * 8);
        let make_basis = || ok(kmm_qmri_compression_basis(m.0, dict, m_ntr as u64, m_atoms as u64, rank, basis));
        let run_in = || ok(kmm_qmri_match_in_basis(m.0, dict, m_ntr as u64, m_atoms as u64, 0, sig, m_vox as u64, basis, rank, 0, &outs, KMM_MATCH_SKIP_CHECKS));
        if cuda {
            // Other choices of the power iterations' count and math, each with the exactness
            // of the match in its basis (the evidence for the default).
            for (math, it) in [("fp32", 6), ("fp32", 2), ("tf32", 2), ("tf32", 6)] {
                std::env::set_var("KMM_BASIS_MATH", math);
                std::env::set_var("KMM_BASIS_ITERATIONS", it.to_string());
                let t = m.time(2, make_basis);
                run_in();
                let note = format!("KMM_BASIS_MATH={math} KMM_BASIS_ITERATIONS={it}; the match in it: {}/{m_vox} exact", count_exact());
                row(&format!("    {it} iterations, {math}"), &format!("{m_atoms} x {m_ntr}"), t, "", &note);
            }
            std::env::remove_var("KMM_BASIS_MATH");
            std::env::remove_var("KMM_BASIS_ITERATIONS");
        }
        let tb = m.time(2, make_basis);
        row(&format!("  compression basis, rank {rank}"), &format!("{m_atoms} x {m_ntr}"), tb, "", if cuda { "randomized range finder (default: 3 power iterations in TF32), cuSOLVER QR and eigensolver" } else { "host reference" });
        m.time(1, run_in);
        let ti = m.time(3, run_in);
        let exact = count_exact();
        if cuda {
            let tbare = m.time(3, || {
                with_manager(m.0, |mm| {
                    let (d, x, u) = (mm.map(dict)?, mm.map(sig)?, mm.map(basis)?);
                    let r = gpu::bare_compressed_gemm(mm, u, rank as usize, d, m_ntr, m_atoms, x, m_vox);
                    for b in [dict, sig, basis] {
                        mm.unmap(b)?;
                    }
                    r
                })
                .unwrap()
            });
            row(&format!("  bare rank-{rank} GEMM"), &shape, tbare, "", "projections + compressed CGEMM, same chunks");
            row(&format!("  match in the basis, rank {rank}"), &shape, ti, &format!("{:.2}x bare rank-{rank} GEMM", ti / tbare), &format!("{exact}/{m_vox} exact"));
            if rank <= 32 {
                // The fused kernel against GEMM + argmax over the same coordinates.
                std::env::set_var("KMM_MATCH_FUSED", "0");
                m.time(1, run_in);
                let tg = m.time(3, run_in);
                std::env::remove_var("KMM_MATCH_FUSED");
                let exact = count_exact();
                row(&format!("  same, GEMM + argmax, rank {rank}"), &shape, tg, &format!("{:.2}x bare rank-{rank} GEMM", tg / tbare), &format!("{exact}/{m_vox} exact; KMM_MATCH_FUSED=0"));
            }
        } else {
            row(&format!("  match in the basis, rank {rank}"), &shape, ti, "", &format!("{exact}/{m_vox} exact"));
        }
        m.free(basis);
    }
    for b in [dp, dict, vp, sig, idx, score, pd] {
        m.free(b);
    }
    ok(kmm_manager_destroy(m.0, 0));
}
