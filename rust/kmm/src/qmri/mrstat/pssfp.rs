//! pSSFP echo magnetization and its exact derivatives (forward-mode AD).
//!
//! The recurrence is that of [`crate::qmri::cpu::pssfp_atom`] (isochromats, BlochSimulators.jl's
//! pSSFP2D: B1-scaled inversion cos(π B1), inversion delay, α/2 prepulse of opposite sign, RF in
//! hard-pulse sub-steps about the axis (B1 Re rf, -B1 Im rf, -gz_ex z - 2π B0 dt_ex), balanced
//! precession by -gz z - 2π B0 dt_pr, the sample m_x + i m_y at TE, summed over slice
//! positions z), written once over a generic [`Real`] scalar: at `f64` it is the plain f64
//! evaluation, at [`Dual`] it carries dm/dθ along. The derivatives are exact (automatic
//! differentiation), not finite differences.

use super::dual::{relax, Cx, Dual, Real};
use super::{each_atom, each_atom_with_derivative, AtomF64, Param};
use crate::error::Result;
use crate::qmri::cpu::C64;
use crate::qmri::Pssfp;
use std::f64::consts::PI;

/// The echo magnetization of one tissue with parameters (T1, T2, B1, B0) over scalar `T`.
fn pssfp_generic<T: Real>(seq: &Pssfp, t1: T, t2: T, b1: T, b0: T, out: &mut [Cx<T>]) {
    let ntr = seq.ntr();
    let (dt_ex, dt_pr) = (seq.dt_ex as f64, seq.dt_pr as f64);
    let (e1ex, e2ex) = (relax(dt_ex, t1), relax(dt_ex, t2));
    let (e1pr, e2pr) = (relax(dt_pr, t1), relax(dt_pr, t2));
    let e1inv = relax(seq.dt_inv as f64, t1);
    let one = T::cst(1.0);
    out.fill(Cx::zero());
    let excite = |m: &mut [T; 3], rf: C64, z: f64| {
        for &w in &seq.rf_shape {
            let step = rf.scale(w as f64);
            let axis = [b1.scale(step.re), b1.scale(-step.im), T::cst(-(seq.gz_ex as f64 * z)) - b0.scale(dt_ex * 2.0 * PI)];
            rodrigues(m, axis);
            decay_regrow(m, e1ex, e2ex);
        }
    };
    let precess = |m: &mut [T; 3], gz_area: f64, z: f64| {
        let theta = T::cst(-gz_area * z) - b0.scale(dt_pr * 2.0 * PI);
        rot_xy(m, theta);
        decay_regrow(m, e1pr, e2pr);
    };
    for &z in &seq.z {
        let z = z as f64;
        // Inversion (B1-dependent, transverse spoiled), relaxation over the inversion delay.
        let mut m = [T::cst(0.0), T::cst(0.0), b1.scale(PI).cos()];
        m[2] = m[2] * e1inv + (one - e1inv);
        // alpha/2 prepulse, then slice refocusing + prephaser until the first RF.
        let rf0 = C64::cis(seq.phase[0] as f64).scale(-(seq.flip[0] as f64) / 2.0);
        excite(&mut m, rf0, z);
        precess(&mut m, 2.0 * seq.gz_pr as f64, z);
        for n in 0..ntr {
            let rf = C64::cis(seq.phase[n] as f64).scale(seq.flip[n] as f64);
            excite(&mut m, rf, z);
            precess(&mut m, seq.gz_pr as f64, z);
            out[n] = out[n] + Cx::new(m[0], m[1]);
            precess(&mut m, seq.gz_pr as f64, z);
        }
    }
}

/// Rotation of `m` about `a` by the angle |a| (Rodrigues' formula). Where |a| = 0 in value (a
/// has at most a derivative part) the rotation is m + a × m, exact to first order, so that the
/// derivative through a vanishing rotation is a' × m rather than a division by zero.
fn rodrigues<T: Real>(m: &mut [T; 3], a: [T; 3]) {
    let u = a[0] * a[0] + a[1] * a[1] + a[2] * a[2];
    if u.value() == 0.0 {
        let cross = [a[1] * m[2] - a[2] * m[1], a[2] * m[0] - a[0] * m[2], a[0] * m[1] - a[1] * m[0]];
        for i in 0..3 {
            m[i] = m[i] + cross[i];
        }
        return;
    }
    let theta = u.sqrt();
    let k = [a[0] / theta, a[1] / theta, a[2] / theta];
    let (s, c) = theta.sin_cos();
    let cross = [k[1] * m[2] - k[2] * m[1], k[2] * m[0] - k[0] * m[2], k[0] * m[1] - k[1] * m[0]];
    let dot = k[0] * m[0] + k[1] * m[1] + k[2] * m[2];
    let one_c = T::cst(1.0) - c;
    for i in 0..3 {
        m[i] = c * m[i] + s * cross[i] + dot * one_c * k[i];
    }
}

