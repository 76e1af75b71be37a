//! qMRI simulation through the C ABI against closed forms, limits, symmetries and linearity.
//! Runs on the host backend (the CPU reference), and on CUDA with KMM_TEST_GPU=1.

mod common;
mod qmri_common;
use common::*;
use qmri_common::*;
use std::f64::consts::PI;

fn c(v: Cf) -> (f64, f64) {
    (v[0] as f64, v[1] as f64)
}

#[track_caller]
fn close(a: Cf, b: (f64, f64), tol: f64, what: &str) {
    let d = ((a[0] as f64 - b.0).powi(2) + (a[1] as f64 - b.1).powi(2)).sqrt();
    assert!(d <= tol, "{what}: got ({}, {}), want ({}, {}), |diff| = {d:e}", a[0], a[1], b.0, b.1);
}

#[test]
fn fisp_first_echo_matches_closed_form() {
    // S_1 = -i sin(alpha B1) e^{i phi} (1 - 2 e^{-TI/T1}) e^{-TE/T2} e^{2 pi i B0 TE}
    let m = Mgr::new();
    let mut seq = FispSpec::constant(3, 0.7);
    seq.phase = vec![0.3; 3];
    let atoms = [atom(0.8, 0.07, 0.9, 0.0), atom(1.5, 0.2, 1.1, 12.0), atom(0.3, 0.03, 1.0, -40.0)];
    let out = fisp(&m, &seq, &atoms);
    for (i, a) in atoms.iter().enumerate() {
        let amp = (0.7 * a[2] as f64).sin() * (1.0 - 2.0 * (-seq.ti as f64 / a[0] as f64).exp()) * (-seq.te as f64 / a[1] as f64).exp();
        let ph = 0.3 + 2.0 * PI * a[3] as f64 * seq.te as f64;
        // -i e^{i ph} amp = amp (sin ph, -cos ph)
        let want = (amp * ph.sin(), -amp * ph.cos());
        close(out[i * 3], want, 2e-6, &format!("atom {i}"));
    }
}

#[test]
fn fisp_with_vanishing_t2_reaches_the_spoiled_steady_state() {
    // T2 << TR kills every transverse state between pulses; with TE = 0 the echo is the ideal
    // spoiled (FLASH) steady state: |S| = sin(a) (1 - E1) / (1 - E1 cos a).
    let m = Mgr::new();
    let ntr = 600;
    let alpha = 0.5f64;
    let mut seq = FispSpec::constant(ntr, alpha as f32);
    seq.te = 0.0;
    let t1 = 0.6f64;
    let out = fisp(&m, &seq, &[atom(t1 as f32, 1e-6, 1.0, 0.0)]);
    let e1 = (-seq.tr as f64 / t1).exp();
    let want = alpha.sin() * (1.0 - e1) / (1.0 - e1 * alpha.cos());
    let got = (c(out[ntr - 1]).0.powi(2) + c(out[ntr - 1]).1.powi(2)).sqrt();
    assert!((got - want).abs() < 1e-5 * want.max(1e-3), "steady state {got} vs closed form {want}");
    println!("FISP spoiled steady state: simulated {got:.7}, closed form {want:.7}");
}

#[test]
fn fisp_without_relaxation_conserves_the_magnetization_of_a_single_pulse_train() {
    // T1 = T2 = Inf and 90-degree pulses: the first echo has magnitude 1 (inverted, then
    // tipped), and nothing regrows, so |S_n| never exceeds 1.
    let m = Mgr::new();
    let seq = FispSpec { max_state: 64, ..FispSpec::constant(40, std::f32::consts::FRAC_PI_2) };
    let out = fisp(&m, &seq, &[atom(f32::INFINITY, f32::INFINITY, 1.0, 0.0)]);
    close(out[0], (0.0, 1.0), 1e-6, "first echo");
    for (n, s) in out.iter().enumerate() {
        let mag = (s[0] as f64).hypot(s[1] as f64);
        assert!(mag <= 1.0 + 1e-5, "TR {n}: |S| = {mag} > 1 without relaxation");
    }
}

#[test]
fn fisp_phase_offset_rotates_the_signal_and_conjugation_symmetry_holds() {
    let m = Mgr::new();
    let base = FispSpec::mrf(200, 24);
    let a = [atom(0.9, 0.08, 0.95, 7.0)];
    let mut seq = base.clone();
    seq.phase = (0..200).map(|n| 0.1 * n as f32).collect();
    let s0 = fisp(&m, &seq, &a);
    // Constant offset c on every phase: S -> e^{ic} S.
    let cph = 0.8f32;
    let mut shifted = seq.clone();
    shifted.phase.iter_mut().for_each(|p| *p += cph);
    let s1 = fisp(&m, &shifted, &a);
    let rot: Vec<Cf> = s0
        .iter()
        .map(|v| {
            let (s, co) = cph.sin_cos();
            [v[0] * co - v[1] * s, v[0] * s + v[1] * co]
        })
        .collect();
    assert!(rel_err(&s1, &rot) < 2e-5, "phase offset: rel err {}", rel_err(&s1, &rot));
    // conj(S(phi, B0)) = S(pi - phi, -B0).
    let mut mirrored = seq.clone();
    mirrored.phase.iter_mut().for_each(|p| *p = std::f32::consts::PI - *p);
    let s2 = fisp(&m, &mirrored, &[atom(0.9, 0.08, 0.95, -7.0)]);
    let conj: Vec<Cf> = s0.iter().map(|v| [v[0], -v[1]]).collect();
    assert!(rel_err(&s2, &conj) < 2e-5, "conjugation symmetry: rel err {}", rel_err(&s2, &conj));
}

