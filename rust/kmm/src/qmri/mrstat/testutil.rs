//! Test helpers: sequences, tissues, a small deterministic random generator, error measures.

use super::{AtomF64, Param};
use crate::qmri::{Fisp, Pssfp};

/// A FISP train of the kind MRF uses (as `FispSpec::mrf` of the integration tests): smooth
/// flip-angle sweeps between 0.05 and 1.25 rad, TR 8.7 ms, TE 3.5 ms, TI 15 ms.
pub fn mrf_fisp(ntr: usize, max_state: u32) -> Fisp {
    let flip = (0..ntr).map(|n| (n as f32 / 40.0).sin().abs() * 1.2 + 0.05).collect();
    Fisp { flip, phase: vec![0.0; ntr], tr: 0.0087, te: 0.0035, ti: 0.015, max_state, profile: vec![] }
}

/// A pSSFP train (as `PssfpSpec::mrf` of the integration tests): 10 RF sub-steps, `nz` slice positions.
pub fn mrf_pssfp(ntr: usize, nz: usize) -> Pssfp {
    let flip = (0..ntr).map(|n| (n as f32 / 30.0).sin().abs() * 1.0 + 0.05).collect();
    let nrf = 10;
    let z = (0..nz).map(|i| (i as f32 - (nz as f32 - 1.0) / 2.0) * 0.05).collect();
    Pssfp {
        flip,
        phase: vec![0.0; ntr],
        rf_shape: vec![1.0 / nrf as f32; nrf],
        z,
        dt_ex: 1e-4,
        dt_inv: 0.015,
        dt_pr: 0.002,
        gz_ex: 2.0,
        gz_pr: -10.0,
    }
}

/// Tissues spanning T1 0.3..4 s, T2 0.03..2 s, B1 0.8..1.2, B0 -20..20 Hz.
pub fn test_atoms() -> Vec<AtomF64> {
    vec![
        AtomF64 { t1: 0.3, t2: 0.03, b1: 0.8, b0: -20.0 },
        AtomF64 { t1: 0.78, t2: 0.065, b1: 1.0, b0: 3.5 },
        AtomF64 { t1: 1.1, t2: 0.1, b1: 1.1, b0: -7.0 },
        AtomF64 { t1: 2.2, t2: 0.5, b1: 0.9, b0: 12.0 },
        AtomF64 { t1: 4.0, t2: 2.0, b1: 1.2, b0: 20.0 },
    ]
}

/// max |a - b| / max |b| over complex (re, im) vectors.
pub fn rel_err(a: &[[f64; 2]], b: &[[f64; 2]]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (x[0] - y[0]).hypot(x[1] - y[1])).fold(0.0, f64::max);
    let den = b.iter().map(|y| y[0].hypot(y[1])).fold(0.0, f64::max);
    num / den
}

/// The step of a central difference in parameter `p` at `a`.
pub fn fd_step(a: AtomF64, p: Param) -> f64 {
    match p {
        Param::B0 => 1e-4,
        _ => 1e-5 * a.get(p),
    }
}

/// Checks AD derivatives (`deriv`) against central differences of `eval` for every test atom
/// and parameter; returns the worst relative error per parameter (T1, T2, B1, B0), asserting
/// each is at most 1e-5 (the brief asks 1e-3).
pub fn check_derivatives(
    ntr: usize,
    deriv: impl Fn(AtomF64, Param, &mut [[f64; 2]], &mut [[f64; 2]]),
    eval: impl Fn(AtomF64, &mut [[f64; 2]]),
) -> [f64; 4] {
    let params = [Param::T1, Param::T2, Param::B1, Param::B0];
    let mut worst = [0.0f64; 4];
    for a in test_atoms() {
        let mut m0 = vec![[0.0; 2]; ntr];
        eval(a, &mut m0);
        for (i, &p) in params.iter().enumerate() {
            let (mut m, mut dm) = (vec![[0.0; 2]; ntr], vec![[0.0; 2]; ntr]);
            deriv(a, p, &mut m, &mut dm);
            assert_eq!(m, m0, "the value part of the dual evaluation must equal the f64 evaluation");
            let h = fd_step(a, p);
            let (mut mp, mut mm) = (vec![[0.0; 2]; ntr], vec![[0.0; 2]; ntr]);
            eval(a.with(p, a.get(p) + h), &mut mp);
            eval(a.with(p, a.get(p) - h), &mut mm);
            let fd: Vec<[f64; 2]> = mp.iter().zip(&mm).map(|(x, y)| [(x[0] - y[0]) / (2.0 * h), (x[1] - y[1]) / (2.0 * h)]).collect();
            let e = rel_err(&dm, &fd);
            assert!(e <= 1e-5, "atom {a:?}, d/d{p:?}: relative error {e:.3e}");
            worst[i] = worst[i].max(e);
        }
    }
    worst
}

/// SplitMix64: a small deterministic generator for random test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// A complex number with re, im uniform in [-1, 1).
    pub fn c(&mut self) -> [f64; 2] {
        [self.uniform(-1.0, 1.0), self.uniform(-1.0, 1.0)]
    }
    pub fn cvec(&mut self, n: usize) -> Vec<[f64; 2]> {
        (0..n).map(|_| self.c()).collect()
    }
}
