//! MR-STAT operations on a manager's buffers: the magnetization and its derivatives, the k-space
//! signal, the Jacobian J·v and its adjoint Re(Jᴴw). The math is [`super::mrstat`] (f64).
//!
//! Every call first checks the model (voxels, coils, trajectory), in the order of the manager's
//! stream (it waits for the work queued before it). On the host backend it reads the model and
//! checks it there, then computes in f64 on the calling thread (rayon inside) and writes its
//! outputs in stream order before returning. On CUDA only the trajectory comes to the host; the
//! voxel records and coils are checked on the device (a bad value is then named by the host's
//! check), and the kernels of [`super::gpu_mrstat`] (f32 data, double where sums need it) are
//! queued on the manager's stream.

use super::mrstat::{self, AtomF64, Cartesian, Model, Param, Spiral, Trajectory, VoxelParam, Voxels};
use super::gpu::Scratch;
use super::gpu_mrstat;
use super::operands::{check_disjoint, Operand};
use super::run::Pins;
use super::{Atom, Fisp};
use crate::backend::BackendKind;
use crate::error::Result;
use crate::fail;
use crate::manager::copy::Completion;
use crate::manager::Manager;

/// Floats per voxel record of a model: x (m), y (m), T2 (s), B0 (Hz), Re ρ, Im ρ.
const VOXEL_FLOATS: u64 = 6;

/// The parameters of the Jacobian, in the order of a parameter vector (fastest per voxel).
const JACOBIAN_PARAMS: [VoxelParam; 4] = [VoxelParam::T1, VoxelParam::T2, VoxelParam::RhoRe, VoxelParam::RhoIm];

/// How readouts move through k-space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrajectoryKind {
    /// `kspace` holds per readout the start k0 and the step dk along the readout (2 x nreadouts
    /// (kx, ky) pairs: k0[0], dk[0], k0[1], dk[1], ...).
    Cartesian,
    /// `kspace` holds every sample's position (nsamples x nreadouts (kx, ky) pairs).
    Spiral,
}

/// An acquisition on a manager's buffers (the C ABI's `KmmMrstatModel`).
#[derive(Debug, Clone, Copy)]
pub struct ModelBuffers {
    pub nvoxels: u64,
    pub nreadouts: u64,
    pub nsamples: u64,
    pub ncoils: u64,
    /// `nvoxels` records of [`VOXEL_FLOATS`] floats.
    pub voxels: u64,
    /// `nvoxels x ncoils` complex float, voxel fastest.
    pub coils: u64,
    pub trajectory: TrajectoryKind,
    /// Time between samples (s).
    pub dt: f32,
    pub kspace: u64,
}

fn on_cuda(m: &Manager) -> bool {
    m.backend_kind() == BackendKind::Cuda
}

/// Reads `count` values of `T` from the start of `handle`, in stream order (waits).
fn read<T: Copy + Default>(m: &Manager, handle: u64, count: u64, name: &str) -> Result<Vec<T>> {
    let each = std::mem::size_of::<T>() as u64;
    let bytes = count.checked_mul(each).filter(|&b| b <= crate::manager::MAX_BUFFER_BYTES);
    let Some(bytes) = bytes else { fail!(KMM_ERROR_SIZE_OVERFLOW, "{name}: {count} x {each} bytes exceeds the largest buffer") };
    let (_, size, _, _) = m.buffer_info(handle)?;
    if size < bytes {
        fail!(KMM_ERROR_OUT_OF_RANGE, "{name} holds {size} bytes but needs {bytes} ({count} x {each})");
    }
    let mut v = vec![T::default(); count as usize];
    // SAFETY: `v` has room for `bytes`; the copy completes before return.
    unsafe { m.copy_to_host(v.as_mut_ptr() as *mut u8, handle, 0, bytes, Completion::Wait)? };
    Ok(v)
}

/// Checks that `handle` holds `count` values of `T`.
fn check_room<T>(m: &Manager, handle: u64, count: u64, name: &str) -> Result<()> {
    let bytes = count.saturating_mul(std::mem::size_of::<T>() as u64);
    let (_, size, _, _) = m.buffer_info(handle)?;
    if size < bytes {
        fail!(KMM_ERROR_OUT_OF_RANGE, "{name} holds {size} bytes but needs {bytes}");
    }
    Ok(())
}

