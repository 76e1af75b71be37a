//! The CPU reference: the same physics as the GPU kernels, in f64, one atom per rayon task.
//! It runs the host backend and is the oracle of the GPU tests.

use super::{Atom, Fisp, Pssfp};
use rayon::prelude::*;
use std::f64::consts::PI;
use std::ops::{Add, Mul, Sub};

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct C64 {
    pub re: f64,
    pub im: f64,
}

impl C64 {
    pub const ZERO: C64 = C64 { re: 0.0, im: 0.0 };
    pub fn new(re: f64, im: f64) -> C64 {
        C64 { re, im }
    }
    pub fn cis(theta: f64) -> C64 {
        let (s, c) = theta.sin_cos();
        C64 { re: c, im: s }
    }
    pub fn conj(self) -> C64 {
        C64 { re: self.re, im: -self.im }
    }
    pub fn scale(self, k: f64) -> C64 {
        C64 { re: self.re * k, im: self.im * k }
    }
    pub fn norm_sqr(self) -> f64 {
        self.re * self.re + self.im * self.im
    }
    /// Multiplication by i.
    pub fn mul_i(self) -> C64 {
        C64 { re: -self.im, im: self.re }
    }
}
impl Add for C64 {
    type Output = C64;
    fn add(self, o: C64) -> C64 {
        C64 { re: self.re + o.re, im: self.im + o.im }
    }
}
impl Sub for C64 {
    type Output = C64;
    fn sub(self, o: C64) -> C64 {
        C64 { re: self.re - o.re, im: self.im - o.im }
    }
}
impl Mul for C64 {
    type Output = C64;
    fn mul(self, o: C64) -> C64 {
        C64 { re: self.re * o.re - self.im * o.im, im: self.re * o.im + self.im * o.re }
    }
}

/// exp(-dt / t), with t = +Inf giving 1.
fn relax(dt: f32, t: f32) -> f64 {
    (-(dt as f64) / t as f64).exp()
}

