//! The MR-STAT forward model: the k-space signal of an echo magnetization.
//!
//! For voxels v at (x_v, y_v) (m) with complex proton density ρ_v, T2_v (s) and off-resonance
//! B0_v (Hz), echo magnetization m_v(r) of readout r (one readout per TR), coil sensitivities
//! C[c, v] and a trajectory with k-space positions k[r, s] (rad/m) and sample times t_s (s,
//! relative to the echo, see [`super::trajectory`]):
//!
//! S[c, r, s] = Σ_v C[c, v] ρ_v m_v(r) exp(-t_s / T2_v) exp(+i 2π B0_v t_s) exp(-i (kx x_v + ky y_v))
//!
//! Sign conventions: the off-resonance phase exp(+i 2π B0 t) is the one the FISP simulation
//! applies to F+ ([`crate::qmri::cpu::fisp_atom`]), so the readout continues the simulated
//! precession; the spatial encoding exp(-i k·x) is the usual Fourier convention
//! S(k) = ∫ ρ(x) e^{-i k·x} dx. compas-toolkit uses exp(+i k·x) (its `prephaser`); its signal
//! is this one with k negated. The T2 decay and B0 phase are relative to the echo, so samples
//! before the echo (t_s < 0) are "un-decayed", as compas-toolkit's `rewind` does.
//!
//! Layouts: m is `nreadouts x nvoxels` (readout fastest, `m[v * nreadouts + r]`), C is
//! `nvoxels x ncoils` (voxel fastest, `C[c * nvoxels + v]`), S is sample fastest,
//! `S[(c * nreadouts + r) * nsamples + s]`.

use super::trajectory::Trajectory;
use super::{check_finite, check_finite_c, check_len};
use crate::error::Result;
use crate::fail;
use crate::qmri::cpu::C64;
use rayon::prelude::*;
use std::f64::consts::PI;

/// The voxels of an MR-STAT object: position (m), proton density, T2 (s), B0 (Hz), one entry per
/// voxel in each vector. T1 and B1 act only through the magnetization and are not needed here.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Voxels {
    pub x: Vec<f64>,
    pub y: Vec<f64>,
    /// Complex proton density (re, im).
    pub rho: Vec<[f64; 2]>,
    /// T2 (s), > 0; +Inf means no decay during the readout.
    pub t2: Vec<f64>,
    /// Off-resonance (Hz).
    pub b0: Vec<f64>,
}

impl Voxels {
    pub fn len(&self) -> usize {
        self.x.len()
    }
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }
    /// Checks equal lengths (>= 1 voxel), finite x, y, ρ, B0 and T2 > 0 (+Inf allowed).
    pub fn validate(&self) -> Result<()> {
        let n = self.x.len();
        if n == 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "voxels.x is empty: nvoxels must be >= 1");
        }
        check_len("voxels.y", &self.y, n, "nvoxels (the length of voxels.x)")?;
        check_len("voxels.rho", &self.rho, n, "nvoxels (the length of voxels.x)")?;
        check_len("voxels.t2", &self.t2, n, "nvoxels (the length of voxels.x)")?;
        check_len("voxels.b0", &self.b0, n, "nvoxels (the length of voxels.x)")?;
        check_finite("voxels.x", &self.x)?;
        check_finite("voxels.y", &self.y)?;
        check_finite_c("voxels.rho", &self.rho)?;
        check_finite("voxels.b0", &self.b0)?;
        if let Some(i) = self.t2.iter().position(|&t| !(t > 0.0)) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "voxels.t2[{i}] = {}; T2 must be > 0 (+Inf allowed)", self.t2[i]);
        }
        Ok(())
    }
}

/// Everything of the forward model but the magnetization: voxels, coil sensitivities
/// (`nvoxels x ncoils`, voxel fastest) and trajectory.
#[derive(Debug, Clone, Copy)]
pub struct Model<'a> {
    pub voxels: &'a Voxels,
    pub coils: &'a [[f64; 2]],
    pub traj: &'a Trajectory,
}