/// Writes `data` to the start of `handle` in stream order and waits for the copy: the host
/// stream copies from `data` when it runs, after this function has dropped it otherwise.
fn write<T: Copy>(m: &Manager, handle: u64, data: &[T]) -> Result<()> {
    // SAFETY: `data` is valid for its bytes; the copy completes before return.
    unsafe { m.copy_to_device(handle, 0, data.as_ptr() as *const u8, std::mem::size_of_val(data) as u64, Completion::Wait)? };
    Ok(())
}

fn c64(v: &[[f32; 2]]) -> Vec<[f64; 2]> {
    v.iter().map(|c| [c[0] as f64, c[1] as f64]).collect()
}

fn c32(v: &[[f64; 2]]) -> Vec<[f32; 2]> {
    v.iter().map(|c| [c[0] as f32, c[1] as f32]).collect()
}

fn nonzero(name: &str, n: u64) -> Result<()> {
    if n == 0 || n > i32::MAX as u64 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {n} must be in 1..={}", i32::MAX);
    }
    Ok(())
}

/// The model read from its buffers (in stream order) and checked.
struct HostModel {
    voxels: Voxels,
    coils: Vec<[f64; 2]>,
    traj: Trajectory,
}

/// Checks the model's counts and dt.
fn check_counts(b: &ModelBuffers) -> Result<()> {
    nonzero("model->nvoxels", b.nvoxels)?;
    nonzero("model->nreadouts", b.nreadouts)?;
    nonzero("model->nsamples", b.nsamples)?;
    nonzero("model->ncoils", b.ncoils)?;
    if !(b.dt.is_finite() && b.dt > 0.0) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "model->dt = {} must be finite and > 0 (s)", b.dt);
    }
    Ok(())
}

/// Reads the trajectory from its buffer (in stream order).
fn read_trajectory(m: &Manager, b: &ModelBuffers) -> Result<Trajectory> {
    let (ns, dt) = (b.nsamples as usize, b.dt as f64);
    let traj = match b.trajectory {
        TrajectoryKind::Cartesian => {
            let k = c64(&read::<[f32; 2]>(m, b.kspace, 2 * b.nreadouts, "model->kspace")?);
            Trajectory::Cartesian(Cartesian { nsamples: ns, dt, k0: k.iter().step_by(2).copied().collect(), dk: k.iter().skip(1).step_by(2).copied().collect() })
        }
        TrajectoryKind::Spiral => {
            let k = c64(&read::<[f32; 2]>(m, b.kspace, b.nreadouts.saturating_mul(b.nsamples), "model->kspace")?);
            Trajectory::Spiral(Spiral { nsamples: ns, dt, k })
        }
    };
    Ok(traj)
}

/// `Trajectory::validate`, its message prefixed as the model's.
fn check_trajectory(traj: &Trajectory) -> Result<()> {
    traj.validate().map_err(|mut e| {
        e.message = format!("model: {}", e.message);
        e
    })
}

impl HostModel {
    fn read(m: &Manager, b: &ModelBuffers) -> Result<HostModel> {
        check_counts(b)?;
        let rec: Vec<f32> = read(m, b.voxels, b.nvoxels.saturating_mul(VOXEL_FLOATS), "model->voxels")?;
        let field = |i: usize| rec.iter().skip(i).step_by(VOXEL_FLOATS as usize).map(|&x| x as f64).collect::<Vec<_>>();
        let (re, im) = (field(4), field(5));
        let voxels = Voxels { x: field(0), y: field(1), t2: field(2), b0: field(3), rho: re.iter().zip(&im).map(|(&a, &b)| [a, b]).collect() };
        let coils = c64(&read::<[f32; 2]>(m, b.coils, b.nvoxels.saturating_mul(b.ncoils), "model->coils")?);
        let nr = b.nreadouts as usize;
        let traj = read_trajectory(m, b)?;
        let hm = HostModel { voxels, coils, traj };
        hm.model().validate().map_err(|mut e| {
            e.message = format!("model: {}", e.message);
            e
        })?;
        debug_assert_eq!(hm.traj.nreadouts(), nr);
        Ok(hm)
    }
    fn model(&self) -> Model<'_> {
        Model { voxels: &self.voxels, coils: &self.coils, traj: &self.traj }
    }
}

