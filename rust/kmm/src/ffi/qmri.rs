//! Exported qMRI functions: FISP and pSSFP dictionary simulation and dictionary matching on a
//! manager's buffers. Host backend: the CPU reference runs in the order of the manager's stream.
//! CUDA backend: kernels compiled at run time run on the manager's stream. Either way the calls
//! return once the work is queued; synchronize the manager (or record an event) before reading
//! the outputs on the host.

use super::registry::with_manager;
use super::types::{KmmBuffer, KmmManager};
use super::{boundary, check_flags};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::qmri::{self, Compression, Fisp, MatchBuffers, Pssfp};

/// `flags` bit of the simulation calls: skip the check of the atom parameters (T1, T2 > 0, B1
/// and B0 finite). The check copies the parameters to the host and waits for the stream; skip
/// it in tight loops over parameters already checked. Bad atoms then give NaN signals.
pub const KMM_QMRI_SKIP_CHECKS: u32 = 1;

/// `flags` bit of `kmm_qmri_match`: the outputs already hold the results of earlier dictionary
/// batches; a voxel's results are replaced only where this batch scores strictly higher, and a
/// voxel this batch matches nothing in keeps them (one whose score is still negative gets the
/// no-match record: index -1, score 0). Needs `outputs->score`. Start with `score` filled with
/// -1 (or run the first batch without it).
pub const KMM_MATCH_ACCUMULATE: u32 = 1;

/// `flags` bit of `kmm_qmri_match_in_basis`: skip the check that the basis' columns are
/// orthonormal (it copies the basis to the host and waits for the stream).
pub const KMM_MATCH_SKIP_CHECKS: u32 = 2;

/// Output buffers of `kmm_qmri_match`, one entry per voxel; 0 leaves an output out. A voxel
/// that matches no atom (a zero or non-finite signal, or a dictionary of zero or non-finite
/// atoms) gets index -1, score 0, PD 0 and a record of zeros.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct KmmMatchOutputs {
    /// int32: 0-based index of the best atom, counting from the start of the whole dictionary
    /// (`atom_offset` added), or -1 when no atom matches. Required.
    pub index: KmmBuffer,
    /// float: |d^H x| / (||d|| ||x||), 1 for a perfect match, 0 when nothing matches. Compressed
    /// on a basis U, d is the atom's projection U U^H d and x the whole (uncompressed) signal.
    pub score: KmmBuffer,
    /// complex float: d^H x / ||d||, the proton density relative to the normalised atom (its
    /// projection when compressed).
    pub pd: KmmBuffer,
    /// Four floats (T1, T2, B1, B0): the best atom's record from `params`.
    pub params: KmmBuffer,
}

/// A gradient-spoiled FISP sequence with adiabatic inversion (BlochSimulators' FISP2D),
/// simulated with the extended phase graph. Times in seconds, angles in radians. The arrays are
/// host memory, read during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KmmFispSequence {
    /// `ntr` flip angles (rad).
    pub flip_angle: *const f32,
    /// `ntr` RF phases (rad), or NULL for all zero.
    pub phase: *const f32,
    /// `ntr x nprofile` flip-angle scale factors (TR index fastest), one column per position
    /// across the slice; signals are summed over positions. NULL when `nprofile` is 0 (one
    /// position, scale 1).
    pub profile: *const f32,
    /// Number of TRs (1 to 2^20).
    pub ntr: u32,
    /// EPG states kept, F+(k), conj(F-(k)), Z(k) for k < max_state (1 to 512).
    pub max_state: u32,
    /// Number of slice-profile positions (0 to 4096).
    pub nprofile: u32,
    /// Repetition time (s).
    pub tr: f32,
    /// Echo time (s), at most `tr`.
    pub te: f32,
    /// Delay between the inversion and the first RF pulse (s).
    pub ti: f32,
}

/// A balanced pSSFP sequence (BlochSimulators' pSSFP2D) simulated with isochromats: B1-scaled
/// inversion, an alpha/2 prepulse, then per TR an RF pulse in `nrf` hard-pulse sub-steps with
/// slice-select gradient, precession to TE, a sample of m_x + i m_y, precession to the next RF.
/// Signals are summed over the slice positions `z`. Arrays are host memory, read during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KmmPssfpSequence {
    /// `ntr` flip angles (rad).
    pub flip_angle: *const f32,
    /// `ntr` RF phases (rad), or NULL for all zero.
    pub phase: *const f32,
    /// `nrf` fractions of the flip angle, one per RF sub-step (summing to 1 for the nominal angle).
    pub rf_shape: *const f32,
    /// `nz` positions across the slice (cm).
    pub z: *const f32,
    /// Number of TRs (1 to 2^20).
    pub ntr: u32,
    /// RF sub-steps per pulse (1 to 4096).
    pub nrf: u32,
    /// Slice positions (1 to 4096).
    pub nz: u32,
    /// Duration of one RF sub-step (s).
    pub dt_ex: f32,
    /// Inversion delay (s).
    pub dt_inv: f32,
    /// From the end of the RF pulse to TE, and from TE to the next pulse (s).
    pub dt_pr: f32,
    /// Slice-select gradient area of one RF sub-step, gamma * G * dt (rad/cm).
    pub gz_ex: f32,
    /// Gradient area from the end of the RF pulse to TE (rad/cm); the sequence is balanced.
    pub gz_pr: f32,
}

