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
use cudarc::cublas::sys as cb;

pub const KERNELS: &str = include_str!("mrstat_kernels.cu");
/// The kernels around the matrix products of the Cartesian fast path.
pub const CARTESIAN_KERNELS: &str = include_str!("mrstat_cartesian.cu");

/// Threads per block of every MR-STAT kernel.
const BLOCK: u32 = 256;
/// Coils per thread of the signal and Jacobian kernels (`MS_CG`).
const COILS_PER_THREAD: u64 = 4;
/// Most EPG states of the derivative kernel (one thread per atom).
const MAX_DERIVATIVE_STATES: u32 = 64;
/// Largest grid y and z dimension.
const GRID_YZ: u64 = 65535;

fn function(m: &Manager, extra: &[String], name: &str) -> Result<Function> {
    module::compile(m.device(), KERNELS, &options(extra))?.function(name)
}

fn cartesian_function(m: &Manager, name: &str) -> Result<Function> {
    module::compile(m.device(), CARTESIAN_KERNELS, &options(&[]))?.function(name)
}

/// Runs `f` with a cuBLAS handle on the manager's stream in full FP32 (not the TF32 that
/// `KMM_MATCH_MATH` may ask of matching).
fn with_fp32_blas<R>(m: &Manager, f: impl FnOnce(cb::cublasHandle_t) -> Result<R>) -> Result<R> {
    super::gpu::with_cublas(m, |h| {
        if unsafe { cb::cublasSetMathMode(h, cb::cublasMath_t::CUBLAS_DEFAULT_MATH) } != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            crate::fail!(KMM_ERROR_BACKEND, "cublasSetMathMode failed");
        }
        f(h)
    })
}

/// C = op(A) op(B) + beta C in complex f32, column-major.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(h: cb::cublasHandle_t, ta: cb::cublasOperation_t, tb: cb::cublasOperation_t, mm: u64, n: u64, k: u64, a: u64, lda: u64, b: u64, ldb: u64, beta: f32, c: u64, ldc: u64) -> Result<()> {
    let one = cb::cuComplex { x: 1.0, y: 0.0 };
    let beta = cb::cuComplex { x: beta, y: 0.0 };
    let status = cb::cublasCgemm_v2_64(h, ta, tb, mm as i64, n as i64, k as i64, &one, a as *const cb::cuComplex, lda as i64, b as *const cb::cuComplex, ldb as i64, &beta, c as *mut cb::cuComplex, ldc as i64);
    if status != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        crate::fail!(KMM_ERROR_BACKEND, "cublasCgemm failed: {status:?}");
    }
    Ok(())
}