impl Model<'_> {
    pub fn nvoxels(&self) -> usize {
        self.voxels.len()
    }
    pub fn ncoils(&self) -> usize {
        self.coils.len() / self.nvoxels().max(1)
    }
    pub fn nreadouts(&self) -> usize {
        self.traj.nreadouts()
    }
    pub fn nsamples(&self) -> usize {
        self.traj.nsamples()
    }
    /// The number of complex values of a signal: ncoils x nreadouts x nsamples.
    pub fn signal_len(&self) -> usize {
        self.ncoils() * self.nreadouts() * self.nsamples()
    }

    /// Checks the voxels, the trajectory and the coils (a positive multiple of nvoxels entries,
    /// finite), and that the sizes' products fit in memory.
    pub fn validate(&self) -> Result<()> {
        self.voxels.validate()?;
        self.traj.validate()?;
        let nv = self.nvoxels();
        if self.coils.is_empty() || self.coils.len() % nv != 0 {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "coils has {} entries: it must be nvoxels ({nv}) x ncoils with ncoils >= 1",
                self.coils.len()
            );
        }
        check_finite_c("coils", self.coils)?;
        let fits = |a: usize, b: usize| a.checked_mul(b).filter(|&n| n.checked_mul(16).is_some());
        if fits(self.nreadouts(), nv).is_none() || fits(self.ncoils() * self.nreadouts(), self.nsamples()).is_none() {
            fail!(
                KMM_ERROR_SIZE_OVERFLOW,
                "nvoxels = {nv}, ncoils = {}, nreadouts = {}, nsamples = {}: the array sizes overflow",
                self.ncoils(),
                self.nreadouts(),
                self.nsamples()
            );
        }
        Ok(())
    }

    /// Checks a magnetization-shaped input: `nreadouts x nvoxels` finite values.
    pub(crate) fn check_magnetization(&self, name: &str, m: &[[f64; 2]]) -> Result<()> {
        check_len(name, m, self.nreadouts() * self.nvoxels(), "nreadouts x nvoxels")?;
        check_finite_c(name, m)
    }

    /// exp(-t_s / T2_v) exp(i (2π B0_v t_s - k[r, s]·x_v)): the readout factor of voxel v at
    /// sample s of readout r, whose time is `t`.
    pub(crate) fn readout_factor(&self, v: usize, r: usize, s: usize, t: f64) -> C64 {
        let vx = self.voxels;
        let k = self.traj.k(r, s);
        let phase = 2.0 * PI * vx.b0[v] * t - (k[0] * vx.x[v] + k[1] * vx.y[v]);
        C64::cis(phase).scale((-t / vx.t2[v]).exp())
    }

    /// out[c, r, s] = Σ_v C[c, v] q(v, r, s, t_s) readout_factor(v, r, s): the common structure of
    /// the signal (q = ρ m) and of J·v. Parallel over readouts.
    pub(crate) fn synthesize(&self, q: impl Fn(usize, usize, f64) -> C64 + Sync, out: &mut [[f64; 2]]) {
        let (nv, nc, nr, ns) = (self.nvoxels(), self.ncoils(), self.nreadouts(), self.nsamples());
        let times: Vec<f64> = (0..ns).map(|s| self.traj.time(s)).collect();
        let blocks: Vec<Vec<C64>> = (0..nr)
            .into_par_iter()
            .map(|r| {
                let mut buf = vec![C64::ZERO; nc * ns];
                for v in 0..nv {
                    for (s, &t) in times.iter().enumerate() {
                        let e = q(v, r, t) * self.readout_factor(v, r, s, t);
                        for c in 0..nc {
                            buf[c * ns + s] = buf[c * ns + s] + cx(self.coils[c * nv + v]) * e;
                        }
                    }
                }
                buf
            })
            .collect();
        for (r, buf) in blocks.iter().enumerate() {
            for c in 0..nc {
                for s in 0..ns {
                    let z = buf[c * ns + s];
                    out[(c * nr + r) * ns + s] = [z.re, z.im];
                }
            }
        }
    }
}

pub(crate) fn cx(z: [f64; 2]) -> C64 {
    C64::new(z[0], z[1])
}

/// The k-space signal S of magnetization `m` (`nreadouts x nvoxels`, readout fastest) into `out`
/// (`nsamples x nreadouts x ncoils`, sample fastest); see the module documentation for the model.
pub fn signal(model: &Model, m: &[[f64; 2]], out: &mut [[f64; 2]]) -> Result<()> {
    model.validate()?;
    model.check_magnetization("m", m)?;
    check_len("out", out, model.signal_len(), "ncoils x nreadouts x nsamples")?;
    let nr = model.nreadouts();
    let rho = &model.voxels.rho;
    model.synthesize(|v, r, _t| cx(rho[v]) * cx(m[v * nr + r]), out);
    Ok(())
}

