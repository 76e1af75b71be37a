//! The Jacobian of the MR-STAT signal with respect to the real voxel parameters, applied to a
//! vector (J·v) and its adjoint in the real sense (Jᴴ·w = Re(Jᴴ w)).
//!
//! With the signal S[c, r, s] = Σ_v C[c, v] ρ_v m_v(r) E_v(r, s), where
//! E_v(r, s) = exp(-t_s / T2_v) exp(i (2π B0_v t_s - k[r, s]·x_v)) (see [`super::signal`]),
//! ∂S[c, r, s]/∂p_{j,v} = C[c, v] E_v(r, s) d_{j,v}(r, s) with
//!
//! | parameter p_j | d_{j,v}(r, s) |
//! |---|---|
//! | T1, B1 | ρ_v ∂m_v(r)/∂p_j |
//! | T2 | ρ_v (∂m_v(r)/∂T2 + m_v(r) t_s / T2_v²) (magnetization and readout decay) |
//! | B0 | ρ_v (∂m_v(r)/∂B0 + i 2π t_s m_v(r)) (magnetization and readout phase) |
//! | Re ρ | m_v(r) |
//! | Im ρ | i m_v(r) |
//!
//! (J·v)[c, r, s] = Σ_{j,v} ∂S[c, r, s]/∂p_{j,v} v[j, v], and
//! (Jᴴ·w)[j, v] = Re Σ_{c,r,s} conj(∂S[c, r, s]/∂p_{j,v}) w[c, r, s], the adjoint of J for the
//! real inner products ⟨a, b⟩ = Re Σ conj(a) b on signals and Σ a b on parameters.
//!
//! Units: J·v has the units of the signal times those of v over those of the parameters
//! (T1, T2 in s, B1 relative, B0 in Hz, ρ relative). Layouts: v and Jᴴ·w are `nparams x
//! nvoxels`, parameter fastest (`p[v * nparams + j]`, j the index in `params`); J·v and w are
//! signal-shaped (`S[(c * nreadouts + r) * nsamples + s]`); m and each dm are
//! `nreadouts x nvoxels`, readout fastest.

use super::signal::{cx, Model};
use super::{check_finite, check_finite_c, check_len, Param};
use crate::error::Result;
use crate::fail;
use crate::qmri::cpu::C64;
use rayon::prelude::*;
use std::f64::consts::PI;

/// A real parameter of a voxel in the MR-STAT Jacobian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VoxelParam {
    /// T1 (s), through the magnetization.
    T1,
    /// T2 (s), through the magnetization and the readout decay.
    T2,
    /// Relative transmit field, through the magnetization.
    B1,
    /// Off-resonance (Hz), through the magnetization and the readout phase.
    B0,
    /// Real part of the proton density.
    RhoRe,
    /// Imaginary part of the proton density.
    RhoIm,
}

impl VoxelParam {
    /// The magnetization parameter this one differentiates through, if any.
    pub fn magnetization_param(self) -> Option<Param> {
        match self {
            VoxelParam::T1 => Some(Param::T1),
            VoxelParam::T2 => Some(Param::T2),
            VoxelParam::B1 => Some(Param::B1),
            VoxelParam::B0 => Some(Param::B0),
            VoxelParam::RhoRe | VoxelParam::RhoIm => None,
        }
    }
}

/// Checks the model, m, the parameter set and the derivatives: `dm[j]` is ∂m/∂params[j]
/// (`nreadouts x nvoxels`) for T1, T2, B1, B0 and must be empty for RhoRe, RhoIm.
fn check(model: &Model, m: &[[f64; 2]], params: &[VoxelParam], dm: &[&[[f64; 2]]]) -> Result<()> {
    model.validate()?;
    model.check_magnetization("m", m)?;
    if params.is_empty() {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "params is empty: nparams must be >= 1");
    }
    for (j, p) in params.iter().enumerate() {
        if params[..j].contains(p) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "params[{j}] = {p:?} appears twice");
        }
    }
    check_len("dm", dm, params.len(), "nparams (the length of params)")?;
    for (j, (p, d)) in params.iter().zip(dm).enumerate() {
        if p.magnetization_param().is_some() {
            model.check_magnetization(&format!("dm[{j}] (d m / d {p:?})"), d)?;
        } else if !d.is_empty() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "dm[{j}] has {} entries but must be empty: params[{j}] = {p:?} does not act through m", d.len());
        }
    }
    Ok(())
}

