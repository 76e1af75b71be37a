//! FISP echo magnetization and its exact derivatives (forward-mode AD).
//!
//! The recurrence is that of [`crate::qmri::cpu::fisp_atom`] (EPG, BlochSimulators.jl's FISP2D:
//! adiabatic inversion, TI of relaxation, then per TR the RF rotation of flip angle
//! α·B1·profile and phase φ, relaxation and off-resonance exp(+i 2π B0 t) to TE, the sample
//! F+(0), relaxation to TR and one unit of dephasing; summed over profile positions), written
//! once over a generic [`Real`] scalar: at `f64` it is the plain f64 evaluation, at [`Dual`] it
//! carries dm/dθ along. The derivatives are exact (automatic differentiation), not finite
//! differences.

use super::dual::{relax, Cx, Dual, Real};
use super::{each_atom, each_atom_with_derivative, AtomF64, Param};
use crate::error::Result;
use crate::qmri::Fisp;
use std::f64::consts::PI;

/// The echo magnetization of one tissue with parameters (T1, T2, B1, B0) over scalar `T`.
fn fisp_generic<T: Real>(seq: &Fisp, t1: T, t2: T, b1: T, b0: T, out: &mut [Cx<T>]) {
    let ntr = seq.ntr();
    let ns = seq.max_state as usize;
    let zero = Cx::<T>::zero();
    let (te, tr_te, ti) = (seq.te as f64, (seq.tr - seq.te) as f64, seq.ti as f64);
    let (e1te, e2te) = (relax(te, t1), relax(te, t2));
    let (e1r, e2r) = (relax(tr_te, t1), relax(tr_te, t2));
    let (e1ti, e2ti) = (relax(ti, t1), relax(ti, t2));
    let rot_te = Cx::cis(b0.scale(2.0 * PI).scale(te)).scale(e2te);
    let rot_r = Cx::cis(b0.scale(2.0 * PI).scale(tr_te)).scale(e2r);
    let one = T::cst(1.0);
    out.fill(zero);
    let mut f = vec![zero; ns]; // F+(k)
    let mut g = vec![zero; ns]; // conj(F-(k))
    let mut z = vec![zero; ns]; // Z(k)
    for p in 0..seq.positions() {
        f.fill(zero);
        g.fill(zero);
        z.fill(zero);
        // Adiabatic inversion of Z(0) = 1, then relaxation over TI.
        z[0] = Cx::cst(-1.0, 0.0);
        for k in 0..ns {
            f[k] = f[k].scale(e2ti);
            g[k] = g[k].scale(e2ti);
            z[k] = z[k].scale(e1ti);
        }
        z[0].re = z[0].re + (one - e1ti);
        for n in 0..ntr {
            let alpha = b1.scale(seq.flip[n] as f64 * seq.scale(n, p) as f64);
            excite(&mut f, &mut g, &mut z, alpha, seq.phase[n] as f64);
            for k in 0..ns {
                f[k] = f[k] * rot_te;
                g[k] = g[k] * rot_te.conj();
                z[k] = z[k].scale(e1te);
            }
            z[0].re = z[0].re + (one - e1te);
            out[n] = out[n] + f[0];
            for k in 0..ns {
                f[k] = f[k] * rot_r;
                g[k] = g[k] * rot_r.conj();
                z[k] = z[k].scale(e1r);
            }
            z[0].re = z[0].re + (one - e1r);
            dephase(&mut f, &mut g);
        }
    }
}

