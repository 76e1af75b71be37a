//! The f64 CPU reference of the MR-STAT operations: pure library code, no manager, no GPU.
//!
//! MR-STAT fits per-voxel tissue parameters directly to k-space data. Its operations are
//!
//! - [`fisp_derivatives`] / [`pssfp_derivatives`]: the echo magnetization m(r) of one tissue (the
//!   quantity [`super::cpu::fisp_atom`] and [`super::cpu::pssfp_atom`] return, one complex value
//!   per TR) and its **exact** derivative dm/dθ with respect to T1, T2, B1 or B0, by forward-mode
//!   automatic differentiation over dual numbers ([`dual`]): one pass gives m and dm/dθ for one θ.
//!   These are not finite differences; they equal the derivative of the f64 recurrence up to
//!   rounding.
//! - [`signal`]: the k-space signal of a magnetization (the forward model), Cartesian or
//!   arbitrary (spiral) trajectories, with several receive coils.
//! - [`jacobian_mul`] / [`jacobian_adjoint_mul`]: the Jacobian of that signal with respect to the
//!   real voxel parameters (T1, T2, B1, B0, Re ρ, Im ρ; any subset, in any order) applied to a
//!   vector, and its adjoint in the real sense; [`residual`].
//!
//! Units: times in seconds, angles in radians, B0 in Hz, positions in metres, k-space in rad/m.
//! Complex values are `[f64; 2]` (re, im) pairs, as the rest of the qMRI module writes `[f32; 2]`.
//!
//! Array layouts are given as index formulas; "a x b, a fastest" means element (i, j) at
//! `j * a + i` (the `ntr x natoms` convention of [`super::cpu::simulate_fisp`]):
//!
//! | array | shape | element |
//! |---|---|---|
//! | magnetization m, dm/dθ | `nreadouts x nvoxels`, readout fastest | `m[v * nreadouts + r]` |
//! | coil sensitivities C | `nvoxels x ncoils`, voxel fastest | `C[c * nvoxels + v]` |
//! | signal S, residual, J·v, w | `nsamples x nreadouts x ncoils`, sample fastest | `S[(c * nreadouts + r) * nsamples + s]` |
//! | parameter vectors v, Jᴴw | `nparams x nvoxels`, parameter fastest | `p[v * nparams + j]` |
//! | spiral k-space | `nsamples x nreadouts`, sample fastest | `k[r * nsamples + s]` |
//!
//! (The last three are "ncoils x nreadouts x nsamples", "nvoxels x nparams" and
//! "nreadouts x nsamples" in row-major, C/C++ notation.)

pub mod dual;
mod fisp;
mod jacobian;
mod pssfp;
mod signal;
#[cfg(test)]
mod testutil;
mod trajectory;

pub use fisp::{fisp_derivatives, fisp_derivatives_batch, fisp_f64, simulate_fisp_f64};
pub use jacobian::{jacobian_adjoint_mul, jacobian_mul, VoxelParam};
pub use pssfp::{pssfp_derivatives, pssfp_derivatives_batch, pssfp_f64, simulate_pssfp_f64};
pub use signal::{residual, signal, Model, Voxels};
pub use trajectory::{Cartesian, Spiral, Trajectory};

use super::Atom;
use crate::error::Result;
use crate::fail;

/// A tissue parameter of the magnetization that [`fisp_derivatives`] and [`pssfp_derivatives`]
/// differentiate with respect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// Longitudinal relaxation time (s).
    T1,
    /// Transverse relaxation time (s).
    T2,
    /// Relative transmit field (scales every flip angle, dimensionless).
    B1,
    /// Off-resonance (Hz).
    B0,
}

/// An [`Atom`] in f64 (T1, T2 in s, B1 relative, B0 in Hz), so that derivatives can be checked
/// against finite differences finer than f32 resolves.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AtomF64 {
    pub t1: f64,
    pub t2: f64,
    pub b1: f64,
    pub b0: f64,
}