/// EPG FISP of one atom: writes `ntr` samples (summed over profile positions) into `out`.
pub fn fisp_atom(seq: &Fisp, atom: Atom, out: &mut [[f32; 2]]) {
    let ntr = seq.ntr();
    let ns = seq.max_state as usize;
    let (e1te, e2te) = (relax(seq.te, atom.t1), relax(seq.te, atom.t2));
    let (e1r, e2r) = (relax(seq.tr - seq.te, atom.t1), relax(seq.tr - seq.te, atom.t2));
    let (e1ti, e2ti) = (relax(seq.ti, atom.t1), relax(seq.ti, atom.t2));
    let rot_te = C64::cis(2.0 * PI * atom.b0 as f64 * seq.te as f64).scale(e2te);
    let rot_r = C64::cis(2.0 * PI * atom.b0 as f64 * (seq.tr - seq.te) as f64).scale(e2r);
    let mut acc = vec![C64::ZERO; ntr];
    let mut f = vec![C64::ZERO; ns]; // F+(k)
    let mut g = vec![C64::ZERO; ns]; // conj(F-(k))
    let mut z = vec![C64::ZERO; ns]; // Z(k)
    for p in 0..seq.positions() {
        f.fill(C64::ZERO);
        g.fill(C64::ZERO);
        z.fill(C64::ZERO);
        // Adiabatic inversion of Z(0) = 1, then relaxation over TI.
        z[0] = C64::new(-1.0, 0.0);
        for k in 0..ns {
            f[k] = f[k].scale(e2ti);
            g[k] = g[k].scale(e2ti);
            z[k] = z[k].scale(e1ti);
        }
        z[0].re += 1.0 - e1ti;
        for n in 0..ntr {
            let alpha = seq.flip[n] as f64 * seq.scale(n, p) as f64 * atom.b1 as f64;
            excite(&mut f, &mut g, &mut z, alpha, seq.phase[n] as f64);
            for k in 0..ns {
                f[k] = f[k] * rot_te;
                g[k] = g[k] * rot_te.conj();
                z[k] = z[k].scale(e1te);
            }
            z[0].re += 1.0 - e1te;
            acc[n] = acc[n] + f[0];
            for k in 0..ns {
                f[k] = f[k] * rot_r;
                g[k] = g[k] * rot_r.conj();
                z[k] = z[k].scale(e1r);
            }
            z[0].re += 1.0 - e1r;
            dephase(&mut f, &mut g);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = [a.re as f32, a.im as f32];
    }
}

/// The EPG RF transition matrix (Weigel 2015) for flip angle `alpha` and phase `phi`.
fn excite(f: &mut [C64], g: &mut [C64], z: &mut [C64], alpha: f64, phi: f64) {
    let (sx, cx) = (alpha / 2.0).sin_cos();
    let (c2, s2, sa, ca) = (cx * cx, sx * sx, alpha.sin(), alpha.cos());
    let e = C64::cis(phi);
    let e2 = e * e;
    for k in 0..f.len() {
        let (a, b, c) = (f[k], g[k], z[k]);
        // F+' = c2 F+ + e^{2i phi} s2 conj(F-) - i e^{i phi} sin(a) Z
        f[k] = a.scale(c2) + (e2 * b).scale(s2) - (e * c).mul_i().scale(sa);
        // conj(F-)' = e^{-2i phi} s2 F+ + c2 conj(F-) + i e^{-i phi} sin(a) Z
        g[k] = (e2.conj() * a).scale(s2) + b.scale(c2) + (e.conj() * c).mul_i().scale(sa);
        // Z' = -i/2 e^{-i phi} sin(a) F+ + i/2 e^{i phi} sin(a) conj(F-) + cos(a) Z
        z[k] = (e * b - e.conj() * a).mul_i().scale(sa / 2.0) + c.scale(ca);
    }
}

/// One unit of gradient dephasing: F+ states move up, conj(F-) states down, F+(0) = conj(F-(0)).
fn dephase(f: &mut [C64], g: &mut [C64]) {
    let ns = f.len();
    for k in 0..ns - 1 {
        g[k] = g[k + 1];
    }
    g[ns - 1] = C64::ZERO;
    for k in (1..ns).rev() {
        f[k] = f[k - 1];
    }
    f[0] = g[0].conj();
}

/// Isochromat pSSFP of one atom, summed over slice positions.
pub fn pssfp_atom(seq: &Pssfp, atom: Atom, out: &mut [[f32; 2]]) {
    let ntr = seq.ntr();
    let (b1, b0) = (atom.b1 as f64, atom.b0 as f64);
    let (e1ex, e2ex) = (relax(seq.dt_ex, atom.t1), relax(seq.dt_ex, atom.t2));
    let (e1pr, e2pr) = (relax(seq.dt_pr, atom.t1), relax(seq.dt_pr, atom.t2));
    let e1inv = relax(seq.dt_inv, atom.t1);
    let mut acc = vec![C64::ZERO; ntr];
    let excite = |m: &mut [f64; 3], rf: C64, z: f64| {
        for &w in &seq.rf_shape {
            let step = rf.scale(w as f64);
            let axis = [step.re * b1, -step.im * b1, -(seq.gz_ex as f64 * z) - seq.dt_ex as f64 * 2.0 * PI * b0];
            rodrigues(m, axis);
            decay_regrow(m, e1ex, e2ex);
        }
    };
    let precess = |m: &mut [f64; 3], gz_area: f64, z: f64| {
        let theta = -gz_area * z - seq.dt_pr as f64 * 2.0 * PI * b0;
        rot_xy(m, theta);
        decay_regrow(m, e1pr, e2pr);
    };
    for &z in &seq.z {
        let z = z as f64;
        // Inversion (B1-dependent, transverse spoiled), relaxation over the inversion delay.
        let mut m = [0.0, 0.0, (PI * b1).cos()];
        m[2] = m[2] * e1inv + (1.0 - e1inv);
        // alpha/2 prepulse, then slice refocusing + prephaser until the first RF.
        let rf0 = C64::cis(seq.phase[0] as f64).scale(-(seq.flip[0] as f64) / 2.0);
        excite(&mut m, rf0, z);
        precess(&mut m, 2.0 * seq.gz_pr as f64, z);
        for n in 0..ntr {
            let rf = C64::cis(seq.phase[n] as f64).scale(seq.flip[n] as f64);
            excite(&mut m, rf, z);
            precess(&mut m, seq.gz_pr as f64, z);
            acc[n] = acc[n] + C64::new(m[0], m[1]);
            precess(&mut m, seq.gz_pr as f64, z);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = [a.re as f32, a.im as f32];
    }
}

/// Rotation about `axis` by its norm (Rodrigues' formula).
fn rodrigues(m: &mut [f64; 3], a: [f64; 3]) {
    let theta = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
    if theta == 0.0 {
        return;
    }
    let k = [a[0] / theta, a[1] / theta, a[2] / theta];
    let (s, c) = theta.sin_cos();
    let cross = [k[1] * m[2] - k[2] * m[1], k[2] * m[0] - k[0] * m[2], k[0] * m[1] - k[1] * m[0]];
    let dot = k[0] * m[0] + k[1] * m[1] + k[2] * m[2];
    for i in 0..3 {
        m[i] = c * m[i] + s * cross[i] + dot * (1.0 - c) * k[i];
    }
}

/// Rotation in the transverse plane by `theta` (counterclockwise, the sense of a positive z axis).
fn rot_xy(m: &mut [f64; 3], theta: f64) {
    let (s, c) = theta.sin_cos();
    let (x, y) = (m[0], m[1]);
    m[0] = c * x - s * y;
    m[1] = s * x + c * y;
}

fn decay_regrow(m: &mut [f64; 3], e1: f64, e2: f64) {
    m[0] *= e2;
    m[1] *= e2;
    m[2] = m[2] * e1 + (1.0 - e1);
}

/// Simulates every atom; `out` is `ntr x atoms.len()` complex values as (re, im) pairs.
pub fn simulate_fisp(seq: &Fisp, atoms: &[Atom], out: &mut [[f32; 2]]) {
    let ntr = seq.ntr();
    out.par_chunks_mut(ntr).zip(atoms.par_iter()).for_each(|(o, &a)| fisp_atom(seq, a, o));
}

pub fn simulate_pssfp(seq: &Pssfp, atoms: &[Atom], out: &mut [[f32; 2]]) {
    let ntr = seq.ntr();
    out.par_chunks_mut(ntr).zip(atoms.par_iter()).for_each(|(o, &a)| pssfp_atom(seq, a, o));
}

/// The best atom of one voxel.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Match {
    /// The best atom, or -1 when no atom matches: a zero or non-finite signal, or a dictionary
    /// whose atoms are all zero or non-finite.
    pub index: i32,
    /// |d^H x| / (||d|| ||x||): 1 for a perfect match, 0 when nothing matches.
    pub score: f32,
    /// d^H x / ||d||: the proton density relative to the normalised atom.
    pub pd: [f32; 2],
}

/// ||c|| of each `n`-long column of `cols`, in f64.
pub fn column_norms(cols: &[[f32; 2]], n: usize) -> Vec<f64> {
    cols.par_chunks(n).map(|c| c.iter().map(|z| (z[0] as f64).powi(2) + (z[1] as f64).powi(2)).sum::<f64>().sqrt()).collect()
}

/// Matches each voxel signal (columns of `signals`, `ntr` long) against the dictionary columns.
/// Zero and non-finite atoms never match. The first of equal scores wins.
pub fn match_dictionary(dict: &[[f32; 2]], ntr: usize, signals: &[[f32; 2]]) -> Vec<Match> {
    match_columns(dict, ntr, signals, &column_norms(dict, ntr), &column_norms(signals, ntr))
}

/// Matching on `k`-long columns: the data themselves, or their coordinates in an orthonormal
/// basis (compressed matching). `dict_norms` are the norms of these atom columns;
/// `signal_norms` those of the uncompressed signals, so that a score is the cosine between the
/// whole signal and the (projected) atom, comparable between dictionary batches and bases.
pub fn match_columns(dict: &[[f32; 2]], k: usize, signals: &[[f32; 2]], dict_norms: &[f64], signal_norms: &[f64]) -> Vec<Match> {
    // 1/||d||, 0 for zero and non-finite atoms (their scores are then 0 and never win).
    let inv: Vec<f64> = dict_norms.iter().map(|&n| if n > 0.0 && n.is_finite() { 1.0 / n } else { 0.0 }).collect();
    signals
        .par_chunks(k)
        .zip(signal_norms.par_iter())
        .map(|(x, &xnorm)| {
            // Only a strictly positive score matches: a zero signal, or one with NaN, matches nothing.
            let mut best = (0.0f32, -1i64, C64::ZERO);
            for (j, d) in dict.chunks(k).enumerate() {
                let mut dot = C64::ZERO;
                for (a, b) in d.iter().zip(x) {
                    // conj(a) * b
                    dot.re += a[0] as f64 * b[0] as f64 + a[1] as f64 * b[1] as f64;
                    dot.im += a[0] as f64 * b[1] as f64 - a[1] as f64 * b[0] as f64;
                }
                let c = dot.scale(inv[j]);
                // Compared as reported (f32), as a batch's best is compared with the best of the
                // batches before it: atoms equal in f32 go to the lower index whether the
                // dictionary is matched whole or in batches.
                let s = (c.norm_sqr().sqrt() / xnorm) as f32;
                if s > best.0 {
                    best = (s, j as i64, c);
                }
            }
            let score = best.0;
            if best.1 < 0 || !score.is_finite() {
                return Match { index: -1, score: 0.0, pd: [0.0; 2] };
            }
            Match { index: best.1 as i32, score, pd: [best.2.re as f32, best.2.im as f32] }
        })
        .collect()
}