/// Reads `n` values from C; NULL is allowed only when `n` is 0 or `or_zeros` is set.
unsafe fn floats(ptr: *const f32, n: usize, name: &str, or_zeros: bool) -> Result<Vec<f32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() && !or_zeros {
        fail!(KMM_ERROR_NULL_POINTER, "{name} is NULL but holds {n} values");
    }
    // A profile may be 2^32 values (16 GiB): a host that lacks the memory gets an error, not an abort.
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        fail!(KMM_ERROR_OUT_OF_MEMORY, "{name}: no host memory for a copy of its {n} values");
    }
    if ptr.is_null() {
        v.resize(n, 0.0);
    } else {
        v.extend_from_slice(std::slice::from_raw_parts(ptr, n));
    }
    Ok(v)
}

impl KmmFispSequence {
    /// The C view of a Rust sequence (the inverse of `read`), valid while `fisp` lives: for Rust
    /// callers of the C ABI (benchmarks, tests).
    pub fn view(fisp: &Fisp) -> KmmFispSequence {
        let ntr = fisp.flip.len() as u32;
        KmmFispSequence {
            flip_angle: fisp.flip.as_ptr(),
            phase: fisp.phase.as_ptr(),
            profile: if fisp.profile.is_empty() { std::ptr::null() } else { fisp.profile.as_ptr() },
            ntr,
            max_state: fisp.max_state,
            nprofile: if ntr == 0 { 0 } else { fisp.profile.len() as u32 / ntr },
            tr: fisp.tr,
            te: fisp.te,
            ti: fisp.ti,
        }
    }

    /// # Safety
    /// The pointers hold the counts the fields give.
    pub(crate) unsafe fn read(&self) -> Result<Fisp> {
        if self.ntr == 0 || self.ntr > qmri::MAX_TRS {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.ntr = {} must be in 1..={}", self.ntr, qmri::MAX_TRS);
        }
        if self.nprofile > qmri::MAX_POSITIONS {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "seq.nprofile = {} must be in 0..={}", self.nprofile, qmri::MAX_POSITIONS);
        }
        let fisp = Fisp {
            flip: floats(self.flip_angle, self.ntr as usize, "seq.flip_angle", false)?,
            phase: floats(self.phase, self.ntr as usize, "seq.phase", true)?,
            tr: self.tr,
            te: self.te,
            ti: self.ti,
            max_state: self.max_state,
            profile: floats(self.profile, self.ntr as usize * self.nprofile as usize, "seq.profile", false)?,
        };
        fisp.validate()?;
        Ok(fisp)
    }
}

impl KmmPssfpSequence {
    /// The C view of a Rust sequence (the inverse of `read`), valid while `p` lives.
    pub fn view(p: &Pssfp) -> KmmPssfpSequence {
        KmmPssfpSequence {
            flip_angle: p.flip.as_ptr(),
            phase: p.phase.as_ptr(),
            rf_shape: p.rf_shape.as_ptr(),
            z: p.z.as_ptr(),
            ntr: p.flip.len() as u32,
            nrf: p.rf_shape.len() as u32,
            nz: p.z.len() as u32,
            dt_ex: p.dt_ex,
            dt_inv: p.dt_inv,
            dt_pr: p.dt_pr,
            gz_ex: p.gz_ex,
            gz_pr: p.gz_pr,
        }
    }

    /// # Safety
    /// The pointers hold the counts the fields give.
    unsafe fn read(&self) -> Result<Pssfp> {
        for (name, n, max) in [("seq.ntr", self.ntr, qmri::MAX_TRS), ("seq.nrf", self.nrf, qmri::MAX_RF_STEPS), ("seq.nz", self.nz, qmri::MAX_POSITIONS)] {
            if n == 0 || n > max {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {n} must be in 1..={max}");
            }
        }
        let p = Pssfp {
            flip: floats(self.flip_angle, self.ntr as usize, "seq.flip_angle", false)?,
            phase: floats(self.phase, self.ntr as usize, "seq.phase", true)?,
            rf_shape: floats(self.rf_shape, self.nrf as usize, "seq.rf_shape", false)?,
            z: floats(self.z, self.nz as usize, "seq.z", false)?,
            dt_ex: self.dt_ex,
            dt_inv: self.dt_inv,
            dt_pr: self.dt_pr,
            gz_ex: self.gz_ex,
            gz_pr: self.gz_pr,
        };
        p.validate()?;
        Ok(p)
    }
}

