//! Quantitative-MRI compute on a manager's buffers: EPG FISP and isochromat pSSFP dictionary
//! simulation (the physics of BlochSimulators.jl's FISP2D and pSSFP2D) and dictionary matching.
//! [`cpu`] is the reference (rayon, f64 inside); on the CUDA backend the kernels in [`gpu`] are
//! compiled at run time through [`crate::backend::cuda::module`] and launched on the manager's stream.
//!
//! Units: times in seconds, angles in radians, B0 in Hz, slice positions in cm. Atom parameters
//! are records of four f32 (T1, T2, B1, B0); signals are complex f32, TR index fastest.

pub mod cpu;
pub mod mrstat;
pub mod mrstat_run;
pub mod gpu;
mod gpu_mrstat;
mod gpu_svd;
/// The MR-STAT products alone, for the benchmark's floor.
pub use gpu_mrstat::BareProducts;
mod operands;
mod run;
pub mod svd;

pub use run::{compression_basis, match_dictionary, simulate_fisp, simulate_pssfp, Compression, MappedCompression, MatchAddrs, MatchBuffers};

use crate::error::Result;
use crate::fail;

/// Largest number of EPG states a FISP simulation may keep (`max_state`).
pub const MAX_STATES: u32 = 512;
/// Largest number of TRs of one sequence.
pub const MAX_TRS: u32 = 1 << 20;
/// Largest number of slice-profile positions (FISP) or slice positions (pSSFP).
pub const MAX_POSITIONS: u32 = 4096;
/// Largest number of RF sub-steps of one pSSFP excitation.
pub const MAX_RF_STEPS: u32 = 4096;

/// One tissue: relaxation times (s), relative transmit field, off-resonance (Hz).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Atom {
    pub t1: f32,
    pub t2: f32,
    pub b1: f32,
    pub b0: f32,
}

/// A gradient-spoiled FISP train with adiabatic inversion, simulated with EPG.
#[derive(Debug, Clone, PartialEq)]
pub struct Fisp {
    /// Flip angle of each TR (rad).
    pub flip: Vec<f32>,
    /// RF phase of each TR (rad).
    pub phase: Vec<f32>,
    pub tr: f32,
    pub te: f32,
    pub ti: f32,
    /// Number of EPG states kept (F+(k), conj F-(k), Z(k) for k < max_state).
    pub max_state: u32,
    /// Flip-angle scale factors, `ntr x npositions` (TR fastest); empty means one position of 1.
    pub profile: Vec<f32>,
}

impl Fisp {
    pub fn ntr(&self) -> usize {
        self.flip.len()
    }
    pub fn positions(&self) -> usize {
        if self.profile.is_empty() {
            1
        } else {
            self.profile.len() / self.ntr()
        }
    }
    /// Scale of the flip angle of TR `n` at profile position `p`.
    pub fn scale(&self, n: usize, p: usize) -> f32 {
        if self.profile.is_empty() {
            1.0
        } else {
            self.profile[p * self.ntr() + n]
        }
    }

    pub fn validate(&self) -> Result<()> {
        let ntr = self.flip.len();
        if ntr == 0 || ntr > MAX_TRS as usize {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.ntr = {ntr} must be in 1..={MAX_TRS}");
        }
        if self.phase.len() != ntr {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.phase has {} entries but seq.ntr = {ntr}", self.phase.len());
        }
        if !(1..=MAX_STATES).contains(&self.max_state) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.max_state = {} must be in 1..={MAX_STATES}", self.max_state);
        }
        finite_nonneg("seq.tr", self.tr)?;
        finite_nonneg("seq.te", self.te)?;
        finite_nonneg("seq.ti", self.ti)?;
        if self.te > self.tr {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.te = {} must be at most seq.tr = {}", self.te, self.tr);
        }
        if !self.profile.is_empty() && (self.profile.len() % ntr != 0 || self.profile.len() / ntr > MAX_POSITIONS as usize) {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "seq.profile has {} entries: it must be ntr ({ntr}) x npositions with npositions in 1..={MAX_POSITIONS}",
                self.profile.len()
            );
        }
        all_finite("seq.flip_angle", &self.flip)?;
        all_finite("seq.phase", &self.phase)?;
        all_finite("seq.profile", &self.profile)
    }
}