/// d_{j,v}(r, s) of the module documentation, at sample time `t`.
#[allow(clippy::too_many_arguments)]
fn dterm(model: &Model, m: &[[f64; 2]], p: VoxelParam, dm: &[[f64; 2]], v: usize, r: usize, t: f64) -> C64 {
    let i = v * model.nreadouts() + r;
    let rho = cx(model.voxels.rho[v]);
    match p {
        VoxelParam::T1 | VoxelParam::B1 => rho * cx(dm[i]),
        VoxelParam::T2 => {
            let t2 = model.voxels.t2[v];
            rho * (cx(dm[i]) + cx(m[i]).scale(t / t2 / t2))
        }
        VoxelParam::B0 => rho * (cx(dm[i]) + cx(m[i]).mul_i().scale(2.0 * PI * t)),
        VoxelParam::RhoRe => cx(m[i]),
        VoxelParam::RhoIm => cx(m[i]).mul_i(),
    }
}

/// J·v into `out` (signal-shaped): `v` holds `params.len() x nvoxels` reals, parameter fastest;
/// `dm[j]` is `∂m/∂params[j]` (`nreadouts x nvoxels`, from [`super::fisp_derivatives_batch`] or
/// [`super::pssfp_derivatives_batch`]), empty for RhoRe and RhoIm.
pub fn jacobian_mul(model: &Model, m: &[[f64; 2]], params: &[VoxelParam], dm: &[&[[f64; 2]]], v: &[f64], out: &mut [[f64; 2]]) -> Result<()> {
    check(model, m, params, dm)?;
    let np = params.len();
    check_len("v", v, np * model.nvoxels(), "nparams x nvoxels")?;
    check_finite("v", v)?;
    check_len("out", out, model.signal_len(), "ncoils x nreadouts x nsamples")?;
    let g = |vox: usize, r: usize, t: f64| {
        let mut acc = C64::ZERO;
        for (j, (&p, d)) in params.iter().zip(dm).enumerate() {
            let coef = v[vox * np + j];
            if coef != 0.0 {
                acc = acc + dterm(model, m, p, d, vox, r, t).scale(coef);
            }
        }
        acc
    };
    model.synthesize(g, out);
    Ok(())
}