#[test]
fn fisp_b1_scales_the_flip_angles_and_profiles_add_linearly() {
    let m = Mgr::new();
    let seq = FispSpec::mrf(150, 16);
    let mut doubled = seq.clone();
    doubled.flip.iter_mut().for_each(|f| *f *= 0.8);
    let a = fisp(&m, &seq, &[atom(1.1, 0.1, 0.8, 3.0)]);
    let b = fisp(&m, &doubled, &[atom(1.1, 0.1, 1.0, 3.0)]);
    assert!(rel_err(&a, &b) < 1e-5, "B1 vs scaled flip angles: {}", rel_err(&a, &b));
    // Two profile positions sum the signals of each position alone.
    let ntr = seq.flip.len();
    let (p1, p2): (Vec<f32>, Vec<f32>) = (0..ntr).map(|n| (1.0 - 0.001 * n as f32, 0.5 + 0.0005 * n as f32)).unzip();
    let with = |prof: Vec<f32>, np: u32| FispSpec { profile: prof, nprofile: np, ..seq.clone() };
    let at = [atom(0.7, 0.05, 1.0, 0.0), atom(2.0, 0.3, 1.2, -5.0)];
    let both = fisp(&m, &with([p1.clone(), p2.clone()].concat(), 2), &at);
    let one = fisp(&m, &with(p1, 1), &at);
    let two = fisp(&m, &with(p2, 1), &at);
    let sum: Vec<Cf> = one.iter().zip(&two).map(|(x, y)| [x[0] + y[0], x[1] + y[1]]).collect();
    assert!(rel_err(&both, &sum) < 1e-6, "profile linearity: {}", rel_err(&both, &sum));
}

#[test]
fn fisp_more_states_converge() {
    // Truncating the EPG at Ns states is an approximation that converges as Ns grows.
    let m = Mgr::new();
    let at = [atom(1.0, 0.1, 1.0, 0.0)];
    let run = |ns| fisp(&m, &FispSpec::mrf(300, ns), &at);
    let (s8, s32, s64) = (run(8), run(32), run(64));
    let (e8, e32) = (rel_err(&s8, &s64), rel_err(&s32, &s64));
    assert!(e32 < e8 && e32 < 1e-3, "Ns=8: {e8:e}, Ns=32: {e32:e} against Ns=64");
    println!("FISP truncation error against Ns=64: Ns=8 {e8:.2e}, Ns=32 {e32:.2e}");
}

#[test]
fn pssfp_without_relaxation_is_a_pure_rotation() {
    // T1 = T2 = Inf, B0 = 0, one position at z = 0: inversion then rotations about x by
    // -a/2 and a per TR: S_n = i sin((n + 1/2) a).
    let m = Mgr::new();
    let alpha = 0.4f64;
    let mut seq = PssfpSpec::mrf(50, 1);
    seq.flip = vec![alpha as f32; 50];
    seq.phase = vec![0.0; 50];
    seq.z = vec![0.0];
    let out = pssfp(&m, &seq, &[atom(f32::INFINITY, f32::INFINITY, 1.0, 0.0)]);
    for (n, s) in out.iter().enumerate() {
        close(*s, (0.0, ((n as f64 + 0.5) * alpha).sin()), 2e-5, &format!("TR {n}"));
    }
}

#[test]
fn pssfp_positions_add_linearly_and_relaxation_damps() {
    let m = Mgr::new();
    let seq = PssfpSpec::mrf(120, 3);
    let at = [atom(0.8, 0.06, 1.0, 5.0), atom(1.4, 0.15, 0.9, -3.0)];
    let all = pssfp(&m, &seq, &at);
    let mut sum = vec![[0f32; 2]; all.len()];
    for &z in &seq.z {
        let one = pssfp(&m, &PssfpSpec { z: vec![z], ..seq.clone() }, &at);
        for (s, o) in sum.iter_mut().zip(&one) {
            s[0] += o[0];
            s[1] += o[1];
        }
    }
    assert!(rel_err(&all, &sum) < 1e-5, "position linearity: {}", rel_err(&all, &sum));
    for s in &all {
        assert!((s[0] as f64).hypot(s[1] as f64) <= 3.0 + 1e-4, "|S| above the number of positions");
    }
}

#[test]
fn simulations_equal_the_cpu_reference_called_directly() {
    // The ABI path (stream-ordered on the host, kernels on CUDA) against kmm::qmri::cpu.
    let m = Mgr::new();
    let atoms = grid(6, 6);
    let seq = FispSpec::mrf(200, 32);
    let got = fisp(&m, &seq, &atoms);
    let at: Vec<kmm::qmri::Atom> = atoms.iter().map(|a| kmm::qmri::Atom { t1: a[0], t2: a[1], b1: a[2], b0: a[3] }).collect();
    let mut want = vec![[0f32; 2]; got.len()];
    kmm::qmri::cpu::simulate_fisp(&seq.rust(), &at, &mut want);
    let worst = got.chunks(200).zip(want.chunks(200)).map(|(g, w)| rel_err(g, w)).fold(0.0, f64::max);
    assert!(worst < 1e-4, "FISP worst relative error per atom {worst:e}");
    let pseq = PssfpSpec::mrf(100, 3);
    let got = pssfp(&m, &pseq, &atoms);
    let mut want = vec![[0f32; 2]; got.len()];
    kmm::qmri::cpu::simulate_pssfp(&pseq.rust(), &at, &mut want);
    let worst_p = got.chunks(100).zip(want.chunks(100)).map(|(g, w)| rel_err(g, w)).fold(0.0, f64::max);
    assert!(worst_p < 1e-4, "pSSFP worst relative error per atom {worst_p:e}");
    println!("ABI vs CPU reference ({} atoms): FISP {worst:.2e}, pSSFP {worst_p:.2e}", atoms.len());
}