/// The FISP magnetization of atoms `first_atom .. first_atom + natoms` of `params` (records of
/// T1, T2, B1, B0) into `m` (`ntr x natoms` complex float) and, where the handle is not 0, its
/// exact derivatives with respect to T1 and T2 into `dm_dt1` and `dm_dt2` (same shape).
#[allow(clippy::too_many_arguments)]
pub fn fisp_derivatives(m: &Manager, seq: &Fisp, params: u64, first_atom: u64, natoms: u64, out_m: u64, dm_dt1: u64, dm_dt2: u64) -> Result<()> {
    seq.validate()?;
    nonzero("natoms", natoms)?;
    let end = first_atom.checked_add(natoms).ok_or_else(|| crate::err!(KMM_ERROR_SIZE_OVERFLOW, "first_atom + natoms overflows"))?;
    let ntr = seq.ntr() as u64;
    let count = ntr.saturating_mul(natoms);
    check_room::<[f32; 2]>(m, out_m, count, "m")?;
    for (h, name) in [(dm_dt1, "dm_dt1"), (dm_dt2, "dm_dt2")] {
        if h != 0 {
            check_room::<[f32; 2]>(m, h, count, name)?;
        }
    }
    let bytes = count * 8;
    let outputs = [Operand::output("m", out_m, bytes), Operand::output("dm_dt1", dm_dt1, bytes), Operand::output("dm_dt2", dm_dt2, bytes)];
    check_disjoint(m, &[&[Operand::input("params", params, natoms * 16).at(first_atom.saturating_mul(16))][..], &outputs].concat())?;
    let all: Vec<Atom> = read(m, params, end, "params")?;
    let atoms: Vec<AtomF64> = all[first_atom as usize..].iter().map(|&a| a.into()).collect();
    mrstat::validate_atoms_f64(&atoms)?;
    if on_cuda(m) {
        let mut pins = Pins::new(m);
        let p = pins.map(params, end * 16, "params")? + first_atom * 16;
        let mut outs = [pins.map(out_m, bytes, "m")?, 0, 0];
        // The kernel writes all three: a left-out derivative goes to scratch.
        let mut scratch = Vec::new();
        for (i, h) in [(1, dm_dt1), (2, dm_dt2)] {
            outs[i] = if h != 0 {
                pins.map(h, bytes, if i == 1 { "dm_dt1" } else { "dm_dt2" })?
            } else {
                scratch.push(Scratch::new(m, bytes)?);
                scratch.last().expect("just pushed").addr
            };
        }
        return gpu_mrstat::fisp_derivatives(m, seq, p, natoms as usize, outs);
    }
    let n = count as usize;
    let (mut mm, mut dm) = (vec![[0f64; 2]; n], vec![[0f64; 2]; n]);
    for (h, p) in [(dm_dt1, Param::T1), (dm_dt2, Param::T2)] {
        if h != 0 {
            mrstat::fisp_derivatives_batch(seq, &atoms, p, &mut mm, &mut dm)?;
            write(m, h, &c32(&dm))?;
        }
    }
    if dm_dt1 == 0 && dm_dt2 == 0 {
        mrstat::simulate_fisp_f64(seq, &atoms, &mut mm)?;
    }
    write(m, out_m, &c32(&mm))
}

