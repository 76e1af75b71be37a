//! The CUDA C of the MR-STAT kernels (src/qmri/mrstat_kernels.cu), compiled as C++ with the CUDA
//! shim and run on the CPU (one std::thread per CUDA thread), against the f64 reference
//! `kmm::qmri::mrstat`: signal, J·v, Re(Jᴴ w) and the FISP magnetization with its exact
//! derivatives in T1 and T2. Inputs are rounded to f32 first and the reference runs on the
//! rounded values, so the figures measure the kernels' arithmetic alone.
//! Skipped when no C++ compiler (`c++`) is found.

use kmm::qmri::mrstat::{
    fisp_derivatives, jacobian_adjoint_mul, jacobian_mul, signal, AtomF64, Cartesian, Model, Param, Spiral, Trajectory, VoxelParam, Voxels,
};
use kmm::qmri::Fisp;
use std::f64::consts::PI;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "qmri_common/harness.rs"]
mod harness;
use harness::have_cxx;

fn compile(source: &str, ns: u32, dir: &Path) -> Option<PathBuf> {
    harness::compile(source, "mrstat_kernels.cu", &[("NS", ns)], dir)
}

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi), rounded to f32.
    fn u(&mut self, lo: f64, hi: f64) -> f64 {
        r32(lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64))
    }
    fn c(&mut self) -> [f64; 2] {
        [self.u(-1.0, 1.0), self.u(-1.0, 1.0)]
    }
    fn cvec(&mut self, n: usize) -> Vec<[f64; 2]> {
        (0..n).map(|_| self.c()).collect()
    }
}

fn r32(x: f64) -> f64 {
    x as f32 as f64
}

fn put_i64(buf: &mut Vec<u8>, v: &[i64]) {
    for x in v {
        buf.extend(x.to_le_bytes());
    }
}
fn put_f(buf: &mut Vec<u8>, v: &[f64]) {
    for &x in v {
        buf.extend((x as f32).to_le_bytes());
    }
}
fn put_c(buf: &mut Vec<u8>, v: &[[f64; 2]]) {
    put_f(buf, v.as_flattened());
}

/// Little-endian f32s from `raw`, as f64.
fn floats(raw: &[u8]) -> Vec<f64> {
    raw.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
}
fn complexes(raw: &[u8]) -> Vec<[f64; 2]> {
    floats(raw).chunks(2).map(|c| [c[0], c[1]]).collect()
}

/// ||got - want|| / ||want|| over complex values.
fn rel(got: &[[f64; 2]], want: &[[f64; 2]]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut n, mut d) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        n += (g[0] - w[0]).powi(2) + (g[1] - w[1]).powi(2);
        d += w[0] * w[0] + w[1] * w[1];
    }
    (n / d).sqrt()
}

struct Case {
    name: &'static str,
    nx: usize,
    ny: usize,
    nc: usize,
    nr: usize,
    ns: usize,
    cartesian: bool,
    /// Threads per block and grid y, z of the signal and J·v kernels (y, z smaller than the
    /// readouts and coil groups exercise the grid-stride loops).
    block: i64,
    gy: i64,
    gz: i64,
    /// Threads per block and blocks of the adjoint.
    block_adj: i64,
    gadj: i64,
}