type Simulation<Q> = fn(&crate::manager::Manager, &Q, u64, u64, u64, u64, bool) -> Result<()>;

/// The body both simulation exports share: flags, the sequence struct read and checked, the
/// manager looked up. `buffers` is [params, first_atom, natoms, out].
fn simulate<S, Q>(
    manager: KmmManager,
    seq: *const S,
    read: unsafe fn(&S) -> Result<Q>,
    run: Simulation<Q>,
    buffers: [u64; 4],
    flags: u32,
) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_QMRI_SKIP_CHECKS, "flags")?;
        // SAFETY: the caller's arrays hold the counts the struct gives (documented).
        let seq = unsafe { read(sequence(seq)?)? };
        let check = flags & KMM_QMRI_SKIP_CHECKS == 0;
        let [params, first_atom, natoms, out] = buffers;
        with_manager(manager, |m| run(m, &seq, params, first_atom, natoms, out, check))
    })
}

fn sequence<'a, T>(seq: *const T) -> Result<&'a T> {
    if seq.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "seq is NULL");
    }
    // SAFETY: non-null, points to the caller's struct.
    Ok(unsafe { &*seq })
}

/// Simulates the FISP signals of atoms `first_atom .. first_atom + natoms` of `params` into
/// `out`: `ntr x natoms` complex float (re, im pairs; TR index fastest; column 0 is atom
/// `first_atom`). `params` holds records of four floats (T1 s, T2 s, B1 relative, B0 Hz); T1
/// and T2 must be > 0 (+Inf allowed), B1 and B0 finite, unless `flags` has
/// `KMM_QMRI_SKIP_CHECKS`. Large dictionaries go in batches: all parameters in one buffer, one
/// output buffer per batch, each batch matched with `KMM_MATCH_ACCUMULATE`. Queued on the
/// manager's stream; returns once queued (after a wait for the parameter check). On CUDA the
/// kernel is compiled once per state count and threads per atom (NVRTC, cached): 1 to 4 threads
/// per atom of 32 states as `natoms` fills the GPU more or less (a smaller last batch may compile
/// a second layout); `KMM_FISP_LANES` (1 to 32) sets the threads per atom for tuning.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_simulate_fisp(
    manager: KmmManager,
    seq: *const KmmFispSequence,
    params: KmmBuffer,
    first_atom: u64,
    natoms: u64,
    out: KmmBuffer,
    flags: u32,
) -> KmmStatus {
    simulate(manager, seq, KmmFispSequence::read, qmri::simulate_fisp, [params, first_atom, natoms, out], flags)
}

/// Simulates the pSSFP signals of `natoms` atoms into `out` (`ntr x natoms` complex float), as
/// `kmm_qmri_simulate_fisp` does for FISP.
#[no_mangle]
pub extern "C" fn kmm_qmri_simulate_pssfp(
    manager: KmmManager,
    seq: *const KmmPssfpSequence,
    params: KmmBuffer,
    first_atom: u64,
    natoms: u64,
    out: KmmBuffer,
    flags: u32,
) -> KmmStatus {
    simulate(manager, seq, KmmPssfpSequence::read, qmri::simulate_pssfp, [params, first_atom, natoms, out], flags)
}