/// Rotation in the transverse plane by `theta` (counterclockwise, the sense of a positive z axis).
fn rot_xy<T: Real>(m: &mut [T; 3], theta: T) {
    let (s, c) = theta.sin_cos();
    let (x, y) = (m[0], m[1]);
    m[0] = c * x - s * y;
    m[1] = s * x + c * y;
}

fn decay_regrow<T: Real>(m: &mut [T; 3], e1: T, e2: T) {
    m[0] = m[0] * e2;
    m[1] = m[1] * e2;
    m[2] = m[2] * e1 + (T::cst(1.0) - e1);
}

/// The pSSFP echo magnetization of one tissue in f64, `ntr` (re, im) values into `m`. Equals
/// [`crate::qmri::cpu::pssfp_atom`] (which rounds its f64 result to f32) up to that rounding.
/// Panics if `m` does not hold `seq.ntr()` values.
pub fn pssfp_f64(seq: &Pssfp, atom: impl Into<AtomF64>, m: &mut [[f64; 2]]) {
    let a = atom.into();
    assert_eq!(m.len(), seq.ntr(), "pssfp_f64: m must hold seq.ntr() values");
    let mut out = vec![Cx::<f64>::zero(); seq.ntr()];
    pssfp_generic(seq, a.t1, a.t2, a.b1, a.b0, &mut out);
    for (o, c) in m.iter_mut().zip(&out) {
        *o = [c.re, c.im];
    }
}

/// The pSSFP echo magnetization m of one tissue and its exact derivative dm/dθ with respect to
/// `wrt` (forward-mode automatic differentiation, one pass): `ntr` (re, im) values each.
/// Units of dm/dθ: per second for T1 and T2, per unit B1, per Hz for B0.
/// Panics if `m` or `dm` does not hold `seq.ntr()` values.
pub fn pssfp_derivatives(seq: &Pssfp, atom: impl Into<AtomF64>, wrt: Param, m: &mut [[f64; 2]], dm: &mut [[f64; 2]]) {
    let a = atom.into();
    assert_eq!(m.len(), seq.ntr(), "pssfp_derivatives: m must hold seq.ntr() values");
    assert_eq!(dm.len(), seq.ntr(), "pssfp_derivatives: dm must hold seq.ntr() values");
    let d = |p: Param| if p == wrt { Dual::var(a.get(p)) } else { Dual::cst(a.get(p)) };
    let mut out = vec![Cx::<Dual>::zero(); seq.ntr()];
    pssfp_generic(seq, d(Param::T1), d(Param::T2), d(Param::B1), d(Param::B0), &mut out);
    for ((mo, dmo), c) in m.iter_mut().zip(dm.iter_mut()).zip(&out) {
        *mo = c.value_pair();
        *dmo = c.deriv_pair();
    }
}

/// [`pssfp_f64`] of every atom (rayon), `m` is `ntr x atoms.len()`, TR fastest.
pub fn simulate_pssfp_f64(seq: &Pssfp, atoms: &[AtomF64], m: &mut [[f64; 2]]) -> Result<()> {
    seq.validate()?;
    each_atom(seq.ntr(), atoms, m, |a, o| pssfp_f64(seq, a, o))
}