/// `KMM_MRSTAT_DIRECT=1` sums over voxels directly even where the Cartesian fast path applies
/// (for comparison).
fn fast_path_enabled() -> bool {
    std::env::var("KMM_MRSTAT_DIRECT").map_or(true, |v| v != "1")
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
    /// The common step of every readout of a Cartesian trajectory, where they share one: the
    /// operations are then matrix products.
    uniform_dk: Option<[f32; 2]>,
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
        // The fast path needs cuBLAS; without it the direct kernels still run.
        let blas = unsafe { cb::is_culib_present() };
        let uniform_dk = (cartesian && blas && dk.iter().all(|d| *d == dk[0]) && fast_path_enabled()).then(|| dk[0]);
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
            uniform_dk,
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
        if let Some(dk) = self.uniform_dk {
            return self.cartesian_synthesis(m, dk, [mag, 0, 0], None, out);
        }
        let f = function(m, &[], "kmm_mrstat_signal")?;
        let mut p: Vec<u64> = self.head().to_vec();
        p.extend([mag, self.k.addr, self.dk.addr, out]);
        p.extend(self.tail());
        // SAFETY: the arguments match kmm_mrstat_signal; the buffers are sized by the caller.
        unsafe { f.launch(m.raw_stream(), self.synthesis_grid()?, [BLOCK, 1, 1], 0, &mut p) }
    }

    /// J·v into `out`; `mag` = [m, dm/dT1, dm/dT2].
    pub fn jacobian(&self, m: &Manager, mag: [u64; 3], v: u64, out: u64) -> Result<()> {
        if let Some(dk) = self.uniform_dk {
            return self.cartesian_synthesis(m, dk, mag, Some(v), out);
        }
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
        if let Some(dk) = self.uniform_dk {
            return self.cartesian_adjoint(m, dk, mag, w, out);
        }
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

impl DeviceModel<'_> {
    /// Z (and Z2 = t Z) of the Cartesian factorisation, `nsamples x nvoxels`.
    fn cartesian_z<'s>(&self, m: &'s Manager, dk: [f32; 2], with_z2: bool) -> Result<(Scratch<'s>, Option<Scratch<'s>>)> {
        let bytes = self.nsamples * self.nvoxels * 8;
        let z = Scratch::new(m, bytes)?;
        let z2 = if with_z2 { Some(Scratch::new(m, bytes)?) } else { None };
        let f = cartesian_function(m, "kmm_cart_z")?;
        let mut p = [
            self.x.addr,
            self.y.addr,
            self.t2.addr,
            self.b0.addr,
            z.addr,
            z2.as_ref().map_or(0, |s| s.addr),
            self.nvoxels,
            self.nsamples,
            self.dt.to_bits() as u64,
            dk[0].to_bits() as u64,
            dk[1].to_bits() as u64,
        ];
        // SAFETY: the arguments match kmm_cart_z; z and z2 hold nsamples x nvoxels values.
        unsafe { f.launch(m.raw_stream(), grid_for(self.nsamples * self.nvoxels, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
        Ok((z, z2))
    }

    /// The signal (`v` None) or J v of a Cartesian trajectory with one step: per coil, A (and
    /// A2) by a kernel, then S_c = Z A^T (+ Z2 A2^T) by CGEMM.
    fn cartesian_synthesis(&self, m: &Manager, dk: [f32; 2], mag: [u64; 3], v: Option<u64>, out: u64) -> Result<()> {
        use cb::cublasOperation_t::*;
        let (nv, nr, ns) = (self.nvoxels, self.nreadouts, self.nsamples);
        let (z, z2) = self.cartesian_z(m, dk, v.is_some())?;
        let a1 = Scratch::new(m, nr * nv * 8)?;
        let a2 = if v.is_some() { Some(Scratch::new(m, nr * nv * 8)?) } else { None };
        let f = cartesian_function(m, "kmm_cart_a")?;
        with_fp32_blas(m, |h| {
            for c in 0..self.ncoils {
                let mut p = [
                    self.coils + c * nv * 8,
                    self.rho.addr,
                    self.x.addr,
                    self.y.addr,
                    self.t2.addr,
                    mag[0],
                    mag[1],
                    mag[2],
                    v.unwrap_or(0),
                    self.k.addr,
                    a1.addr,
                    a2.as_ref().map_or(0, |s| s.addr),
                    nv,
                    nr,
                    v.is_some() as u64,
                ];
                let o = out + c * nr * ns * 8;
                // SAFETY: the arguments match kmm_cart_a and the products' shapes; one stream orders them.
                unsafe {
                    f.launch(m.raw_stream(), grid_for(nr * nv, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)?;
                    gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, ns, nr, nv, z.addr, ns, a1.addr, nr, 0.0, o, ns)?;
                    if let (Some(z2), Some(a2)) = (&z2, &a2) {
                        gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, ns, nr, nv, z2.addr, ns, a2.addr, nr, 1.0, o, ns)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Re(J^H w) of a Cartesian trajectory with one step: per coil, conj(P) = W^H Z and W^H Z2
    /// by CGEMM, then a reduction per voxel.
    fn cartesian_adjoint(&self, m: &Manager, dk: [f32; 2], mag: [u64; 3], w: u64, out: u64) -> Result<()> {
        use cb::cublasOperation_t::*;
        let (nv, nr, ns) = (self.nvoxels, self.nreadouts, self.nsamples);
        let (z, z2) = self.cartesian_z(m, dk, true)?;
        let z2 = z2.expect("asked for");
        let (q, q2) = (Scratch::new(m, nr * nv * 8)?, Scratch::new(m, nr * nv * 8)?);
        let f = cartesian_function(m, "kmm_cart_adjoint")?;
        with_fp32_blas(m, |h| {
            for c in 0..self.ncoils {
                let wc = w + c * nr * ns * 8;
                let mut p = [
                    q.addr,
                    q2.addr,
                    self.coils + c * nv * 8,
                    self.rho.addr,
                    self.x.addr,
                    self.y.addr,
                    self.t2.addr,
                    mag[0],
                    mag[1],
                    mag[2],
                    self.k.addr,
                    out,
                    nv,
                    nr,
                    (c > 0) as u64,
                ];
                // SAFETY: as above, for the adjoint's products and kmm_cart_adjoint.
                unsafe {
                    gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, nr, nv, ns, wc, ns, z.addr, ns, 0.0, q.addr, nr)?;
                    gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, nr, nv, ns, wc, ns, z2.addr, ns, 0.0, q2.addr, nr)?;
                    f.launch(m.raw_stream(), grid_for(nv * 32, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)?;
                }
            }
            Ok(())
        })
    }
}

/// The FISP magnetization and its T1 and T2 derivatives of `natoms` atom records at `atoms`,
/// one thread per atom, into `out` = [m, dm/dT1, dm/dT2] (`ntr x natoms` complex float each).
pub fn fisp_derivatives(m: &Manager, seq: &Fisp, atoms: u64, natoms: usize, out: [u64; 3]) -> Result<()> {
    // One thread keeps every state with its two tangents in local memory: cap the states.
    if seq.max_state > MAX_DERIVATIVE_STATES {
        crate::fail!(
            KMM_ERROR_INVALID_ARGUMENT,
            "seq.max_state = {} must be at most {MAX_DERIVATIVE_STATES} for derivatives on CUDA (one thread per atom keeps every state)",
            seq.max_state
        );
    }
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