/// Dictionary matching. `dictionary` holds `ntr x natoms` complex float (one atom per column:
/// atoms `atom_offset .. atom_offset + natoms` of the whole dictionary), `signals` holds
/// `ntr x nvoxels`. For each voxel signal x, finds the atom j maximising |d_j^H x| / ||d_j||
/// and writes the `outputs` (see `KmmMatchOutputs`; `index` is required). `params` holds the
/// whole dictionary's atom records (at least `atom_offset + natoms`), or 0 when
/// `outputs->params` is 0. Ties go to the lower index; zero and non-finite atoms never match.
/// `rank` in 1..=ntr first projects dictionary and signals on the dominant rank-`rank`
/// subspace of this dictionary's TR space (SVD compression); 0 (and ntr, whose subspace is the
/// whole space) matches uncompressed. Compressed,
/// each atom is matched as its projection on the basis, and scores use the norm of the whole
/// signal, so that they are cosines comparable between batches. A dictionary matched
/// in batches should share one basis: `kmm_qmri_compression_basis` once, then
/// `kmm_qmri_match_in_basis` per batch. `flags`: `KMM_MATCH_ACCUMULATE` to merge with earlier
/// batches. On CUDA: cuBLAS CGEMM in voxel chunks (scratch of natoms x chunk complex values, at
/// most half the free memory and `$KMM_MATCH_SCRATCH_BYTES`, default 2 GiB), then a reduction
/// kernel; `KMM_MATCH_MATH=tf32` lets cuBLAS use TF32 tensor cores. Compressed to rank 32 or
/// less, one fused kernel computes the inner products and keeps the best atom, with no scratch
/// (`KMM_MATCH_FUSED=0` uses GEMM and reduction instead). Queued on the manager's
/// stream (a compressed match that computes its own basis waits once). Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_match(
    manager: KmmManager,
    dictionary: KmmBuffer,
    ntr: u64,
    natoms: u64,
    atom_offset: u64,
    signals: KmmBuffer,
    nvoxels: u64,
    rank: u32,
    params: KmmBuffer,
    outputs: *const KmmMatchOutputs,
    flags: u32,
) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_MATCH_ACCUMULATE, "flags")?;
        let compression = if rank == 0 { Compression::Full } else { Compression::OwnBasis(rank as usize) };
        let outs = match_buffers(outputs, params, atom_offset, flags)?;
        with_manager(manager, |m| qmri::match_dictionary(m, dictionary, ntr, natoms, signals, nvoxels, compression, false, outs))
    })
}

/// Writes the compression basis of a dictionary (`ntr x natoms` complex float) into `basis`:
/// `ntr x rank` complex float (TR index fastest), the orthonormal basis of the dominant
/// rank-`rank` subspace of the atoms' TR space (1 <= rank <= ntr). Compute it once from the
/// whole dictionary or a representative sample of its atoms (a few thousand spread over the
/// parameter grid), then match every batch with `kmm_qmri_match_in_basis`. On CUDA: a
/// randomized range finder (3 power iterations whose products use TF32 tensor cores,
/// `KMM_BASIS_MATH=fp32` for FP32, `KMM_BASIS_ITERATIONS` for another count) and a
/// Rayleigh-Ritz step in FP32 by cuSOLVER; the call waits once, for the eigensolver's status
/// (for the Gram matrix where cuSOLVER is missing). Queued on the manager's stream otherwise.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_compression_basis(
    manager: KmmManager,
    dictionary: KmmBuffer,
    ntr: u64,
    natoms: u64,
    rank: u32,
    basis: KmmBuffer,
) -> KmmStatus {
    boundary(|| with_manager(manager, |m| qmri::compression_basis(m, dictionary, ntr, natoms, rank as u64, basis)))
}

/// `kmm_qmri_match` on the coordinates of atoms and signals in a given basis (`ntr x rank`
/// complex float with orthonormal columns, as `kmm_qmri_compression_basis` writes it): the
/// scores of every batch matched in one basis are comparable, so `KMM_MATCH_ACCUMULATE` keeps
/// the true best. The basis is read and checked first (the call then waits for the stream)
/// unless `flags` has `KMM_MATCH_SKIP_CHECKS`; a basis that is not orthonormal gives
/// `INVALID_ARGUMENT`. Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_qmri_match_in_basis(
    manager: KmmManager,
    dictionary: KmmBuffer,
    ntr: u64,
    natoms: u64,
    atom_offset: u64,
    signals: KmmBuffer,
    nvoxels: u64,
    basis: KmmBuffer,
    rank: u32,
    params: KmmBuffer,
    outputs: *const KmmMatchOutputs,
    flags: u32,
) -> KmmStatus {
    boundary(|| {
        check_flags(flags, KMM_MATCH_ACCUMULATE | KMM_MATCH_SKIP_CHECKS, "flags")?;
        let outs = match_buffers(outputs, params, atom_offset, flags)?;
        let compression = Compression::Basis { handle: basis, rank: rank as usize };
        let check = flags & KMM_MATCH_SKIP_CHECKS == 0;
        with_manager(manager, |m| qmri::match_dictionary(m, dictionary, ntr, natoms, signals, nvoxels, compression, check, outs))
    })
}

fn match_buffers(outputs: *const KmmMatchOutputs, params: KmmBuffer, atom_offset: u64, flags: u32) -> Result<MatchBuffers> {
    if outputs.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "outputs is NULL");
    }
    // SAFETY: non-null, the caller's struct.
    let o = unsafe { *outputs };
    Ok(MatchBuffers {
        index: o.index,
        score: o.score,
        pd: o.pd,
        params,
        out_params: o.params,
        atom_offset,
        accumulate: flags & KMM_MATCH_ACCUMULATE != 0,
    })
}