/// Signal, J·v (one vector per parameter alone, then all four) and Re(Jᴴ w) on the CPU through
/// the harness, against the reference; returns (signal, worst J·v, worst Jᴴ w per parameter).
fn check_case(exe: &Path, dir: &Path, cs: &Case, seed: u64) -> (f64, f64, f64) {
    let mut rng = Rng(seed);
    let (nv, nc, nr, ns) = (cs.nx * cs.ny, cs.nc, cs.nr, cs.ns);
    let fov = 0.2;
    let mut vox = Voxels::default();
    for iy in 0..cs.ny {
        for ix in 0..cs.nx {
            vox.x.push(r32((ix as f64 - cs.nx as f64 / 2.0) * fov / cs.nx as f64));
            vox.y.push(r32((iy as f64 - cs.ny as f64 / 2.0) * fov / cs.ny as f64));
            vox.rho.push(rng.c());
            vox.t2.push(rng.u(0.03, 0.5));
            vox.b0.push(rng.u(-30.0, 30.0));
        }
    }
    vox.t2[1] = f64::INFINITY; // no readout decay, and no t/T2² term
    let coils = rng.cvec(nc * nv);
    let dt = r32(5e-5);
    let (traj, k, dk) = if cs.cartesian {
        let (dkx, dky) = (r32(2.0 * PI / fov), r32(2.0 * PI / fov));
        let k0: Vec<[f64; 2]> = (0..nr).map(|r| [r32(-(ns as f64) / 2.0 * dkx), r32((r as f64 - nr as f64 / 2.0) * dky)]).collect();
        let dk = vec![[dkx, r32(0.05 * dkx)]; nr];
        (Trajectory::Cartesian(Cartesian { nsamples: ns, dt, k0: k0.clone(), dk: dk.clone() }), k0, dk)
    } else {
        let kmax = PI * cs.nx.max(cs.ny) as f64 / fov;
        let k: Vec<[f64; 2]> = (0..nr * ns).map(|_| [rng.u(-kmax, kmax), rng.u(-kmax, kmax)]).collect();
        (Trajectory::Spiral(Spiral { nsamples: ns, dt, k: k.clone() }), k, vec![])
    };
    let model = Model { voxels: &vox, coils: &coils, traj: &traj };
    let (m, dm1, dm2) = (rng.cvec(nr * nv), rng.cvec(nr * nv), rng.cvec(nr * nv));
    // One vector per parameter alone (so that no parameter hides behind another), then all four.
    let mut vecs: Vec<Vec<f64>> = (0..4).map(|j| (0..4 * nv).map(|i| if i % 4 == j { rng.u(-1.0, 1.0) } else { 0.0 }).collect()).collect();
    vecs.push((0..4 * nv).map(|_| rng.u(-1.0, 1.0)).collect());
    let nsig = nc * nr * ns;
    let w = rng.cvec(nsig);

    let mut buf = Vec::new();
    put_i64(&mut buf, &[0, nv as i64, nc as i64, nr as i64, ns as i64, cs.cartesian as i64, vecs.len() as i64]);
    put_i64(&mut buf, &[cs.block, cs.gy, cs.gz, cs.block_adj, cs.gadj]);
    put_f(&mut buf, &[dt]);
    put_f(&mut buf, &vox.x);
    put_f(&mut buf, &vox.y);
    put_c(&mut buf, &vox.rho);
    put_f(&mut buf, &vox.t2);
    put_f(&mut buf, &vox.b0);
    put_c(&mut buf, &coils);
    for a in [&m, &dm1, &dm2] {
        put_c(&mut buf, a);
    }
    for v in &vecs {
        put_f(&mut buf, v);
    }
    put_c(&mut buf, &w);
    put_c(&mut buf, &k);
    put_c(&mut buf, &dk);
    let (input, output) = (dir.join(format!("{}.in", cs.name)), dir.join(format!("{}.out", cs.name)));
    std::fs::write(&input, &buf).unwrap();
    assert!(Command::new(exe).arg(&input).arg(&output).status().unwrap().success());
    let raw = std::fs::read(&output).unwrap();
    assert_eq!(raw.len(), 8 * nsig * (1 + vecs.len()) + 16 * nv);
    let sig = complexes(&raw[..8 * nsig]);
    let jv: Vec<Vec<[f64; 2]>> = (0..vecs.len()).map(|j| complexes(&raw[8 * nsig * (1 + j)..8 * nsig * (2 + j)])).collect();
    let adj = floats(&raw[8 * nsig * (1 + vecs.len())..]);

    let mut want = vec![[0.0; 2]; nsig];
    signal(&model, &m, &mut want).unwrap();
    let e_sig = rel(&sig, &want);
    let params = [VoxelParam::T1, VoxelParam::T2, VoxelParam::RhoRe, VoxelParam::RhoIm];
    let dm: [&[[f64; 2]]; 4] = [&dm1, &dm2, &[], &[]];
    let mut e_jv = [0.0f64; 5];
    for (j, v) in vecs.iter().enumerate() {
        jacobian_mul(&model, &m, &params, &dm, v, &mut want).unwrap();
        e_jv[j] = rel(&jv[j], &want);
    }
    let mut want_adj = vec![0.0; 4 * nv];
    jacobian_adjoint_mul(&model, &m, &params, &dm, &w, &mut want_adj).unwrap();
    let mut e_adj = [0.0f64; 4];
    for (j, e) in e_adj.iter_mut().enumerate() {
        let (mut n, mut d) = (0.0, 0.0);
        for v in 0..nv {
            n += (adj[4 * v + j] - want_adj[4 * v + j]).powi(2);
            d += want_adj[4 * v + j].powi(2);
        }
        *e = (n / d).sqrt();
    }
    println!(
        "{}: {nv} voxels, {nc} coils, {nr} readouts x {ns} samples: signal {e_sig:.2e}; J.v (T1, T2, Re rho, Im rho, all) {:.2e} {:.2e} {:.2e} {:.2e} {:.2e}; J^H w (T1, T2, Re rho, Im rho) {:.2e} {:.2e} {:.2e} {:.2e}",
        cs.name, e_jv[0], e_jv[1], e_jv[2], e_jv[3], e_jv[4], e_adj[0], e_adj[1], e_adj[2], e_adj[3]
    );
    (e_sig, e_jv.iter().copied().fold(0.0, f64::max), e_adj.iter().copied().fold(0.0, f64::max))
}