/// Jᴴ·w = Re(Jᴴ w) into `out` (`params.len() x nvoxels` reals, parameter fastest) for a
/// signal-shaped complex `w`; the other arguments as for [`jacobian_mul`]. Parallel over voxels.
pub fn jacobian_adjoint_mul(model: &Model, m: &[[f64; 2]], params: &[VoxelParam], dm: &[&[[f64; 2]]], w: &[[f64; 2]], out: &mut [f64]) -> Result<()> {
    check(model, m, params, dm)?;
    let np = params.len();
    check_len("w", w, model.signal_len(), "ncoils x nreadouts x nsamples")?;
    check_finite_c("w", w)?;
    check_len("out", out, np * model.nvoxels(), "nparams x nvoxels")?;
    let (nv, nc, nr, ns) = (model.nvoxels(), model.ncoils(), model.nreadouts(), model.nsamples());
    let times: Vec<f64> = (0..ns).map(|s| model.traj.time(s)).collect();
    out.par_chunks_mut(np).enumerate().for_each(|(vox, o)| {
        let mut acc = vec![0.0f64; np];
        for r in 0..nr {
            for (s, &t) in times.iter().enumerate() {
                // y = conj(E) Σ_c conj(C[c, v]) w[c, r, s]
                let mut y = C64::ZERO;
                for c in 0..nc {
                    y = y + cx(model.coils[c * nv + vox]).conj() * cx(w[(c * nr + r) * ns + s]);
                }
                let y = model.readout_factor(vox, r, s, t).conj() * y;
                for (j, (&p, d)) in params.iter().zip(dm).enumerate() {
                    acc[j] += (dterm(model, m, p, d, vox, r, t).conj() * y).re;
                }
            }
        }
        o.copy_from_slice(&acc);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::trajectory::{Cartesian, Spiral, Trajectory};
    use super::super::{fisp_derivatives_batch, signal, simulate_fisp_f64, AtomF64, Voxels};
    use super::*;

    const ALL: [VoxelParam; 6] = [VoxelParam::T1, VoxelParam::T2, VoxelParam::B1, VoxelParam::B0, VoxelParam::RhoRe, VoxelParam::RhoIm];

    /// An n x n grid of voxels in a 0.2 m field of view with random tissues.
    fn grid(n: usize, rng: &mut Rng) -> (Voxels, Vec<AtomF64>) {
        let fov = 0.2;
        let mut vox = Voxels::default();
        let mut atoms = vec![];
        for iy in 0..n {
            for ix in 0..n {
                vox.x.push((ix as f64 - n as f64 / 2.0) * fov / n as f64);
                vox.y.push((iy as f64 - n as f64 / 2.0) * fov / n as f64);
                vox.rho.push(rng.c());
                let a = AtomF64 { t1: rng.uniform(0.3, 4.0), t2: rng.uniform(0.03, 0.5), b1: rng.uniform(0.8, 1.2), b0: rng.uniform(-20.0, 20.0) };
                vox.t2.push(a.t2);
                vox.b0.push(a.b0);
                atoms.push(a);
            }
        }
        (vox, atoms)
    }

    /// A Cartesian trajectory for an n-voxel-wide 0.2 m field of view, phase encodes in order.
    fn cartesian(nr: usize, ns: usize) -> Trajectory {
        let dk = 2.0 * PI / 0.2;
        let k0 = (0..nr).map(|r| [-(ns as f64) / 2.0 * dk, (r as f64 - nr as f64 / 2.0) * dk]).collect();
        Trajectory::Cartesian(Cartesian { nsamples: ns, dt: 2e-5, k0, dk: vec![[dk, 0.0]; nr] })
    }

    fn dot_c(a: &[[f64; 2]], b: &[[f64; 2]]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x[0] * y[0] + x[1] * y[1]).sum()
    }

    /// ⟨J v, w⟩ = ⟨v, Jᴴ w⟩ on random data, Cartesian and spiral, all and some parameters.
    #[test]
    fn jacobian_adjoint_test() {
        let mut rng = Rng(42);
        let (nr, ns, nc) = (16, 16, 2);
        let (vox, _) = grid(8, &mut rng);
        let nv = vox.len();
        let coils = rng.cvec(nc * nv);
        let kmax = PI / (0.2 / 8.0);
        let spiral = Trajectory::Spiral(Spiral { nsamples: ns, dt: 1e-5, k: (0..nr * ns).map(|_| [rng.uniform(-kmax, kmax), rng.uniform(-kmax, kmax)]).collect() });
        let m = rng.cvec(nr * nv);
        let dms: Vec<Vec<[f64; 2]>> = (0..4).map(|_| rng.cvec(nr * nv)).collect();
        let subset = [VoxelParam::RhoIm, VoxelParam::T2, VoxelParam::T1, VoxelParam::RhoRe];
        for (name, traj) in [("cartesian", cartesian(nr, ns)), ("spiral", spiral)] {
            let model = Model { voxels: &vox, coils: &coils, traj: &traj };
            for params in [&ALL[..], &subset[..]] {
                let dm: Vec<&[[f64; 2]]> = params.iter().map(|p| match p.magnetization_param() {
                    Some(q) => &dms[q as usize][..],
                    None => &[][..],
                }).collect();
                let v: Vec<f64> = (0..params.len() * nv).map(|_| rng.uniform(-1.0, 1.0)).collect();
                let w = rng.cvec(model.signal_len());
                let mut jv = vec![[0.0; 2]; model.signal_len()];
                jacobian_mul(&model, &m, params, &dm, &v, &mut jv).unwrap();
                let mut jhw = vec![0.0; v.len()];
                jacobian_adjoint_mul(&model, &m, params, &dm, &w, &mut jhw).unwrap();
                let lhs = dot_c(&jv, &w);
                let rhs: f64 = v.iter().zip(&jhw).map(|(a, b)| a * b).sum();
                let rel = (lhs - rhs).abs() / lhs.abs().max(rhs.abs());
                println!("jacobian_adjoint_test[{name}, {} params]: <Jv,w> = {lhs:.12e}, <v,JHw> = {rhs:.12e}, relative difference {rel:.2e}", params.len());
                assert!(rel <= 1e-10, "{rel}");
            }
        }
    }

    /// J·v against central differences of the signal of FISP magnetizations, one parameter at a
    /// time (v random over voxels, zero for the other parameters).
    #[test]
    fn jacobian_matches_central_differences() {
        let mut rng = Rng(3);
        let (nr, ns, nc) = (32, 16, 2);
        let seq = mrf_fisp(nr, 8);
        let (vox, atoms) = grid(8, &mut rng);
        let nv = vox.len();
        let coils = rng.cvec(nc * nv);
        let traj = cartesian(nr, ns);
        let model = Model { voxels: &vox, coils: &coils, traj: &traj };
        let n = nr * nv;
        let mut m = vec![[0.0; 2]; n];
        let dms: Vec<Vec<[f64; 2]>> = [Param::T1, Param::T2, Param::B1, Param::B0]
            .iter()
            .map(|&p| {
                let mut d = vec![[0.0; 2]; n];
                fisp_derivatives_batch(&seq, &atoms, p, &mut m, &mut d).unwrap();
                d
            })
            .collect();
        let dm: Vec<&[[f64; 2]]> = ALL.iter().map(|p| p.magnetization_param().map_or(&[][..], |q| &dms[q as usize][..])).collect();
        // The signal at parameters p + h d, where d is nonzero for parameter j only.
        let perturbed = |j: usize, d: &[f64], h: f64| {
            let (mut vx, mut at) = (vox.clone(), atoms.clone());
            for i in 0..nv {
                let dp = h * d[i * ALL.len() + j];
                match ALL[j] {
                    VoxelParam::T1 => at[i].t1 += dp,
                    VoxelParam::T2 => at[i].t2 += dp,
                    VoxelParam::B1 => at[i].b1 += dp,
                    VoxelParam::B0 => at[i].b0 += dp,
                    VoxelParam::RhoRe => vx.rho[i][0] += dp,
                    VoxelParam::RhoIm => vx.rho[i][1] += dp,
                }
                vx.t2[i] = at[i].t2;
                vx.b0[i] = at[i].b0;
            }
            let mut mm = vec![[0.0; 2]; n];
            simulate_fisp_f64(&seq, &at, &mut mm).unwrap();
            let mut s = vec![[0.0; 2]; model.signal_len()];
            signal(&Model { voxels: &vx, ..model }, &mm, &mut s).unwrap();
            s
        };
        // Scale of each parameter: T1, T2, B1, B0, Re rho, Im rho.
        let scale = [1.0, 0.1, 1.0, 10.0, 1.0, 1.0];
        let mut errs = vec![];
        for j in 0..ALL.len() {
            let mut d = vec![0.0; ALL.len() * nv];
            for i in 0..nv {
                d[i * ALL.len() + j] = scale[j] * rng.uniform(-1.0, 1.0);
            }
            let mut jv = vec![[0.0; 2]; model.signal_len()];
            jacobian_mul(&model, &m, &ALL, &dm, &d, &mut jv).unwrap();
            let h = 1e-5;
            let (sp, sm) = (perturbed(j, &d, h), perturbed(j, &d, -h));
            let fd: Vec<[f64; 2]> = sp.iter().zip(&sm).map(|(a, b)| [(a[0] - b[0]) / (2.0 * h), (a[1] - b[1]) / (2.0 * h)]).collect();
            let e = rel_err(&jv, &fd);
            errs.push((ALL[j], e));
            assert!(e <= 1e-6, "{:?}: relative error {e:.3e}", ALL[j]);
        }
        println!("jacobian_matches_central_differences: relative errors {errs:?}");
    }

    #[test]
    fn jacobian_validates_inputs() {
        let vox = Voxels { x: vec![0.0], y: vec![0.0], rho: vec![[1.0, 0.0]], t2: vec![0.1], b0: vec![0.0] };
        let coils = vec![[1.0, 0.0]];
        let traj = Trajectory::Spiral(Spiral { nsamples: 2, dt: 1e-5, k: vec![[0.0; 2]; 4] });
        let model = Model { voxels: &vox, coils: &coils, traj: &traj };
        let m = vec![[1.0, 0.0]; 2];
        let mut out = vec![[0.0; 2]; 4];
        let msg = |r: Result<()>| r.unwrap_err().message;
        let ok: [&[[f64; 2]]; 2] = [&m, &[]];
        jacobian_mul(&model, &m, &[VoxelParam::T1, VoxelParam::RhoRe], &ok, &[1.0, 1.0], &mut out).unwrap();
        assert!(msg(jacobian_mul(&model, &m, &[VoxelParam::T1, VoxelParam::T1], &[&m, &m], &[1.0, 1.0], &mut out)).contains("params[1] = T1 appears twice"));
        assert!(msg(jacobian_mul(&model, &m, &[VoxelParam::T1], &ok, &[1.0], &mut out)).contains("dm has 2 entries"));
        assert!(msg(jacobian_mul(&model, &m, &[VoxelParam::RhoIm], &[&m], &[1.0], &mut out)).contains("dm[0] has 2 entries but must be empty"));
        assert!(msg(jacobian_mul(&model, &m, &[VoxelParam::T2], &[&m[..1]], &[1.0], &mut out)).contains("dm[0] (d m / d T2) has 1 entries"));
        assert!(msg(jacobian_mul(&model, &m, &[VoxelParam::T1, VoxelParam::RhoRe], &ok, &[1.0], &mut out)).contains("v has 1 entries"));
        assert!(msg(jacobian_mul(&model, &m, &[], &[], &[], &mut out)).contains("params is empty"));
        let mut o = vec![0.0; 3];
        assert!(msg(jacobian_adjoint_mul(&model, &m, &[VoxelParam::T1, VoxelParam::RhoRe], &ok, &out.clone(), &mut o)).contains("out has 3 entries"));
        assert!(msg(jacobian_adjoint_mul(&model, &m, &[VoxelParam::T1, VoxelParam::RhoRe], &ok, &[[f64::NAN, 0.0]; 4], &mut o[..2])).contains("w[0]"));
    }
}