/// The EPG RF transition matrix (Weigel 2015) for flip angle `alpha` (rad) and phase `phi` (rad).
fn excite<T: Real>(f: &mut [Cx<T>], g: &mut [Cx<T>], z: &mut [Cx<T>], alpha: T, phi: f64) {
    let (sx, cx) = (alpha.scale(0.5)).sin_cos();
    let (c2, s2) = (cx * cx, sx * sx);
    let (sa, ca) = alpha.sin_cos();
    let e = Cx::<T>::cis(T::cst(phi));
    let e2 = e * e;
    let half_sa = sa.scale(0.5);
    for k in 0..f.len() {
        let (a, b, c) = (f[k], g[k], z[k]);
        // F+' = c2 F+ + e^{2i phi} s2 conj(F-) - i e^{i phi} sin(a) Z
        f[k] = a.scale(c2) + (e2 * b).scale(s2) - (e * c).mul_i().scale(sa);
        // conj(F-)' = e^{-2i phi} s2 F+ + c2 conj(F-) + i e^{-i phi} sin(a) Z
        g[k] = (e2.conj() * a).scale(s2) + b.scale(c2) + (e.conj() * c).mul_i().scale(sa);
        // Z' = -i/2 e^{-i phi} sin(a) F+ + i/2 e^{i phi} sin(a) conj(F-) + cos(a) Z
        z[k] = (e * b - e.conj() * a).mul_i().scale(half_sa) + c.scale(ca);
    }
}

/// One unit of gradient dephasing: F+ states move up, conj(F-) states down, F+(0) = conj(F-(0)).
fn dephase<T: Real>(f: &mut [Cx<T>], g: &mut [Cx<T>]) {
    let ns = f.len();
    for k in 0..ns - 1 {
        g[k] = g[k + 1];
    }
    g[ns - 1] = Cx::zero();
    for k in (1..ns).rev() {
        f[k] = f[k - 1];
    }
    f[0] = g[0].conj();
}

/// The FISP echo magnetization of one tissue in f64, `ntr` (re, im) values into `m`. Equals
/// [`crate::qmri::cpu::fisp_atom`] (which rounds its f64 result to f32) up to that rounding.
/// Panics if `m` does not hold `seq.ntr()` values.
pub fn fisp_f64(seq: &Fisp, atom: impl Into<AtomF64>, m: &mut [[f64; 2]]) {
    let a = atom.into();
    assert_eq!(m.len(), seq.ntr(), "fisp_f64: m must hold seq.ntr() values");
    let mut out = vec![Cx::<f64>::zero(); seq.ntr()];
    fisp_generic(seq, a.t1, a.t2, a.b1, a.b0, &mut out);
    for (o, c) in m.iter_mut().zip(&out) {
        *o = [c.re, c.im];
    }
}

/// The FISP echo magnetization m of one tissue and its exact derivative dm/dθ with respect to
/// `wrt` (forward-mode automatic differentiation, one pass): `ntr` (re, im) values each.
/// Units of dm/dθ: per second for T1 and T2, per unit B1, per Hz for B0.
/// Panics if `m` or `dm` does not hold `seq.ntr()` values.
pub fn fisp_derivatives(seq: &Fisp, atom: impl Into<AtomF64>, wrt: Param, m: &mut [[f64; 2]], dm: &mut [[f64; 2]]) {
    let a = atom.into();
    assert_eq!(m.len(), seq.ntr(), "fisp_derivatives: m must hold seq.ntr() values");
    assert_eq!(dm.len(), seq.ntr(), "fisp_derivatives: dm must hold seq.ntr() values");
    let d = |p: Param| if p == wrt { Dual::var(a.get(p)) } else { Dual::cst(a.get(p)) };
    let mut out = vec![Cx::<Dual>::zero(); seq.ntr()];
    fisp_generic(seq, d(Param::T1), d(Param::T2), d(Param::B1), d(Param::B0), &mut out);
    for ((mo, dmo), c) in m.iter_mut().zip(dm.iter_mut()).zip(&out) {
        *mo = c.value_pair();
        *dmo = c.deriv_pair();
    }
}

/// [`fisp_f64`] of every atom (rayon), `m` is `ntr x atoms.len()`, TR fastest.
pub fn simulate_fisp_f64(seq: &Fisp, atoms: &[AtomF64], m: &mut [[f64; 2]]) -> Result<()> {
    seq.validate()?;
    each_atom(seq.ntr(), atoms, m, |a, o| fisp_f64(seq, a, o))
}

