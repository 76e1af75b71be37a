//! The CUDA path of the MR-STAT operations: kernels from `mrstat_kernels.cu` (direct sums),
//! `mrstat_cartesian.cu` (around the dense products of a Cartesian trajectory with one step),
//! `mrstat_columns.cu` (the column path of such a trajectory, [`columns`]) and `mrstat_model.cu`
//! (the model's check), compiled at run time through [`crate::backend::cuda::module`] and
//! launched on the manager's stream. The trajectory arrives checked from the host
//! ([`super::mrstat_run`]); the voxel records and coils are checked on the device and the
//! records unpacked into the kernels' layout (one array per field); the magnetization, coils
//! and outputs are used in place.

use super::gpu::{cgemm, grid_for, options, rf_table, Scratch};
use super::mrstat::Trajectory;
use crate::manager::copy::Completion;
use super::Fisp;
use crate::backend::cuda::module::{self, Function};
use crate::error::Result;
use crate::manager::Manager;
use cudarc::cublas::sys as cb;

pub const KERNELS: &str = include_str!("mrstat_kernels.cu");
/// The kernels around the matrix products of the Cartesian fast path.
pub const CARTESIAN_KERNELS: &str = include_str!("mrstat_cartesian.cu");
/// The kernels of the column path, with the helpers of the Cartesian ones.
const COLUMN_KERNELS: &str = concat!(include_str!("mrstat_cartesian.cu"), include_str!("mrstat_columns.cu"));
/// The check and unpacking of the model's voxel records and coils.
const MODEL_KERNELS: &str = include_str!("mrstat_model.cu");

#[path = "mrstat_columns.rs"]
mod columns;

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

/// The synthesis product: Z (ns x nv) times the transpose of `a` (`cols x nv`, leading
/// dimension `cols`) into `out` (ns x cols). CGEMM3M (Gauss's three real products), splitting
/// this product over slices of voxels and its transposed form measured no faster on an H200
/// (bench/results/qmri.md).
///
/// SAFETY: the addresses hold those shapes, for work on `h`'s stream.
unsafe fn synthesis_product(h: cb::cublasHandle_t, z: u64, a: u64, ns: u64, nv: u64, cols: u64, out: u64) -> Result<()> {
    use cb::cublasOperation_t::*;
    let (ns, nv, cols) = (ns as usize, nv as usize, cols as usize);
    cgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, ns, cols, nv, z, ns, a, cols, out, ns)
}

/// The adjoint's product: Q (`cols x nv`) = W'^H Z with W' `ns x cols`.
///
/// SAFETY: as for [`synthesis_product`].
unsafe fn adjoint_product(h: cb::cublasHandle_t, wp: u64, z: u64, ns: u64, nv: u64, cols: u64, q: u64) -> Result<()> {
    use cb::cublasOperation_t::*;
    let (ns, nv, cols) = (ns as usize, nv as usize, cols as usize);
    cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, cols, nv, ns, wp, ns, z, ns, q, cols)
}

/// Scratch the products of one call may take (bytes), beyond Z: coils are grouped so that
/// what a group takes (A, or the adjoint's W' and Q, and J·v's product) stays under it, or one
/// coil at a time where one takes more.
const GROUP_BYTES: u64 = 1 << 30;

/// Coils per product, for `per_coil` bytes of scratch per coil of a group:
/// `KMM_MRSTAT_COILS_PER_PRODUCT` overrides the fit to [`GROUP_BYTES`] (the GPU tests take
/// several groups, the last one short, with it).
fn coils_per_product(ncoils: u64, per_coil: u64) -> u64 {
    let asked = std::env::var("KMM_MRSTAT_COILS_PER_PRODUCT").ok().and_then(|v| v.parse::<u64>().ok()).filter(|&g| g > 0);
    asked.unwrap_or(GROUP_BYTES / per_coil.max(1)).clamp(1, ncoils)
}

/// The groups of `group` coils of `ncoils` (the last one may be short): (first coil, coils).
fn coil_groups(ncoils: u64, group: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..ncoils).step_by(group as usize).map(move |c0| (c0, group.min(ncoils - c0)))
}

/// How a Cartesian trajectory with one step is computed (`KMM_MRSTAT_PATH`): by the column
/// path where it applies and pays (`auto`, the default), by dense products of all voxels
/// (`products`), by the column path wherever it applies (`columns`, for the tests), or by the
/// direct sums of other trajectories (`direct`, for comparison; `KMM_MRSTAT_DIRECT=1`, its
/// older name, still asks for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Auto,
    Products,
    Columns,
    Direct,
}