#[test]
fn mrstat_signal_and_jacobian_kernels_on_the_cpu_equal_the_reference() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kmm-mrstat-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile("mrstat_harness.cpp", 8, &dir) else {
        eprintln!("skipped: c++ did not run");
        return;
    };
    let cases = [
        Case { name: "cartesian 6x6", nx: 6, ny: 6, nc: 2, nr: 12, ns: 10, cartesian: true, block: 32, gy: 12, gz: 1, block_adj: 64, gadj: 36 },
        Case { name: "spiral 6x6", nx: 6, ny: 6, nc: 2, nr: 12, ns: 10, cartesian: false, block: 32, gy: 5, gz: 1, block_adj: 32, gadj: 7 },
        // 1000 voxels: 15 full tiles and a partial one, two coil groups (the second partial),
        // two sample blocks (the second partial), adjoint blocks of 96 threads striding over voxels.
        Case { name: "spiral 40x25", nx: 40, ny: 25, nc: 5, nr: 12, ns: 40, cartesian: false, block: 32, gy: 12, gz: 1, block_adj: 64, gadj: 97 },
        Case { name: "cartesian 40x25", nx: 40, ny: 25, nc: 5, nr: 12, ns: 40, cartesian: true, block: 64, gy: 7, gz: 2, block_adj: 96, gadj: 61 },
    ];
    for (i, cs) in cases.iter().enumerate() {
        let (e_sig, e_jv, e_adj) = check_case(&exe, &dir, cs, 11 + i as u64);
        assert!(e_sig <= 1e-5, "{}: signal relative error {e_sig:e}", cs.name);
        assert!(e_jv <= 1e-4, "{}: J.v relative error {e_jv:e}", cs.name);
        assert!(e_adj <= 1e-4, "{}: J^H w relative error {e_adj:e}", cs.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mrstat_fisp_derivatives_kernel_on_the_cpu_equals_the_reference() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kmm-mrstat-fisp-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ns = 8u32;
    let Some(exe) = compile("mrstat_harness.cpp", ns, &dir) else {
        eprintln!("skipped: c++ did not run");
        return;
    };
    let ntr = 40;
    let mut atoms: Vec<[f32; 4]> = vec![];
    for (t1, t2) in [(0.3f32, 0.03f32), (0.8, 0.07), (1.2, 0.1), (2.5, 0.5), (4.0, 2.0)] {
        for (b1, b0) in [(1.0f32, 0.0f32), (0.85, 15.0)] {
            atoms.push([t1, t2, b1, b0]);
        }
    }
    atoms.push([f32::INFINITY, f32::INFINITY, 1.1, -8.0]); // no relaxation: zero derivatives
    let flip: Vec<f32> = (0..ntr).map(|n| (n as f32 / 10.0).sin().abs() * 1.2 + 0.05).collect();
    let phase: Vec<f32> = (0..ntr).map(|n| 0.3 * n as f32).collect();
    let mut worst = [0.0f64; 3];
    for nprof in [0usize, 2] {
        let profile: Vec<f32> = (0..ntr * nprof).map(|i| 0.7 + 0.3 * ((i % ntr) as f32 / ntr as f32) + 0.1 * (i / ntr) as f32).collect();
        let fisp = Fisp { flip: flip.clone(), phase: phase.clone(), tr: 0.0087, te: 0.0035, ti: 0.015, max_state: ns, profile };
        let np = fisp.positions();
        let mut buf = Vec::new();
        put_i64(&mut buf, &[1, atoms.len() as i64, ntr as i64, np as i64, 8]);
        put_f(&mut buf, &[fisp.tr as f64, fisp.te as f64, fisp.ti as f64]);
        put_f(&mut buf, &atoms.iter().flatten().map(|&a| a as f64).collect::<Vec<_>>());
        for p in 0..np {
            for n in 0..ntr {
                let (s, c) = (phase[n] as f64).sin_cos();
                put_f(&mut buf, &[(flip[n] * fisp.scale(n, p)) as f64, c, s, 0.0]);
            }
        }
        let (input, output) = (dir.join("fisp.in"), dir.join("fisp.out"));
        std::fs::write(&input, &buf).unwrap();
        assert!(Command::new(&exe).arg(&input).arg(&output).status().unwrap().success());
        let got = complexes(&std::fs::read(&output).unwrap());
        let n = ntr * atoms.len();
        assert_eq!(got.len(), 3 * n);
        for (i, a) in atoms.iter().enumerate() {
            let atom = AtomF64 { t1: a[0] as f64, t2: a[1] as f64, b1: a[2] as f64, b0: a[3] as f64 };
            let (mut m, mut d1, mut d2, mut m2) = (vec![[0.0; 2]; ntr], vec![[0.0; 2]; ntr], vec![[0.0; 2]; ntr], vec![[0.0; 2]; ntr]);
            fisp_derivatives(&fisp, atom, Param::T1, &mut m, &mut d1);
            fisp_derivatives(&fisp, atom, Param::T2, &mut m2, &mut d2);
            for (q, want) in [&m, &d1, &d2].into_iter().enumerate() {
                let g = &got[q * n + i * ntr..q * n + (i + 1) * ntr];
                if want.iter().all(|z| z[0] == 0.0 && z[1] == 0.0) {
                    assert!(g.iter().all(|z| z[0] == 0.0 && z[1] == 0.0), "atom {a:?}, output {q}: the reference is zero, the kernel {g:?}");
                } else {
                    worst[q] = worst[q].max(rel(g, want));
                }
            }
        }
    }
    println!(
        "FISP derivatives kernel, Ns {ns}, {ntr} TRs, {} atoms, 1 and 2 profile positions: worst per-atom relative error m {:.2e}, dm/dT1 {:.2e}, dm/dT2 {:.2e}",
        atoms.len(),
        worst[0],
        worst[1],
        worst[2]
    );
    assert!(worst.iter().all(|&e| e <= 1e-4), "{worst:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
