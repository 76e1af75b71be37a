//! The CUDA qMRI kernels against the CPU reference (KMM_TEST_GPU=1; skipped otherwise):
//! FISP and pSSFP within 1e-4 relative per atom (||gpu - cpu|| / ||cpu||), matching indices
//! identical on noiseless data.

mod common;
mod qmri_common;
use common::*;
use kmm::qmri::{cpu, Atom};
use qmri_common::*;

fn atoms_of(p: &[[f32; 4]]) -> Vec<Atom> {
    p.iter().map(|a| Atom { t1: a[0], t2: a[1], b1: a[2], b0: a[3] }).collect()
}

/// A grid over T1, T2, B1 and B0.
fn wide_grid() -> Vec<[f32; 4]> {
    let mut v = Vec::new();
    for a in grid(10, 10) {
        for b1 in [0.7f32, 1.0, 1.2] {
            for b0 in [-20.0f32, 0.0, 13.0] {
                v.push([a[0], a[1], b1, b0]);
            }
        }
    }
    v
}

fn worst(got: &[Cf], want: &[Cf], ntr: usize) -> f64 {
    got.chunks(ntr).zip(want.chunks(ntr)).map(|(g, w)| rel_err(g, w)).fold(0.0, f64::max)
}

#[test]
fn fisp_on_the_gpu_equals_the_cpu_reference() {
    if !gpu() {
        eprintln!("skipped: set KMM_TEST_GPU=1 to run on a GPU");
        return;
    }
    let m = Mgr::new();
    let params = wide_grid();
    for (ntr, ns, nprof) in [(500usize, 32u32, 0u32), (300, 5, 0), (200, 64, 3), (100, 1, 0), (150, 17, 2)] {
        let mut seq = FispSpec::mrf(ntr, ns);
        seq.phase = (0..ntr).map(|n| 0.05 * n as f32).collect();
        if nprof > 0 {
            seq.nprofile = nprof;
            seq.profile = (0..ntr * nprof as usize).map(|i| 0.6 + 0.4 * ((i % ntr) as f32 / ntr as f32) + 0.1 * (i / ntr) as f32).collect();
        }
        let got = fisp(&m, &seq, &params);
        let mut want = vec![[0f32; 2]; got.len()];
        cpu::simulate_fisp(&seq.rust(), &atoms_of(&params), &mut want);
        let w = worst(&got, &want, ntr);
        println!("FISP ntr {ntr} Ns {ns} profile {nprof}: {} atoms, worst relative error {w:.2e}", params.len());
        assert!(w < 1e-4, "FISP ntr {ntr} Ns {ns}: worst relative error {w:e}");
    }
}

#[test]
fn fisp_is_the_same_for_every_lane_count() {
    if !gpu() {
        return;
    }
    let m = Mgr::new();
    let params = grid(8, 8);
    let seq = FispSpec::mrf(300, 32);
    let mut want = vec![[0f32; 2]; params.len() * 300];
    cpu::simulate_fisp(&seq.rust(), &atoms_of(&params), &mut want);
    for lanes in [1, 2, 4, 8, 16, 32] {
        std::env::set_var("KMM_FISP_LANES", lanes.to_string());
        let got = fisp(&m, &seq, &params);
        std::env::remove_var("KMM_FISP_LANES");
        let w = worst(&got, &want, 300);
        println!("FISP Ns 32 with {lanes} lanes per atom: worst relative error {w:.2e}");
        assert!(w < 1e-4, "{lanes} lanes: {w:e}");
    }
}

#[test]
fn pssfp_on_the_gpu_equals_the_cpu_reference() {
    if !gpu() {
        return;
    }
    let m = Mgr::new();
    let params = wide_grid();
    let seq = PssfpSpec::mrf(300, 5);
    let got = pssfp(&m, &seq, &params);
    let mut want = vec![[0f32; 2]; got.len()];
    cpu::simulate_pssfp(&seq.rust(), &atoms_of(&params), &mut want);
    let w = worst(&got, &want, 300);
    println!("pSSFP: {} atoms, worst relative error {w:.2e}", params.len());
    assert!(w < 1e-4, "pSSFP worst relative error {w:e}");
}

#[test]
fn gpu_matching_indices_equal_the_cpu_reference() {
    if !gpu() {
        return;
    }
    let m = Mgr::new();
    let ntr = 400;
    let seq = FispSpec::mrf(ntr, 24);
    let params = wide_grid();
    let dict = fisp(&m, &seq, &params);
    let natoms = params.len();
    let picks: Vec<usize> = (0..natoms).step_by(3).collect();
    let mut signals = Vec::new();
    for &j in &picks {
        let pd = [0.7 + 0.001 * j as f32, 0.2];
        for d in &dict[j * ntr..(j + 1) * ntr] {
            signals.push([pd[0] * d[0] - pd[1] * d[1], pd[0] * d[1] + pd[1] * d[0]]);
        }
    }
    let want = cpu::match_dictionary(&dict, ntr, &signals);
    // Small scratch budget: many chunks.
    std::env::set_var("KMM_MATCH_SCRATCH_BYTES", (natoms * 8 * 37).to_string());
    let got = match_signals(&m, &dict, ntr, &params, &signals, 0);
    std::env::remove_var("KMM_MATCH_SCRATCH_BYTES");
    for (v, &j) in picks.iter().enumerate() {
        assert_eq!(got.index[v], want[v].index, "voxel {v}: GPU {} CPU {}", got.index[v], want[v].index);
        assert_eq!(got.index[v] as usize, j, "voxel {v}");
        assert!((got.score[v] - want[v].score).abs() < 1e-4);
        assert_eq!(got.params[v], params[j]);
    }
    let compressed = match_signals(&m, &dict, ntr, &params, &signals, 20);
    let same = compressed.index.iter().zip(&picks).filter(|(a, b)| **a as usize == **b).count();
    println!("GPU matching: {} voxels exact uncompressed; rank 20: {same} exact", picks.len());
    assert_eq!(same, picks.len(), "rank-20 compression lost noiseless matches");
}