/// The residual r = S_model - data and its squared norm Σ |r|², both of signal shape.
pub fn residual(s_model: &[[f64; 2]], data: &[[f64; 2]]) -> Result<(Vec<[f64; 2]>, f64)> {
    check_len("data", data, s_model.len(), "the length of s_model")?;
    check_finite_c("s_model", s_model)?;
    check_finite_c("data", data)?;
    let r: Vec<[f64; 2]> = s_model.iter().zip(data).map(|(a, b)| [a[0] - b[0], a[1] - b[1]]).collect();
    let norm2 = r.iter().map(|z| z[0] * z[0] + z[1] * z[1]).sum();
    Ok((r, norm2))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::trajectory::{Cartesian, Spiral};
    use super::*;

    fn one_voxel(x: f64, y: f64, rho: [f64; 2], t2: f64, b0: f64) -> Voxels {
        Voxels { x: vec![x], y: vec![y], rho: vec![rho], t2: vec![t2], b0: vec![b0] }
    }

    /// One voxel (off-centre, which must not matter), k = 0 everywhere, two coils: the signal is
    /// ρ C m(r) exp(-t/T2) exp(i 2π B0 t) sample by sample, with t_s = (s - nsamples/2) dt.
    #[test]
    fn signal_single_voxel_at_k_centre() {
        let (nr, ns, dt) = (8, 15, 1e-4);
        let mut rng = Rng(7);
        let (rho, t2, b0) = ([0.8, -0.3], 0.005, 37.0);
        let vox = one_voxel(0.013, -0.02, rho, t2, b0);
        let coils = rng.cvec(2);
        let traj = Trajectory::Spiral(Spiral { nsamples: ns, dt, k: vec![[0.0; 2]; nr * ns] });
        let model = Model { voxels: &vox, coils: &coils, traj: &traj };
        let m = rng.cvec(nr);
        let mut out = vec![[0.0; 2]; 2 * nr * ns];
        signal(&model, &m, &mut out).unwrap();
        let mut worst = 0.0f64;
        for c in 0..2 {
            for r in 0..nr {
                for s in 0..ns {
                    let t = (s as f64 - 7.5) * dt;
                    let want = cx(rho) * cx(coils[c]) * cx(m[r]) * C64::cis(2.0 * PI * b0 * t).scale((-t / t2).exp());
                    let got = cx(out[(c * nr + r) * ns + s]);
                    worst = worst.max((got - want).norm_sqr().sqrt() / want.norm_sqr().sqrt());
                }
            }
        }
        println!("signal_single_voxel_at_k_centre: worst relative error {worst:.2e}");
        assert!(worst <= 1e-14, "{worst}");
    }

    /// A point object off-centre under a Cartesian trajectory is the plane wave exp(-i k·x0):
    /// its phase steps by -Δkx x0 along a readout and by -Δky y0 between phase encodes.
    #[test]
    fn cartesian_point_object_is_plane_wave() {
        let (nr, ns) = (16, 16);
        let fov = 0.25;
        let dk = 2.0 * PI / fov;
        let (x0, y0) = (0.031, -0.017);
        let vox = one_voxel(x0, y0, [1.0, 0.0], f64::INFINITY, 0.0);
        let coils = vec![[1.0, 0.0]];
        let k0: Vec<[f64; 2]> = (0..nr).map(|r| [-(ns as f64) / 2.0 * dk, (r as f64 - nr as f64 / 2.0) * dk]).collect();
        let cart = Cartesian { nsamples: ns, dt: 5e-6, k0: k0.clone(), dk: vec![[dk, 0.0]; nr] };
        let traj = Trajectory::Cartesian(cart.clone());
        let model = Model { voxels: &vox, coils: &coils, traj: &traj };
        let m = vec![[1.0, 0.0]; nr];
        let mut out = vec![[0.0; 2]; nr * ns];
        signal(&model, &m, &mut out).unwrap();
        let mut worst = 0.0f64;
        for r in 0..nr {
            for s in 0..ns {
                let (kx, ky) = (k0[r][0] + s as f64 * dk, k0[r][1]);
                let want = C64::cis(-(kx * x0 + ky * y0));
                worst = worst.max((cx(out[r * ns + s]) - want).norm_sqr().sqrt());
            }
        }
        // Phase steps: S[r, s+1] / S[r, s] = exp(-i dk x0), S[r+1, s] / S[r, s] = exp(-i dk y0).
        let (a, b, c) = (cx(out[3 * ns + 5]), cx(out[3 * ns + 6]), cx(out[4 * ns + 5]));
        let step_x = (b * a.conj()).im.atan2((b * a.conj()).re);
        let step_y = (c * a.conj()).im.atan2((c * a.conj()).re);
        let wrap = |p: f64| (p + PI).rem_euclid(2.0 * PI) - PI;
        println!("cartesian_point_object_is_plane_wave: worst error {worst:.2e}, phase steps {step_x:.6} (want {:.6}), {step_y:.6} (want {:.6})", wrap(-dk * x0), wrap(-dk * y0));
        assert!(worst <= 1e-12, "{worst}");
        assert!((step_x - wrap(-dk * x0)).abs() < 1e-12 && (step_y - wrap(-dk * y0)).abs() < 1e-12);
        // The same k-space positions listed sample by sample (Spiral) give the same signal.
        let k: Vec<[f64; 2]> = (0..nr).flat_map(|r| (0..ns).map(move |s| (r, s))).map(|(r, s)| traj.k(r, s)).collect();
        let spiral = Trajectory::Spiral(Spiral { nsamples: ns, dt: cart.dt, k });
        let mut out2 = vec![[0.0; 2]; nr * ns];
        signal(&Model { traj: &spiral, ..model }, &m, &mut out2).unwrap();
        assert_eq!(out, out2);
    }

    #[test]
    fn signal_validates_inputs() {
        let vox = one_voxel(0.0, 0.0, [1.0, 0.0], 0.1, 0.0);
        let coils = vec![[1.0, 0.0]; 2];
        let traj = Trajectory::Spiral(Spiral { nsamples: 4, dt: 1e-5, k: vec![[0.0; 2]; 12] });
        let model = Model { voxels: &vox, coils: &coils, traj: &traj };
        let m = vec![[1.0, 0.0]; 3];
        let mut out = vec![[0.0; 2]; 24];
        signal(&model, &m, &mut out).unwrap();
        let msg = |r: Result<()>| r.unwrap_err().message;
        assert!(msg(signal(&model, &m[..2], &mut out)).contains("m has 2 entries but must have nreadouts x nvoxels = 3"));
        assert!(msg(signal(&model, &m, &mut out[..23])).contains("out has 23 entries"));
        let bad_traj = Trajectory::Spiral(Spiral { nsamples: 5, dt: 1e-5, k: vec![[0.0; 2]; 12] });
        assert!(msg(signal(&Model { traj: &bad_traj, ..model }, &m, &mut out)).contains("trajectory.k has 12 entries"));
        let cart = Trajectory::Cartesian(Cartesian { nsamples: 4, dt: 1e-5, k0: vec![[0.0; 2]; 3], dk: vec![[0.0; 2]; 2] });
        assert!(msg(signal(&Model { traj: &cart, ..model }, &m, &mut out)).contains("trajectory.dk has 2 entries"));
        let mut v2 = vox.clone();
        v2.t2[0] = 0.0;
        assert!(msg(signal(&Model { voxels: &v2, ..model }, &m, &mut out)).contains("voxels.t2[0] = 0"));
        v2 = vox.clone();
        v2.b0.push(1.0);
        assert!(msg(signal(&Model { voxels: &v2, ..model }, &m, &mut out)).contains("voxels.b0 has 2 entries"));
        let nan_coils = vec![[1.0, 0.0], [f64::NAN, 0.0]];
        assert!(msg(signal(&Model { coils: &nan_coils, ..model }, &m, &mut out)).contains("coils[1]"));
        let mut m2 = m.clone();
        m2[1][1] = f64::INFINITY;
        assert!(msg(signal(&model, &m2, &mut out)).contains("m[1]"));
    }

    #[test]
    fn residual_and_norm() {
        let (r, n2) = residual(&[[1.0, 2.0], [0.5, -1.0]], &[[0.0, 2.0], [0.5, 1.0]]).unwrap();
        assert_eq!(r, vec![[1.0, 0.0], [0.0, -2.0]]);
        assert_eq!(n2, 5.0);
        assert!(residual(&[[0.0; 2]], &[]).unwrap_err().message.contains("data has 0 entries"));
    }
}