impl From<Atom> for AtomF64 {
    fn from(a: Atom) -> AtomF64 {
        AtomF64 { t1: a.t1 as f64, t2: a.t2 as f64, b1: a.b1 as f64, b0: a.b0 as f64 }
    }
}

impl AtomF64 {
    /// The value of parameter `p`.
    pub fn get(&self, p: Param) -> f64 {
        match p {
            Param::T1 => self.t1,
            Param::T2 => self.t2,
            Param::B1 => self.b1,
            Param::B0 => self.b0,
        }
    }
    /// A copy with parameter `p` set to `x`.
    pub fn with(mut self, p: Param, x: f64) -> AtomF64 {
        match p {
            Param::T1 => self.t1 = x,
            Param::T2 => self.t2 = x,
            Param::B1 => self.b1 = x,
            Param::B0 => self.b0 = x,
        }
        self
    }
}

/// Checks f64 atoms as [`super::validate_atoms`] checks f32 ones: T1, T2 > 0 (+Inf allowed),
/// B1 and B0 finite.
pub fn validate_atoms_f64(atoms: &[AtomF64]) -> Result<()> {
    for (i, a) in atoms.iter().enumerate() {
        if !(a.t1 > 0.0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "atoms: atom {i} has T1 = {}; T1 must be > 0 (+Inf allowed)", a.t1);
        }
        if !(a.t2 > 0.0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "atoms: atom {i} has T2 = {}; T2 must be > 0 (+Inf allowed)", a.t2);
        }
        if !a.b1.is_finite() || !a.b0.is_finite() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "atoms: atom {i} has B1 = {}, B0 = {}; both must be finite", a.b1, a.b0);
        }
    }
    Ok(())
}

/// Checks that `name` holds `want` entries.
/// Runs `one` for every atom in parallel (rayon) after checking the atoms and that `m` holds
/// `ntr x atoms.len()` values: one `ntr`-long column of `m` per atom, TR fastest.
fn each_atom(ntr: usize, atoms: &[AtomF64], m: &mut [[f64; 2]], one: impl Fn(AtomF64, &mut [[f64; 2]]) + Sync + Send) -> Result<()> {
    use rayon::prelude::*;
    validate_atoms_f64(atoms)?;
    check_len("m", m, ntr * atoms.len(), "ntr x natoms")?;
    m.par_chunks_mut(ntr).zip(atoms.par_iter()).for_each(|(o, &a)| one(a, o));
    Ok(())
}

/// [`each_atom`] with a second output of the same shape (a derivative).
fn each_atom_with_derivative(
    ntr: usize,
    atoms: &[AtomF64],
    m: &mut [[f64; 2]],
    dm: &mut [[f64; 2]],
    one: impl Fn(AtomF64, &mut [[f64; 2]], &mut [[f64; 2]]) + Sync + Send,
) -> Result<()> {
    use rayon::prelude::*;
    validate_atoms_f64(atoms)?;
    check_len("m", m, ntr * atoms.len(), "ntr x natoms")?;
    check_len("dm", dm, ntr * atoms.len(), "ntr x natoms")?;
    m.par_chunks_mut(ntr).zip(dm.par_chunks_mut(ntr)).zip(atoms.par_iter()).for_each(|((mo, dmo), &a)| one(a, mo, dmo));
    Ok(())
}

pub(crate) fn check_len<T>(name: &str, v: &[T], want: usize, what: &str) -> Result<()> {
    if v.len() != want {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} has {} entries but must have {what} = {want}", v.len());
    }
    Ok(())
}

/// Checks that every entry of `name` is finite.
pub(crate) fn check_finite(name: &str, v: &[f64]) -> Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name}[{i}] = {} is not finite", v[i]);
    }
    Ok(())
}

/// Checks that every complex entry of `name` is finite.
pub(crate) fn check_finite_c(name: &str, v: &[[f64; 2]]) -> Result<()> {
    if let Some(i) = v.iter().position(|x| !(x[0].is_finite() && x[1].is_finite())) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name}[{i}] = ({}, {}) is not finite", v[i][0], v[i][1]);
    }
    Ok(())
}