/// A balanced pSSFP train with inversion and alpha/2 prepulse, simulated with isochromats and
/// hard-pulse RF sub-steps, summed over slice positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Pssfp {
    /// Flip angle of each TR (rad).
    pub flip: Vec<f32>,
    /// RF phase of each TR (rad).
    pub phase: Vec<f32>,
    /// Fraction of the flip angle applied in each RF sub-step (sums to 1 for the nominal angle).
    pub rf_shape: Vec<f32>,
    /// Slice positions (cm).
    pub z: Vec<f32>,
    /// Duration of one RF sub-step, of the inversion delay, and of RF end to TE (= TE to next RF).
    pub dt_ex: f32,
    pub dt_inv: f32,
    pub dt_pr: f32,
    /// Slice-select gradient area per RF sub-step, and of the prephaser (gamma * G * dt, rad/cm).
    pub gz_ex: f32,
    pub gz_pr: f32,
}

impl Pssfp {
    pub fn ntr(&self) -> usize {
        self.flip.len()
    }
    pub fn validate(&self) -> Result<()> {
        let ntr = self.flip.len();
        if ntr == 0 || ntr > MAX_TRS as usize {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.ntr = {ntr} must be in 1..={MAX_TRS}");
        }
        if self.phase.len() != ntr {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.phase has {} entries but seq.ntr = {ntr}", self.phase.len());
        }
        if self.rf_shape.is_empty() || self.rf_shape.len() > MAX_RF_STEPS as usize {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.nrf = {} must be in 1..={MAX_RF_STEPS}", self.rf_shape.len());
        }
        if self.z.is_empty() || self.z.len() > MAX_POSITIONS as usize {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.nz = {} must be in 1..={MAX_POSITIONS}", self.z.len());
        }
        finite_nonneg("seq.dt_ex", self.dt_ex)?;
        finite_nonneg("seq.dt_inv", self.dt_inv)?;
        finite_nonneg("seq.dt_pr", self.dt_pr)?;
        if !self.gz_ex.is_finite() || !self.gz_pr.is_finite() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.gz_ex = {} and seq.gz_pr = {} must be finite", self.gz_ex, self.gz_pr);
        }
        all_finite("seq.flip_angle", &self.flip)?;
        all_finite("seq.phase", &self.phase)?;
        all_finite("seq.rf_shape", &self.rf_shape)?;
        all_finite("seq.z", &self.z)
    }
}

fn finite_nonneg(name: &str, v: f32) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {v} must be finite and >= 0");
    }
    Ok(())
}

fn all_finite(name: &str, v: &[f32]) -> Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name}[{i}] = {} is not finite", v[i]);
    }
    Ok(())
}

/// Checks atom parameters: T1, T2 > 0 (infinity allowed: no relaxation), B1 and B0 finite.
pub fn validate_atoms(atoms: &[Atom]) -> Result<()> {
    for (i, a) in atoms.iter().enumerate() {
        if !(a.t1 > 0.0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "params: atom {i} (counted from 0) has T1 = {}; T1 must be > 0 (+Inf allowed)", a.t1);
        }
        if !(a.t2 > 0.0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "params: atom {i} (counted from 0) has T2 = {}; T2 must be > 0 (+Inf allowed)", a.t2);
        }
        if !a.b1.is_finite() || !a.b0.is_finite() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "params: atom {i} (counted from 0) has B1 = {}, B0 = {}; both must be finite", a.b1, a.b0);
        }
    }
    Ok(())
}