/// Refuses an output of an MR-STAT product that shares memory with the model, the
/// magnetization `mag` (its derivatives after it, 0 where the product takes none) or `input`.
fn check_model_disjoint(m: &Manager, b: &ModelBuffers, mag: [u64; 3], input: Operand, out: Operand) -> Result<()> {
    let (nv, mag_bytes) = (b.nvoxels, b.nreadouts.saturating_mul(b.nvoxels).saturating_mul(8));
    let kspace_pairs = match b.trajectory {
        TrajectoryKind::Cartesian => 2 * b.nreadouts,
        TrajectoryKind::Spiral => b.nreadouts.saturating_mul(b.nsamples),
    };
    check_disjoint(
        m,
        &[
            Operand::input("model->voxels", b.voxels, nv.saturating_mul(VOXEL_FLOATS * 4)),
            Operand::input("model->coils", b.coils, nv.saturating_mul(b.ncoils).saturating_mul(8)),
            Operand::input("model->kspace", b.kspace, kspace_pairs.saturating_mul(8)),
            Operand::input("m", mag[0], mag_bytes),
            Operand::input("dm_dt1", mag[1], mag_bytes),
            Operand::input("dm_dt2", mag[2], mag_bytes),
            input,
            out,
        ],
    )
}

/// Reads the magnetization and its T1 and T2 derivatives (`nreadouts x nvoxels` complex each).
fn read_magnetization(m: &Manager, b: &ModelBuffers, handles: [u64; 3]) -> Result<[Vec<[f64; 2]>; 3]> {
    let n = b.nreadouts.saturating_mul(b.nvoxels);
    let [a, d1, d2] = handles;
    Ok([c64(&read(m, a, n, "m")?), c64(&read(m, d1, n, "dm_dt1")?), c64(&read(m, d2, n, "dm_dt2")?)])
}

fn signal_len(b: &ModelBuffers) -> u64 {
    b.ncoils.saturating_mul(b.nreadouts).saturating_mul(b.nsamples)
}

/// The k-space signal of the magnetization `mag` (`nreadouts x nvoxels` complex float) into
/// `out` (`nsamples x nreadouts x ncoils` complex float, sample fastest).
pub fn signal(m: &Manager, b: &ModelBuffers, mag: u64, out: u64) -> Result<()> {
    let mag_len = b.nreadouts.saturating_mul(b.nvoxels);
    let disjoint = || check_model_disjoint(m, b, [mag, 0, 0], Operand::input("", 0, 0), Operand::output("out", out, signal_len(b) * 8));
    if on_cuda(m) {
        let mut pins = Pins::new(m);
        let dm = device_model(m, &mut pins, b)?;
        check_room::<[f32; 2]>(m, out, signal_len(b), "out")?;
        let (mg, o) = (pins.map(mag, mag_len * 8, "m")?, pins.map(out, signal_len(b) * 8, "out")?);
        disjoint()?;
        return dm.signal(m, mg, o);
    }
    let hm = HostModel::read(m, b)?;
    check_room::<[f32; 2]>(m, out, signal_len(b), "out")?;
    let mm = c64(&read(m, mag, mag_len, "m")?);
    disjoint()?;
    let mut s = vec![[0f64; 2]; signal_len(b) as usize];
    mrstat::signal(&hm.model(), &mm, &mut s)?;
    write(m, out, &c32(&s))
}

/// The model on the device, its voxel records and coils checked there (its buffers mapped
/// through `pins`): only the trajectory comes to the host. When the device finds a bad value,
/// the host reads and checks the whole model for the error to report.
fn device_model<'a>(m: &'a Manager, pins: &mut Pins<'a>, b: &ModelBuffers) -> Result<gpu_mrstat::DeviceModel<'a>> {
    check_counts(b)?;
    let (nv, nc) = (b.nvoxels, b.ncoils);
    let fits = |x: u64, y: u64| x.checked_mul(y).filter(|&n| n.checked_mul(16).is_some()).is_some();
    if !fits(b.nreadouts, nv) || !fits(nc.saturating_mul(b.nreadouts), b.nsamples) || !fits(nv, nc.max(VOXEL_FLOATS)) {
        fail!(KMM_ERROR_SIZE_OVERFLOW, "nvoxels = {nv}, ncoils = {nc}, nreadouts = {}, nsamples = {}: the array sizes overflow", b.nreadouts, b.nsamples);
    }
    // The host backend's order: the buffers' room (voxels, coils, k-space), then the values
    // (voxels, trajectory, coils).
    let records = pins.map(b.voxels, nv * VOXEL_FLOATS * 4, "model->voxels")?;
    let coils = pins.map(b.coils, nv * nc * 8, "model->coils")?;
    let traj = read_trajectory(m, b)?;
    match gpu_mrstat::DeviceModel::checked(m, records, coils, nv, nc, &traj)? {
        Ok(dm) => {
            check_trajectory(&traj)?;
            Ok(dm)
        }
        Err(found) => {
            // The host's check names the first bad value as the host backend would (the
            // trajectory's, when it comes before).
            HostModel::read(m, b)?;
            fail!(KMM_ERROR_INVALID_ARGUMENT, "model: {found} (the buffer changed while it was checked)");
        }
    }
}

