//! k-space trajectories: one readout per TR, `nsamples` samples per readout.
//!
//! k-space positions are in rad/m (the phase of a voxel at position x is -k·x, see
//! [`super::signal`]). Sample `s` of a readout is taken at time t_s = (s - nsamples/2) dt
//! relative to the echo (TE, the middle of the readout; nsamples/2 in real arithmetic, so for odd
//! `nsamples` the echo falls between two samples).

use super::{check_finite, check_len};
use crate::error::Result;
use crate::fail;

/// A Cartesian trajectory: readout `r` starts at `k0[r]` and moves by `dk[r]` per sample,
/// `k[r, s] = k0[r] + s dk[r]`. Phase encoding is the ky of `k0` varying over readouts; a
/// conventional readout has `dk = (Δkx, 0)` and `k0 = (-nsamples/2 Δkx, ky(r))`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cartesian {
    pub nsamples: usize,
    /// Sample spacing (s).
    pub dt: f64,
    /// Start of each readout, (kx, ky) in rad/m, `nreadouts` entries.
    pub k0: Vec<[f64; 2]>,
    /// Step along each readout, (Δkx, Δky) in rad/m per sample, `nreadouts` entries.
    pub dk: Vec<[f64; 2]>,
}

/// An arbitrary (spiral, radial, ...) trajectory: every sample's k-space position given.
#[derive(Debug, Clone, PartialEq)]
pub struct Spiral {
    pub nsamples: usize,
    /// Sample spacing (s).
    pub dt: f64,
    /// (kx, ky) in rad/m of sample `s` of readout `r` at `k[r * nsamples + s]`
    /// (`nsamples x nreadouts`, sample fastest).
    pub k: Vec<[f64; 2]>,
}

/// The trajectory of an MR-STAT acquisition.
#[derive(Debug, Clone, PartialEq)]
pub enum Trajectory {
    Cartesian(Cartesian),
    Spiral(Spiral),
}

impl Trajectory {
    pub fn nsamples(&self) -> usize {
        match self {
            Trajectory::Cartesian(c) => c.nsamples,
            Trajectory::Spiral(s) => s.nsamples,
        }
    }
    pub fn nreadouts(&self) -> usize {
        match self {
            Trajectory::Cartesian(c) => c.k0.len(),
            Trajectory::Spiral(s) => s.k.len() / s.nsamples.max(1),
        }
    }
    /// Sample spacing (s).
    pub fn dt(&self) -> f64 {
        match self {
            Trajectory::Cartesian(c) => c.dt,
            Trajectory::Spiral(s) => s.dt,
        }
    }
    /// Time of sample `s` relative to the echo (s): (s - nsamples/2) dt.
    pub fn time(&self, s: usize) -> f64 {
        (s as f64 - self.nsamples() as f64 / 2.0) * self.dt()
    }
    /// The k-space position (kx, ky) of sample `s` of readout `r` (rad/m).
    pub fn k(&self, r: usize, s: usize) -> [f64; 2] {
        match self {
            Trajectory::Cartesian(c) => {
                let (k0, dk, s) = (c.k0[r], c.dk[r], s as f64);
                [k0[0] + s * dk[0], k0[1] + s * dk[1]]
            }
            Trajectory::Spiral(sp) => sp.k[r * sp.nsamples + s],
        }
    }

    /// Checks sizes (nsamples >= 1, nreadouts >= 1, matching lengths), dt finite and >= 0, and
    /// finite k-space positions.
    pub fn validate(&self) -> Result<()> {
        let ns = self.nsamples();
        if ns == 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "trajectory.nsamples = 0 must be >= 1");
        }
        let dt = self.dt();
        if !(dt.is_finite() && dt >= 0.0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "trajectory.dt = {dt} must be finite and >= 0");
        }
        match self {
            Trajectory::Cartesian(c) => {
                if c.k0.is_empty() {
                    fail!(KMM_ERROR_INVALID_ARGUMENT, "trajectory.k0 is empty: nreadouts must be >= 1");
                }
                check_len("trajectory.dk", &c.dk, c.k0.len(), "nreadouts (the length of trajectory.k0)")?;
                check_finite("trajectory.k0 (flattened kx, ky)", c.k0.as_flattened())?;
                check_finite("trajectory.dk (flattened kx, ky)", c.dk.as_flattened())?;
            }
            Trajectory::Spiral(s) => {
                if s.k.is_empty() || s.k.len() % ns != 0 {
                    fail!(
                        KMM_ERROR_INVALID_ARGUMENT,
                        "trajectory.k has {} entries: it must be nsamples ({ns}) x nreadouts with nreadouts >= 1",
                        s.k.len()
                    );
                }
                check_finite("trajectory.k (flattened kx, ky)", s.k.as_flattened())?;
            }
        }
        Ok(())
    }
}