/// [`fisp_derivatives`] of every atom (rayon): `m` and `dm` are `ntr x atoms.len()`, TR fastest.
pub fn fisp_derivatives_batch(seq: &Fisp, atoms: &[AtomF64], wrt: Param, m: &mut [[f64; 2]], dm: &mut [[f64; 2]]) -> Result<()> {
    seq.validate()?;
    each_atom_with_derivative(seq.ntr(), atoms, m, dm, |a, mo, dmo| fisp_derivatives(seq, a, wrt, mo, dmo))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::qmri::{cpu, Atom};

    /// The f64 evaluation equals the existing reference (which returns f32) to 1e-6 relative.
    #[test]
    fn fisp_f64_matches_cpu_reference() {
        let seq = mrf_fisp(200, 16);
        let mut worst = 0.0f64;
        for a in test_atoms() {
            let atom = Atom { t1: a.t1 as f32, t2: a.t2 as f32, b1: a.b1 as f32, b0: a.b0 as f32 };
            let mut r32 = vec![[0.0f32; 2]; seq.ntr()];
            cpu::fisp_atom(&seq, atom, &mut r32);
            let mut m = vec![[0.0; 2]; seq.ntr()];
            fisp_f64(&seq, atom, &mut m);
            let r: Vec<[f64; 2]> = r32.iter().map(|z| [z[0] as f64, z[1] as f64]).collect();
            worst = worst.max(rel_err(&m, &r));
        }
        println!("fisp_f64_matches_cpu_reference: worst relative difference {worst:.2e}");
        assert!(worst <= 1e-6, "{worst}");
    }

    /// dm/dθ by AD against central differences of the f64 evaluation, for every parameter.
    #[test]
    fn fisp_derivatives_match_central_differences() {
        let seq = mrf_fisp(200, 16);
        let mut seq_profile = mrf_fisp(60, 12);
        seq_profile.profile = (0..3).flat_map(|p| (0..60).map(move |n| 0.6 + 0.2 * p as f32 + 0.001 * n as f32)).collect();
        seq_profile.phase = (0..60).map(|n| 0.1 * n as f32).collect();
        for (name, seq) in [("mrf200", &seq), ("profile+phases", &seq_profile)] {
            let worst = check_derivatives(seq.ntr(), |a, wrt, m, dm| fisp_derivatives(seq, a, wrt, m, dm), |a, m| fisp_f64(seq, a, m));
            println!("fisp_derivatives_match_central_differences[{name}]: worst relative error {worst:?} (T1, T2, B1, B0)");
        }
    }

    #[test]
    fn fisp_batch_validates_and_matches_single() {
        let seq = mrf_fisp(30, 8);
        let atoms = test_atoms();
        let n = seq.ntr() * atoms.len();
        let (mut m, mut dm) = (vec![[0.0; 2]; n], vec![[0.0; 2]; n]);
        fisp_derivatives_batch(&seq, &atoms, Param::T2, &mut m, &mut dm).unwrap();
        let (mut m1, mut dm1) = (vec![[0.0; 2]; seq.ntr()], vec![[0.0; 2]; seq.ntr()]);
        fisp_derivatives(&seq, atoms[2], Param::T2, &mut m1, &mut dm1);
        assert_eq!(&m[2 * seq.ntr()..3 * seq.ntr()], &m1[..]);
        assert_eq!(&dm[2 * seq.ntr()..3 * seq.ntr()], &dm1[..]);
        let mut mf = vec![[0.0; 2]; n];
        simulate_fisp_f64(&seq, &atoms, &mut mf).unwrap();
        assert_eq!(mf, m);
        let e = fisp_derivatives_batch(&seq, &atoms, Param::T1, &mut m[1..], &mut dm).unwrap_err();
        assert!(e.message.contains("m has"), "{e:?}");
        let mut bad = atoms.clone();
        bad[1].t2 = 0.0;
        let e = simulate_fisp_f64(&seq, &bad, &mut mf).unwrap_err();
        assert!(e.message.contains("atom 1 has T2"), "{e:?}");
    }
}