fn path() -> Result<Path> {
    Ok(match std::env::var("KMM_MRSTAT_PATH").ok().as_deref() {
        None | Some("") if std::env::var("KMM_MRSTAT_DIRECT").is_ok_and(|v| v == "1") => Path::Direct,
        None | Some("") | Some("auto") => Path::Auto,
        Some("products") => Path::Products,
        Some("columns") => Path::Columns,
        Some("direct") => Path::Direct,
        Some(other) => crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "KMM_MRSTAT_PATH = {other:?} must be auto, products, columns or direct"),
    })
}

fn c32s(v: &[[f64; 2]]) -> Vec<[f32; 2]> {
    v.iter().map(|c| [c[0] as f32, c[1] as f32]).collect()
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
    path: Path,
    /// The hash of the voxels' positions (the column path keeps its grouping by it).
    positions_hash: [u64; 2],
    /// The largest |-1/T2 + i 2 pi B0| of the voxels (1/s).
    max_rate: f32,
    /// The largest 1/T2 of the voxels (1/s).
    max_decay: f32,
}

impl<'a> DeviceModel<'a> {
    /// The model from the voxel records (`nvoxels` x [x, y, T2, B0, Re rho, Im rho] floats at the
    /// mapped address `records`) and the coils (`nvoxels x ncoils` complex at `coils`), checked
    /// and unpacked on the device, and the checked trajectory. `Ok(Err(what))` when a record or
    /// coil entry is bad (`what` names the first).
    pub fn checked(m: &'a Manager, records: u64, coils: u64, nvoxels: u64, ncoils: u64, traj: &Trajectory) -> Result<std::result::Result<DeviceModel<'a>, String>> {
        let (k, dk, cartesian) = match traj {
            Trajectory::Cartesian(c) => (c32s(&c.k0), c32s(&c.dk), true),
            Trajectory::Spiral(s) => (c32s(&s.k), vec![[0f32; 2]], false),
        };
        // The fast path needs cuBLAS; without it the direct kernels still run.
        let blas = unsafe { cb::is_culib_present() };
        let path = path()?;
        let uniform_dk = (cartesian && blas && dk.iter().all(|d| *d == dk[0]) && path != Path::Direct).then(|| dk[0]);
        let field = |each: u64| Scratch::new(m, nvoxels * each);
        let (x, y, t2, b0, rho) = (field(4)?, field(4)?, field(4)?, field(4)?, field(8)?);
        // What kmm_mrstat_unpack finds: bad record, bad coil entry, positions' hash, largest
        // rate and decay rate.
        let found = Scratch::upload(m, &[u64::MAX, u64::MAX, 0, 0, 0, 0])?;
        let entries = nvoxels * ncoils;
        let f = module::compile(m.device(), MODEL_KERNELS, &options(&[]))?.function("kmm_mrstat_unpack")?;
        let mut p = [records, coils, nvoxels, entries, x.addr, y.addr, t2.addr, b0.addr, rho.addr, found.addr];
        // SAFETY: the arguments match kmm_mrstat_unpack; the caller mapped records and coils at
        // their sizes, the fields hold nvoxels values each.
        unsafe { f.launch(m.raw_stream(), grid_for(nvoxels.max(entries), BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
        let found = {
            let mut f = [0u64; 6];
            // SAFETY: `f` has room for the 48 bytes; the copy completes before return.
            unsafe { m.copy_to_host(f.as_mut_ptr() as *mut u8, found.handle, 0, 48, Completion::Wait)? };
            f
        };
        if found[0] != u64::MAX {
            return Ok(Err(format!("voxel record {} has a value out of range", found[0])));
        }
        if found[1] != u64::MAX {
            return Ok(Err(format!("coils[{}] is not finite", found[1])));
        }
        Ok(Ok(DeviceModel {
            x,
            y,
            rho,
            t2,
            b0,
            k: Scratch::upload(m, &k)?,
            dk: Scratch::upload(m, &dk)?,
            coils,
            nvoxels,
            ncoils,
            nreadouts: traj.nreadouts() as u64,
            nsamples: traj.nsamples() as u64,
            dt: traj.dt() as f32,
            cartesian,
            uniform_dk,
            path,
            positions_hash: [found[2], found[3]],
            max_rate: f32::from_bits(found[4] as u32),
            max_decay: f32::from_bits(found[5] as u32),
        }))
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
            if let Some(c) = self.columns_if_chosen(m, dk, false)? {
                return self.column_synthesis(m, &c, [mag, 0, 0], None, out);
            }
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
            if let Some(c) = self.columns_if_chosen(m, dk, false)? {
                return self.column_synthesis(m, &c, mag, Some(v), out);
            }
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
            if let Some(c) = self.columns_if_chosen(m, dk, true)? {
                return self.column_adjoint(m, &c, mag, w, out);
            }
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
    /// The column path's data where the path asks for it and it applies.
    fn columns_if_chosen<'m>(&self, m: &'m Manager, dk: [f32; 2], adjoint: bool) -> Result<Option<columns::Columns<'m>>> {
        match self.path {
            Path::Auto | Path::Columns => self.columns(m, dk, self.path == Path::Columns, adjoint),
            Path::Products | Path::Direct => Ok(None),
        }
    }

    /// Z of the Cartesian factorisation, `nsamples x nvoxels`.
    fn cartesian_z<'s>(&self, m: &'s Manager, dk: [f32; 2]) -> Result<Scratch<'s>> {
        let z = Scratch::new(m, self.nsamples * self.nvoxels * 8)?;
        let f = cartesian_function(m, "kmm_cart_z")?;
        let mut p = [self.x.addr, self.y.addr, self.t2.addr, self.b0.addr, z.addr, self.nvoxels, self.nsamples, self.dt.to_bits() as u64, dk[0].to_bits() as u64, dk[1].to_bits() as u64];
        // SAFETY: the arguments match kmm_cart_z; z holds nsamples x nvoxels values.
        unsafe { f.launch(m.raw_stream(), [self.nvoxels as u32, 1, 1], [BLOCK, 1, 1], 0, &mut p)? };
        Ok(z)
    }

    /// The signal (`v` None) or J v of a Cartesian trajectory with one step, for groups of
    /// coils: A (readouts of the group's coils, then for J v their A2) by a kernel, then
    /// Z A^T by one product; for J v, `kmm_cart_sum` adds t_s times the A2 half.
    fn cartesian_synthesis(&self, m: &Manager, dk: [f32; 2], mag: [u64; 3], v: Option<u64>, out: u64) -> Result<()> {
        let (nv, nr, ns, nc) = (self.nvoxels, self.nreadouts, self.nsamples, self.ncoils);
        let halves = if v.is_some() { 2 } else { 1 };
        // Per coil: its A (and A2), and for J v the product of both (ns x 2 nr).
        let group = coils_per_product(nc, halves * nr * nv * 8 + (halves - 1) * 2 * ns * nr * 8);
        let z = self.cartesian_z(m, dk)?;
        let a = Scratch::new(m, halves * group * nr * nv * 8)?;
        let both = if v.is_some() { Some(Scratch::new(m, ns * 2 * group * nr * 8)?) } else { None };
        let (fa, fsum) = (cartesian_function(m, "kmm_cart_a")?, cartesian_function(m, "kmm_cart_sum")?);
        with_fp32_blas(m, |h| {
            for (c0, gc) in coil_groups(nc, group) {
                let cols = halves * gc * nr;
                for c in 0..gc {
                    let mut p = [
                        self.coils + (c0 + c) * nv * 8,
                        self.rho.addr,
                        self.x.addr,
                        self.y.addr,
                        self.t2.addr,
                        mag[0],
                        mag[1],
                        mag[2],
                        v.unwrap_or(0),
                        self.k.addr,
                        a.addr + c * nr * 8,
                        cols,
                        gc * nr,
                        nv,
                        nr,
                        v.is_some() as u64,
                    ];
                    // SAFETY: the arguments match kmm_cart_a; `a` holds cols x nv values.
                    unsafe { fa.launch(m.raw_stream(), [nv as u32, 1, 1], [BLOCK, 1, 1], 0, &mut p)? };
                }
                let o = out + c0 * nr * ns * 8;
                let Some(both) = &both else {
                    // SAFETY: z, a and the group's part of `out` hold the product's shapes.
                    unsafe { synthesis_product(h, z.addr, a.addr, ns, nv, cols, o)? };
                    continue;
                };
                // SAFETY: as above, into `both` (ns x cols).
                unsafe { synthesis_product(h, z.addr, a.addr, ns, nv, cols, both.addr)? };
                let mut p = [both.addr, o, ns, gc * nr, self.dt.to_bits() as u64];
                // SAFETY: the arguments match kmm_cart_sum; `o` holds the group's ns x gc*nr values.
                unsafe { fsum.launch(m.raw_stream(), grid_for(ns * gc * nr, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
            }
            Ok(())
        })
    }

    /// Re(J^H w) of a Cartesian trajectory with one step, for groups of coils: Q = W'^H Z with
    /// W' = [W, diag(t) W] (the group's readouts) by one product, then a reduction per voxel
    /// and coil.
    fn cartesian_adjoint(&self, m: &Manager, dk: [f32; 2], mag: [u64; 3], w: u64, out: u64) -> Result<()> {
        let (nv, nr, ns, nc) = (self.nvoxels, self.nreadouts, self.nsamples, self.ncoils);
        // Per coil: its two halves of W' (ns x 2 nr) and of Q (2 nr x nv).
        let group = coils_per_product(nc, 2 * nr * (ns + nv) * 8);
        let z = self.cartesian_z(m, dk)?;
        let wp = Scratch::new(m, ns * 2 * group * nr * 8)?;
        let q = Scratch::new(m, 2 * group * nr * nv * 8)?;
        let (ftw, fadj) = (cartesian_function(m, "kmm_cart_tw")?, cartesian_function(m, "kmm_cart_adjoint")?);
        with_fp32_blas(m, |h| {
            for (c0, gc) in coil_groups(nc, group) {
                let cols = 2 * gc * nr;
                let mut p = [w + c0 * nr * ns * 8, wp.addr, ns, gc * nr, self.dt.to_bits() as u64];
                // SAFETY: the arguments match kmm_cart_tw; wp holds ns x cols values.
                unsafe { ftw.launch(m.raw_stream(), grid_for(ns * gc * nr, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
                // SAFETY: wp, z and q hold the product's shapes.
                unsafe { adjoint_product(h, wp.addr, z.addr, ns, nv, cols, q.addr)? };
                for c in 0..gc {
                    let mut p = [
                        q.addr + c * nr * 8,
                        cols,
                        gc * nr,
                        self.coils + (c0 + c) * nv * 8,
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
                        (c0 + c > 0) as u64,
                    ];
                    // SAFETY: the arguments match kmm_cart_adjoint.
                    unsafe { fadj.launch(m.raw_stream(), grid_for(nv * 32, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
                }
            }
            Ok(())
        })
    }
}

/// The products of the Cartesian fast path alone, on scratch of the operations' shapes
/// (`nvoxels`, `nreadouts`, `nsamples`, one coil), made once: the benchmark's floor for the
/// operations.
pub struct BareProducts<'a> {
    m: &'a Manager,
    z: Scratch<'a>,
    a: Scratch<'a>,
    small: Scratch<'a>,
    nv: u64,
    nr: u64,
    ns: u64,
}

impl<'a> BareProducts<'a> {
    pub fn new(m: &'a Manager, nv: u64, nr: u64, ns: u64) -> Result<BareProducts<'a>> {
        let sizes = [ns * nv * 8, 2 * nr * nv * 8, 2 * ns * nr * 8];
        let [z, a, small] = sizes.map(|bytes| Scratch::new(m, bytes));
        let (z, a, small) = (z?, a?, small?);
        for (s, bytes) in [&z, &a, &small].into_iter().zip(sizes) {
            m.fill(s.handle, 0, bytes, &[0])?;
        }
        Ok(BareProducts { m, z, a, small, nv, nr, ns })
    }

    /// The synthesis product (`halves` 2: J v's, with A2) or the adjoint's, queued.
    pub fn run(&self, halves: u64, adjoint: bool) -> Result<()> {
        let cols = halves * self.nr;
        let (z, a, small) = (self.z.addr, self.a.addr, self.small.addr);
        let (ns, nv) = (self.ns, self.nv);
        // SAFETY: the scratch holds the product's shapes.
        with_fp32_blas(self.m, |h| unsafe {
            if adjoint {
                adjoint_product(h, small, z, ns, nv, cols, a)
            } else {
                synthesis_product(h, z, a, ns, nv, cols, small)
            }
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