/// [`pssfp_derivatives`] of every atom (rayon): `m` and `dm` are `ntr x atoms.len()`, TR fastest.
pub fn pssfp_derivatives_batch(seq: &Pssfp, atoms: &[AtomF64], wrt: Param, m: &mut [[f64; 2]], dm: &mut [[f64; 2]]) -> Result<()> {
    seq.validate()?;
    each_atom_with_derivative(seq.ntr(), atoms, m, dm, |a, mo, dmo| pssfp_derivatives(seq, a, wrt, mo, dmo))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::qmri::{cpu, Atom};

    /// The f64 evaluation equals the existing reference (which returns f32) to 1e-6 relative.
    #[test]
    fn pssfp_f64_matches_cpu_reference() {
        let seq = mrf_pssfp(200, 5);
        let mut worst = 0.0f64;
        for a in test_atoms() {
            let atom = Atom { t1: a.t1 as f32, t2: a.t2 as f32, b1: a.b1 as f32, b0: a.b0 as f32 };
            let mut r32 = vec![[0.0f32; 2]; seq.ntr()];
            cpu::pssfp_atom(&seq, atom, &mut r32);
            let mut m = vec![[0.0; 2]; seq.ntr()];
            pssfp_f64(&seq, atom, &mut m);
            let r: Vec<[f64; 2]> = r32.iter().map(|z| [z[0] as f64, z[1] as f64]).collect();
            worst = worst.max(rel_err(&m, &r));
        }
        println!("pssfp_f64_matches_cpu_reference: worst relative difference {worst:.2e}");
        assert!(worst <= 1e-6, "{worst}");
    }

    /// dm/dθ by AD against central differences of the f64 evaluation, for every parameter; also
    /// with one slice position at z = 0 and no slice gradient, where the RF axis at B0 = 0 can
    /// vanish (flip 0 steps) and the derivative passes the |a| = 0 branch of the rotation.
    #[test]
    fn pssfp_derivatives_match_central_differences() {
        let seq = mrf_pssfp(200, 5);
        let mut seq_zero = mrf_pssfp(40, 1);
        seq_zero.gz_ex = 0.0;
        seq_zero.flip[3] = 0.0;
        seq_zero.phase = (0..40).map(|n| 0.05 * n as f32).collect();
        for (name, seq) in [("mrf200x5z", &seq), ("one z, a zero flip, phases", &seq_zero)] {
            let worst = check_derivatives(seq.ntr(), |a, wrt, m, dm| pssfp_derivatives(seq, a, wrt, m, dm), |a, m| pssfp_f64(seq, a, m));
            println!("pssfp_derivatives_match_central_differences[{name}]: worst relative error {worst:?} (T1, T2, B1, B0)");
        }
        // B0 = 0 with a zero flip: the vanishing-axis branch, d/dB0 through it.
        let a = AtomF64 { t1: 1.0, t2: 0.1, b1: 1.0, b0: 0.0 };
        let (mut m, mut dm) = (vec![[0.0; 2]; 40], vec![[0.0; 2]; 40]);
        pssfp_derivatives(&seq_zero, a, Param::B0, &mut m, &mut dm);
        let h = 1e-4;
        let (mut mp, mut mm) = (vec![[0.0; 2]; 40], vec![[0.0; 2]; 40]);
        pssfp_f64(&seq_zero, a.with(Param::B0, h), &mut mp);
        pssfp_f64(&seq_zero, a.with(Param::B0, -h), &mut mm);
        let fd: Vec<[f64; 2]> = mp.iter().zip(&mm).map(|(x, y)| [(x[0] - y[0]) / (2.0 * h), (x[1] - y[1]) / (2.0 * h)]).collect();
        let e = rel_err(&dm, &fd);
        println!("pssfp_derivatives_match_central_differences[B0 = 0, zero flip]: relative error {e:.2e}");
        assert!(e <= 1e-5, "{e}");
    }

    #[test]
    fn pssfp_batch_validates_and_matches_single() {
        let seq = mrf_pssfp(30, 3);
        let atoms = test_atoms();
        let n = seq.ntr() * atoms.len();
        let (mut m, mut dm) = (vec![[0.0; 2]; n], vec![[0.0; 2]; n]);
        pssfp_derivatives_batch(&seq, &atoms, Param::B1, &mut m, &mut dm).unwrap();
        let (mut m1, mut dm1) = (vec![[0.0; 2]; seq.ntr()], vec![[0.0; 2]; seq.ntr()]);
        pssfp_derivatives(&seq, atoms[4], Param::B1, &mut m1, &mut dm1);
        assert_eq!(&m[4 * seq.ntr()..], &m1[..]);
        assert_eq!(&dm[4 * seq.ntr()..], &dm1[..]);
        let mut mf = vec![[0.0; 2]; n];
        simulate_pssfp_f64(&seq, &atoms, &mut mf).unwrap();
        assert_eq!(mf, m);
        let e = pssfp_derivatives_batch(&seq, &atoms, Param::T1, &mut m, &mut dm[2..]).unwrap_err();
        assert!(e.message.contains("dm has"), "{e:?}");
    }
}
