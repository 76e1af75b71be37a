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
        // 2.8: flips past pi.
        for b1 in [0.7f32, 1.0, 1.2, 2.8] {
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
        // Quadratic (RF spoiling): a linear ramp alone is an off-resonance the signal does not see.
        seq.phase = (0..ntr).map(|n| 0.05 * n as f32 + 0.011 * (n * n) as f32).collect();
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
    // Ns 32 on every lane count, and Ns 64 on 2 lanes (32 states a thread, the layout of large
    // dictionaries at Ns 64).
    for (ns, lane_counts) in [(32u32, &[1u32, 2, 4, 8, 16, 32][..]), (64, &[2][..])] {
        let seq = FispSpec::mrf(300, ns);
        let mut want = vec![[0f32; 2]; params.len() * 300];
        cpu::simulate_fisp(&seq.rust(), &atoms_of(&params), &mut want);
        for &lanes in lane_counts {
            std::env::set_var("KMM_FISP_LANES", lanes.to_string());
            let got = fisp(&m, &seq, &params);
            std::env::remove_var("KMM_FISP_LANES");
            let w = worst(&got, &want, 300);
            println!("FISP Ns {ns} with {lanes} lanes per atom: worst relative error {w:.2e}");
            assert!(w < 1e-4, "Ns {ns}, {lanes} lanes: {w:e}");
        }
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
    // B0 barely changes a spoiled FISP signal's magnitude: atoms differing only in B0 are ties
    // at float32 resolution, so this grid varies T1, T2 and B1 only.
    let params: Vec<[f32; 4]> = wide_grid().into_iter().filter(|a| a[3] == 0.0).collect();
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
    // Float32 GEMM resolves scores to about 1e-6: atoms whose f64 scores differ by less (here:
    // atoms differing only in B0 at the shortest T2, whose signals B0 barely touches) are ties
    // at that resolution and may go either way. Every other voxel must match exactly.
    let f64_score = |j: usize, v: usize| -> f64 {
        let d = &dict[j * ntr..(j + 1) * ntr];
        let x = &signals[v * ntr..(v + 1) * ntr];
        let (mut re, mut im, mut dd, mut xx) = (0f64, 0f64, 0f64, 0f64);
        for (a, b) in d.iter().zip(x) {
            let (a0, a1, b0, b1) = (a[0] as f64, a[1] as f64, b[0] as f64, b[1] as f64);
            re += a0 * b0 + a1 * b1;
            im += a0 * b1 - a1 * b0;
            dd += a0 * a0 + a1 * a1;
            xx += b0 * b0 + b1 * b1;
        }
        (re * re + im * im).sqrt() / (dd.sqrt() * xx.sqrt())
    };
    let mut ties = 0;
    for (v, &j) in picks.iter().enumerate() {
        assert_eq!(want[v].index as usize, j, "voxel {v}: the CPU reference must recover its atom");
        let g = got.index[v] as usize;
        if g != j {
            let (best, chosen) = (f64_score(j, v), f64_score(g, v));
            assert!(best - chosen < 2e-6 * best, "voxel {v}: GPU chose {g} (f64 score {chosen}) over {j} ({best})");
            ties += 1;
            continue;
        }
        assert!((got.score[v] - want[v].score).abs() < 1e-4);
        assert_eq!(got.params[v], params[j]);
    }
    println!("GPU matching: {} voxels, {ties} float32 near-ties resolved to an equally scoring atom", picks.len());
    assert!(ties * 50 <= picks.len(), "{ties} near-ties of {} voxels", picks.len());
    let compressed = match_signals(&m, &dict, ntr, &params, &signals, 20);
    let same = compressed.index.iter().zip(&picks).filter(|(a, b)| **a as usize == **b).count();
    println!("GPU matching, rank 20: {same} of {} exact", picks.len());
    assert!(same + ties >= picks.len(), "rank-20 compression lost noiseless matches");
}

/// Matchings on several managers at once, from several threads, share the device's idle cuBLAS
/// handles (and so their workspaces): each user's work with a handle must follow the previous
/// user's on the device. Every run must give the answer one manager alone gives.
#[test]
fn concurrent_matchings_share_cublas_handles_in_order() {
    if !gpu() {
        return;
    }
    let ntr = 300;
    let seq = FispSpec::mrf(ntr, 24);
    let params: Vec<[f32; 4]> = wide_grid().into_iter().filter(|a| a[3] == 0.0).collect();
    let solo = Mgr::new();
    let dict = fisp(&solo, &seq, &params);
    let signals = dict.clone();
    let want = match_signals(&solo, &dict, ntr, &params, &signals, 0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (dict, signals, params, want) = (&dict, &signals, &params, &want);
            s.spawn(move || {
                let m = Mgr::new();
                for round in 0..6 {
                    let got = match_signals(&m, dict, ntr, params, signals, 0);
                    assert_eq!(got.index, want.index, "thread {t}, round {round}: matching differs from one manager alone");
                }
            });
        }
    });
}
