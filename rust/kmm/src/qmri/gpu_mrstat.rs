//! The CUDA path of the MR-STAT operations: kernels from `mrstat_kernels.cu`, compiled at run
//! time through [`crate::backend::cuda::module`] and launched on the manager's stream. The model
//! (voxels, coils, trajectory) arrives checked on the host ([`super::mrstat_run`]); its voxel
//! records and k-space are uploaded in the kernels' layout (one array per field), the
//! magnetization, coils and outputs are used in place.

use super::gpu::{grid_for, options, rf_table, Scratch};
use super::mrstat::{Trajectory, Voxels};
use super::Fisp;
use crate::backend::cuda::module::{self, Function};
use crate::error::Result;
use crate::manager::Manager;

pub const KERNELS: &str = include_str!("mrstat_kernels.cu");

/// Threads per block of every MR-STAT kernel.
const BLOCK: u32 = 256;
/// Coils per thread of the signal and Jacobian kernels (`MS_CG`).
const COILS_PER_THREAD: u64 = 4;
/// Largest grid y and z dimension.
const GRID_YZ: u64 = 65535;

fn function(m: &Manager, extra: &[String], name: &str) -> Result<Function> {
    module::compile(m.device(), KERNELS, &options(extra))?.function(name)
}

/// The model on the device in the kernels' layout.
pub struct DeviceModel<'a> {
    x: Scratch<'a>,
    y: Scratch<'a>,
    rho: Scratch<'a>,
    t2: Scratch<'a>,
    b0: Scratch<'a>,
    k: Scratch<'a>,
    dk: Scratch<'a>,
    coils: u64,
    nvoxels: u64,
    ncoils: u64,
    nreadouts: u64,
    nsamples: u64,
    dt: f32,
    cartesian: bool,
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn c32s(v: &[[f64; 2]]) -> Vec<[f32; 2]> {
    v.iter().map(|c| [c[0] as f32, c[1] as f32]).collect()
}

impl<'a> DeviceModel<'a> {
    /// Uploads the checked model; `coils` is the mapped address of the model's coil buffer.
    pub fn new(m: &'a Manager, voxels: &Voxels, traj: &Trajectory, coils: u64, ncoils: u64) -> Result<DeviceModel<'a>> {
        let (k, dk, cartesian) = match traj {
            Trajectory::Cartesian(c) => (c32s(&c.k0), c32s(&c.dk), true),
            Trajectory::Spiral(s) => (c32s(&s.k), vec![[0f32; 2]], false),
        };
        Ok(DeviceModel {
            x: Scratch::upload(m, &f32s(&voxels.x))?,
            y: Scratch::upload(m, &f32s(&voxels.y))?,
            rho: Scratch::upload(m, &c32s(&voxels.rho))?,
            t2: Scratch::upload(m, &f32s(&voxels.t2))?,
            b0: Scratch::upload(m, &f32s(&voxels.b0))?,
            k: Scratch::upload(m, &k)?,
            dk: Scratch::upload(m, &dk)?,
            coils,
            nvoxels: voxels.len() as u64,
            ncoils,
            nreadouts: traj.nreadouts() as u64,
            nsamples: traj.nsamples() as u64,
            dt: traj.dt() as f32,
            cartesian,
        })
    }

    fn head(&self) -> [u64; 6] {
        [self.x.addr, self.y.addr, self.rho.addr, self.t2.addr, self.b0.addr, self.coils]
    }

    fn tail(&self) -> [u64; 6] {
        [self.nvoxels, self.ncoils, self.nreadouts, self.nsamples, self.dt.to_bits() as u64, self.cartesian as u64]
    }

    /// One thread per sample (and group of coils), readouts in y, coil groups in z.
    fn synthesis_grid(&self) -> Result<[u32; 3]> {
        let [gx, _, _] = grid_for(self.nsamples, BLOCK)?;
        Ok([gx, self.nreadouts.min(GRID_YZ) as u32, self.ncoils.div_ceil(COILS_PER_THREAD).min(GRID_YZ) as u32])
    }

    /// The signal of the magnetization at `mag` into `out`.
    pub fn signal(&self, m: &Manager, mag: u64, out: u64) -> Result<()> {
        let f = function(m, &[], "kmm_mrstat_signal")?;
        let mut p: Vec<u64> = self.head().to_vec();
        p.extend([mag, self.k.addr, self.dk.addr, out]);
        p.extend(self.tail());
        // SAFETY: the arguments match kmm_mrstat_signal; the buffers are sized by the caller.
        unsafe { f.launch(m.raw_stream(), self.synthesis_grid()?, [BLOCK, 1, 1], 0, &mut p) }
    }

    /// J·v into `out`; `mag` = [m, dm/dT1, dm/dT2].
    pub fn jacobian(&self, m: &Manager, mag: [u64; 3], v: u64, out: u64) -> Result<()> {
        let f = function(m, &[], "kmm_mrstat_jacobian")?;
        let mut p: Vec<u64> = self.head().to_vec();
        p.extend(mag);
        p.extend([v, self.k.addr, self.dk.addr, out]);
        p.extend(self.tail());
        // SAFETY: as above, for kmm_mrstat_jacobian.
        unsafe { f.launch(m.raw_stream(), self.synthesis_grid()?, [BLOCK, 1, 1], 0, &mut p) }
    }

    /// Re(Jᴴw) into `out` (`4 x nvoxels` floats): blocks over voxels.
    pub fn jacobian_adjoint(&self, m: &Manager, mag: [u64; 3], w: u64, out: u64) -> Result<()> {
        let f = function(m, &[], "kmm_mrstat_jacobian_adjoint")?;
        let mut p: Vec<u64> = self.head().to_vec();
        p.extend(mag);
        p.extend([w, self.k.addr, self.dk.addr, out]);
        p.extend(self.tail());
        let grid = [self.nvoxels.min(1 << 20) as u32, 1, 1];
        // SAFETY: as above, for kmm_mrstat_jacobian_adjoint.
        unsafe { f.launch(m.raw_stream(), grid, [BLOCK, 1, 1], 0, &mut p) }
    }
}

/// The FISP magnetization and its T1 and T2 derivatives of `natoms` atom records at `atoms`,
/// one thread per atom, into `out` = [m, dm/dT1, dm/dT2] (`ntr x natoms` complex float each).
pub fn fisp_derivatives(m: &Manager, seq: &Fisp, atoms: u64, natoms: usize, out: [u64; 3]) -> Result<()> {
    let f = function(m, &[format!("-DNS={}", seq.max_state)], "kmm_mrstat_fisp_derivatives")?;
    let ntr = seq.ntr();
    let mut table = Vec::with_capacity(ntr * seq.positions());
    for p in 0..seq.positions() {
        table.extend(rf_table(&seq.flip, &seq.phase, |n| seq.scale(n, p)));
    }
    let table = Scratch::upload(m, &table)?;
    let mut p = [
        atoms,
        out[0],
        out[1],
        out[2],
        table.addr,
        natoms as u64,
        ntr as u64,
        seq.positions() as u64,
        seq.tr.to_bits() as u64,
        seq.te.to_bits() as u64,
        seq.ti.to_bits() as u64,
    ];
    // SAFETY: the arguments match kmm_mrstat_fisp_derivatives; the buffers are sized by the caller.
    unsafe { f.launch(m.raw_stream(), grid_for(natoms as u64, 128)?, [128, 1, 1], 0, &mut p) }
}
