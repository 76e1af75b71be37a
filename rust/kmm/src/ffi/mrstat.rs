//! Exported MR-STAT operations: the FISP magnetization with its exact T1 and T2 derivatives, the
//! k-space signal of a magnetization, and the Jacobian of that signal (J·v and Re(Jᴴw)) with
//! respect to T1, T2 and the proton density of every voxel. Each call reads and checks the model
//! on the host first (it waits for the manager's stream); the host backend then computes in
//! f64 (and refuses non-finite magnetizations and vectors), the CUDA backend queues f32 kernels
//! (non-finite inputs there give non-finite outputs). See `qmri::mrstat` for the model and its
//! sign conventions.

use super::qmri::KmmFispSequence;
use super::registry::with_manager;
use super::types::{KmmBuffer, KmmManager};
use super::{boundary, check_flags};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::qmri::mrstat_run::{self, ModelBuffers, TrajectoryKind};

/// `KmmMrstatModel::trajectory`: readouts along straight lines, `kspace` holding per readout
/// its start k0 and step dk, (kx, ky) each: `k0[0], dk[0], k0[1], dk[1], ...`.
pub const KMM_TRAJECTORY_CARTESIAN: u32 = 0;
/// `KmmMrstatModel::trajectory`: every sample's (kx, ky) given, `nsamples x nreadouts`,
/// sample fastest (spiral, radial, ...).
pub const KMM_TRAJECTORY_SPIRAL: u32 = 1;

/// An MR-STAT acquisition on a manager's buffers. The signal of voxel v in coil c at sample s
/// of readout r is C[c,v] ρ_v m_v(r) exp(-t_s/T2_v) exp(i 2π B0_v t_s) exp(-i (kx x_v + ky y_v)),
/// with t_s = (s - nsamples/2) dt the time from the echo. Units: m, s, Hz, rad/m.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct KmmMrstatModel {
    pub nvoxels: u64,
    /// One readout per TR.
    pub nreadouts: u64,
    /// Samples per readout.
    pub nsamples: u64,
    pub ncoils: u64,
    /// `nvoxels` records of six floats: x (m), y (m), T2 (s), B0 (Hz), Re ρ, Im ρ.
    pub voxels: KmmBuffer,
    /// Coil sensitivities: `nvoxels x ncoils` complex float, voxel fastest.
    pub coils: KmmBuffer,
    /// `KMM_TRAJECTORY_CARTESIAN` or `KMM_TRAJECTORY_SPIRAL`.
    pub trajectory: u32,
    /// Time between samples (s).
    pub dt: f32,
    /// k-space positions (complex float pairs (kx, ky), rad/m), laid out as `trajectory` says.
    pub kspace: KmmBuffer,
}

fn model(model: *const KmmMrstatModel) -> Result<ModelBuffers> {
    if model.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "model is NULL");
    }
    // SAFETY: non-null, the caller's struct.
    let b = unsafe { *model };
    let trajectory = match b.trajectory {
        KMM_TRAJECTORY_CARTESIAN => TrajectoryKind::Cartesian,
        KMM_TRAJECTORY_SPIRAL => TrajectoryKind::Spiral,
        t => fail!(KMM_ERROR_INVALID_ARGUMENT, "model->trajectory = {t} must be KMM_TRAJECTORY_CARTESIAN (0) or KMM_TRAJECTORY_SPIRAL (1)"),
    };
    Ok(ModelBuffers {
        nvoxels: b.nvoxels,
        nreadouts: b.nreadouts,
        nsamples: b.nsamples,
        ncoils: b.ncoils,
        voxels: b.voxels,
        coils: b.coils,
        trajectory,
        dt: b.dt,
        kspace: b.kspace,
    })
}

/// The FISP echo magnetization of atoms `first_atom .. first_atom + natoms` of `params`
/// (records of four floats: T1 s, T2 s, B1, B0 Hz) into `m` (`ntr x natoms` complex float), and
/// its exact derivatives (forward-mode automatic differentiation, not finite differences) with
/// respect to T1 into `dm_dt1` and T2 into `dm_dt2` (same shape; 0 leaves one out). Computed in
/// f64 on the host backend, in f32 kernels with dual numbers on CUDA (there `seq.max_state`
/// at most 64). `flags` must be 0. Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_fisp_derivatives(
    manager: KmmManager,
    seq: *const KmmFispSequence,
    params: KmmBuffer,
    first_atom: u64,
    natoms: u64,
    m: KmmBuffer,
    dm_dt1: KmmBuffer,
    dm_dt2: KmmBuffer,
    flags: u32,
) -> KmmStatus {
    boundary(|| {
        check_flags(flags, 0, "flags")?;
        if seq.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "seq is NULL");
        }
        // SAFETY: non-null; the caller's arrays hold the counts the struct gives (documented).
        let seq = unsafe { (*seq).read()? };
        with_manager(manager, |mm| mrstat_run::fisp_derivatives(mm, &seq, params, first_atom, natoms, m, dm_dt1, dm_dt2))
    })
}

/// The k-space signal of the magnetization `m` (`nreadouts x nvoxels` complex float, readout
/// fastest) into `out` (`nsamples x nreadouts x ncoils` complex float, sample fastest).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_mrstat_signal(manager: KmmManager, model: *const KmmMrstatModel, m: KmmBuffer, out: KmmBuffer) -> KmmStatus {
    boundary(|| {
        let b = self::model(model)?;
        with_manager(manager, |mm| mrstat_run::signal(mm, &b, m, out))
    })
}

/// J·v, the Jacobian of the signal with respect to (T1, T2, Re ρ, Im ρ) of every voxel applied
/// to `v` (`4 x nvoxels` float, parameter fastest), into `out` (signal-shaped). `m`, `dm_dt1`
/// and `dm_dt2` are the magnetization and its derivatives (from `kmm_qmri_fisp_derivatives`).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_jacobian_mul(
    manager: KmmManager,
    model: *const KmmMrstatModel,
    m: KmmBuffer,
    dm_dt1: KmmBuffer,
    dm_dt2: KmmBuffer,
    v: KmmBuffer,
    out: KmmBuffer,
) -> KmmStatus {
    boundary(|| {
        let b = self::model(model)?;
        with_manager(manager, |mm| mrstat_run::jacobian_mul(mm, &b, [m, dm_dt1, dm_dt2], v, out))
    })
}

/// Re(Jᴴw): the adjoint of `kmm_qmri_jacobian_mul` (in the real sense) applied to a
/// signal-shaped `w`, into `out` (`4 x nvoxels` float). Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_jacobian_adjoint_mul(
    manager: KmmManager,
    model: *const KmmMrstatModel,
    m: KmmBuffer,
    dm_dt1: KmmBuffer,
    dm_dt2: KmmBuffer,
    w: KmmBuffer,
    out: KmmBuffer,
) -> KmmStatus {
    boundary(|| {
        let b = self::model(model)?;
        with_manager(manager, |mm| mrstat_run::jacobian_adjoint_mul(mm, &b, [m, dm_dt1, dm_dt2], w, out))
    })
}