/// Maps the magnetization and its derivatives for a kernel.
fn map_magnetization(pins: &mut Pins, b: &ModelBuffers, mag: [u64; 3]) -> Result<[u64; 3]> {
    let bytes = b.nreadouts.saturating_mul(b.nvoxels) * 8;
    Ok([pins.map(mag[0], bytes, "m")?, pins.map(mag[1], bytes, "dm_dt1")?, pins.map(mag[2], bytes, "dm_dt2")?])
}

/// J·v: `v` holds `4 x nvoxels` floats (T1, T2, Re ρ, Im ρ per voxel); `out` is signal-shaped.
pub fn jacobian_mul(m: &Manager, b: &ModelBuffers, mag: [u64; 3], v: u64, out: u64) -> Result<()> {
    let disjoint = || check_model_disjoint(m, b, mag, Operand::input("v", v, b.nvoxels * 16), Operand::output("out", out, signal_len(b) * 8));
    if on_cuda(m) {
        let mut pins = Pins::new(m);
        let dm = device_model(m, &mut pins, b)?;
        check_room::<[f32; 2]>(m, out, signal_len(b), "out")?;
        let mg = map_magnetization(&mut pins, b, mag)?;
        let (vv, o) = (pins.map(v, 16 * b.nvoxels, "v")?, pins.map(out, signal_len(b) * 8, "out")?);
        disjoint()?;
        return dm.jacobian(m, mg, vv, o);
    }
    let hm = HostModel::read(m, b)?;
    check_room::<[f32; 2]>(m, out, signal_len(b), "out")?;
    let [mm, d1, d2] = read_magnetization(m, b, mag)?;
    let vv: Vec<f64> = read::<f32>(m, v, 4 * b.nvoxels, "v")?.iter().map(|&x| x as f64).collect();
    disjoint()?;
    let mut s = vec![[0f64; 2]; signal_len(b) as usize];
    mrstat::jacobian_mul(&hm.model(), &mm, &JACOBIAN_PARAMS, &[&d1, &d2, &[], &[]], &vv, &mut s)?;
    write(m, out, &c32(&s))
}

/// Re(Jᴴw): `w` is signal-shaped complex float; `out` holds `4 x nvoxels` floats.
pub fn jacobian_adjoint_mul(m: &Manager, b: &ModelBuffers, mag: [u64; 3], w: u64, out: u64) -> Result<()> {
    let disjoint = || check_model_disjoint(m, b, mag, Operand::input("w", w, signal_len(b) * 8), Operand::output("out", out, b.nvoxels * 16));
    if on_cuda(m) {
        let mut pins = Pins::new(m);
        let dm = device_model(m, &mut pins, b)?;
        check_room::<f32>(m, out, 4 * b.nvoxels, "out")?;
        let mg = map_magnetization(&mut pins, b, mag)?;
        let (ww, o) = (pins.map(w, signal_len(b) * 8, "w")?, pins.map(out, 16 * b.nvoxels, "out")?);
        disjoint()?;
        return dm.jacobian_adjoint(m, mg, ww, o);
    }
    let hm = HostModel::read(m, b)?;
    check_room::<f32>(m, out, 4 * b.nvoxels, "out")?;
    let [mm, d1, d2] = read_magnetization(m, b, mag)?;
    let ww = c64(&read(m, w, signal_len(b), "w")?);
    disjoint()?;
    let mut g = vec![0f64; 4 * b.nvoxels as usize];
    mrstat::jacobian_adjoint_mul(&hm.model(), &mm, &JACOBIAN_PARAMS, &[&d1, &d2, &[], &[]], &ww, &mut g)?;
    write(m, out, &g.iter().map(|&x| x as f32).collect::<Vec<_>>())
}
