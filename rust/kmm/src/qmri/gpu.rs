//! The CUDA path: kernels from `kernels.cu`, compiled at run time through [`crate::backend::cuda::module`] for
//! the manager's device and launched on its stream; matching runs cuBLAS CGEMM in voxel chunks
//! sized to free memory, then a reduction kernel over |D^H x| / ||d||.

use super::run::{MappedCompression, MatchAddrs};
use super::{svd, Fisp, Pssfp};
use crate::error::{lock, Result};
use crate::manager::copy::Completion;
use crate::backend::Event;
use crate::manager::{Manager, MemoryKind};
use crate::backend::cuda::module::{self, Function};
use crate::fail;
use cudarc::cublas::sys as cb;
use cudarc::cusolver::sys as cs;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub const KERNELS: &str = include_str!("kernels.cu");

/// Threads per block of the FISP kernel.
const FISP_BLOCK: u32 = 256;
const PSSFP_BLOCK: u32 = 128;

/// Threads per atom for `ns` EPG states and `natoms` atoms on a device of `multiprocessors`.
/// Fewer lanes hold more states per thread (up to 32 in registers, about 254 of them): less
/// exchange between lanes and more atoms per multiprocessor (about 256 at 32 states a thread), so
/// the most throughput once the atoms fill the device several times over; more lanes (8 states a
/// thread, 128 atoms per multiprocessor) finish each atom sooner, which wins while they do not.
/// Measured on an H100 (132 multiprocessors, Ns 32; bench/results/qmri.md): 1 lane is fastest
/// from 100k atoms (2.5 waves of 256 atoms per multiprocessor and more), 4 lanes at 50k and below.
/// 16 states a thread (2 lanes) need 133-141 registers, one block per multiprocessor: they lost
/// to 1 or 4 lanes at 20k, 50k and 100k atoms. `KMM_FISP_LANES` (1, 2, 4, 8, 16 or 32) overrides the choice,
/// for tuning on a new GPU.
pub fn fisp_lanes(ns: u32, natoms: usize, multiprocessors: u32) -> u32 {
    if let Some(l) = std::env::var("KMM_FISP_LANES").ok().and_then(|v| v.parse::<u32>().ok()) {
        if l.is_power_of_two() && l <= 32 {
            return l;
        }
    }
    let [few, many] = fisp_layouts(ns);
    // Atoms that one wave of 32-state threads holds.
    let wave = multiprocessors as usize * 256;
    if natoms * 2 >= 5 * wave {
        many
    } else {
        few
    }
}

/// The threads per atom `fisp_lanes` chooses between for `ns` states: [for few atoms (8 states
/// a thread), for many (32 states a thread; 16 past Ns 64, where 32 states and the exchange of
/// more than 2 lanes pass 255 registers)].
pub fn fisp_layouts(ns: u32) -> [u32; 2] {
    let lanes_for = |states_per_thread: u32| ns.div_ceil(states_per_thread).next_power_of_two().min(32);
    [lanes_for(8), lanes_for(if ns <= 64 { 32 } else { 16 })]
}

/// The defines that specialise `kmm_fisp` for `ns` states on `lanes` threads per atom.
pub fn fisp_defines(ns: u32, lanes: u32) -> Vec<String> {
    vec![format!("-DNS={ns}"), format!("-DLANES={lanes}")]
}

/// NVRTC options of the qMRI kernels, plus `extra`.
pub fn options(extra: &[String]) -> Vec<String> {
    let mut opts = vec!["--std=c++14".to_string(), "--fmad=true".to_string()];
    opts.extend_from_slice(extra);
    opts
}

fn function(m: &Manager, extra: &[String], name: &str) -> Result<Function> {
    module::compile(m.device(), KERNELS, &options(extra))?.function(name)
}

/// A device buffer that lives until the end of the call; its free is stream-ordered, so
/// queued kernels still see it.
pub(super) struct Scratch<'a> {
    m: &'a Manager,
    pub handle: u64,
    pub addr: u64,
}

impl<'a> Scratch<'a> {
    pub fn new(m: &'a Manager, bytes: u64) -> Result<Scratch<'a>> {
        let handle = m.alloc(bytes.max(1), MemoryKind::Device)?;
        let addr = match m.map_for_own_work(handle) {
            Ok(a) => a,
            Err(e) => {
                let _ = m.free(handle, crate::manager::FreeMode::Force);
                return Err(e);
            }
        };
        Ok(Scratch { m, handle, addr })
    }
    pub fn upload<T: Copy>(m: &'a Manager, data: &[T]) -> Result<Scratch<'a>> {
        let bytes = std::mem::size_of_val(data) as u64;
        let s = Scratch::new(m, bytes)?;
        // SAFETY: pageable sources are copied out before the call returns.
        unsafe { m.copy_to_device(s.handle, 0, data.as_ptr() as *const u8, bytes, Completion::Queue)? };
        Ok(s)
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = self.m.end_own_work(self.handle);
        let _ = self.m.free(self.handle, crate::manager::FreeMode::Checked);
    }
}

pub(super) fn rf_table(flip: &[f32], phase: &[f32], scale: impl Fn(usize) -> f32) -> Vec<[f32; 4]> {
    flip.iter()
        .zip(phase)
        .enumerate()
        .map(|(n, (&a, &p))| {
            let (s, c) = (p as f64).sin_cos();
            [a * scale(n), c as f32, s as f32, 0.0]
        })
        .collect()
}

pub(super) fn grid_for(threads: u64, block: u32) -> Result<[u32; 3]> {
    let blocks = threads.div_ceil(block as u64);
    if blocks > i32::MAX as u64 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "too many atoms for one launch: {threads} threads");
    }
    Ok([blocks as u32, 1, 1])
}

pub fn simulate_fisp(m: &Manager, seq: &Fisp, atoms: u64, natoms: usize, out: u64) -> Result<()> {
    let multiprocessors = module::device_info(m.device())?.multiprocessors.max(1) as u32;
    let lanes = fisp_lanes(seq.max_state, natoms, multiprocessors);
    let f = function(m, &fisp_defines(seq.max_state, lanes), "kmm_fisp")?;
    let ntr = seq.ntr();
    let mut table = Vec::with_capacity(ntr * seq.positions());
    for p in 0..seq.positions() {
        table.extend(rf_table(&seq.flip, &seq.phase, |n| seq.scale(n, p)));
    }
    let table = Scratch::upload(m, &table)?;
    let grid = grid_for(natoms as u64 * lanes as u64, FISP_BLOCK)?;
    let mut params = [
        atoms,
        out,
        table.addr,
        natoms as u64,
        ntr as u64,
        seq.positions() as u64,
        seq.tr.to_bits() as u64,
        seq.te.to_bits() as u64,
        seq.ti.to_bits() as u64,
    ];
    // SAFETY: the parameters match kmm_fisp; the buffers are pinned and sized by the caller.
    unsafe { f.launch(m.raw_stream(), grid, [FISP_BLOCK, 1, 1], 0, &mut params) }
}

pub fn simulate_pssfp(m: &Manager, seq: &Pssfp, atoms: u64, natoms: usize, out: u64) -> Result<()> {
    let f = function(m, &[], "kmm_pssfp")?;
    let rf = Scratch::upload(m, &rf_table(&seq.flip, &seq.phase, |_| 1.0))?;
    let shape = Scratch::upload(m, &seq.rf_shape)?;
    let z = Scratch::upload(m, &seq.z)?;
    let grid = grid_for(natoms as u64, PSSFP_BLOCK)?;
    let mut params = [
        atoms,
        out,
        rf.addr,
        shape.addr,
        z.addr,
        natoms as u64,
        seq.ntr() as u64,
        seq.rf_shape.len() as u64,
        seq.z.len() as u64,
        seq.dt_ex.to_bits() as u64,
        seq.dt_inv.to_bits() as u64,
        seq.dt_pr.to_bits() as u64,
        seq.gz_ex.to_bits() as u64,
        seq.gz_pr.to_bits() as u64,
    ];
    // SAFETY: as above, for kmm_pssfp.
    unsafe { f.launch(m.raw_stream(), grid, [PSSFP_BLOCK, 1, 1], 0, &mut params) }
}

// ---- cuBLAS --------------------------------------------------------------------------------

/// A cuBLAS handle and, once a call needed one, a cuSOLVER handle: they share the idle list
/// and its stream ordering (cuSOLVER's calls run cuBLAS and kernels of their own).
pub(super) struct Handle {
    pub blas: cb::cublasHandle_t,
    pub solver: Option<cs::cusolverDnHandle_t>,
}
unsafe impl Send for Handle {}

/// An idle handle, and the event after the last work queued with it (on its last user's stream).
/// A handle's workspace is shared by all its work: the next user's stream waits for that event
/// before its own work with the handle, so two streams never use one workspace at once.
struct Idle {
    handle: Handle,
    after: Option<Box<dyn Event>>,
}

fn cublas_check(status: cb::cublasStatus_t, call: &str) -> Result<()> {
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        fail!(KMM_ERROR_BACKEND, "{call} failed: {status:?}")
    }
}

/// Idle cuBLAS handles per device. A matching call takes one for its duration and puts it back,
/// so calls on different managers and devices run at once and no lock is held while the device
/// works. Creating a handle costs milliseconds and a workspace of tens of MiB, so handles are
/// kept for the process (as many per device as matchings ever ran on it at once).
fn idle_handles() -> &'static Mutex<HashMap<i32, Vec<Idle>>> {
    static HANDLES: OnceLock<Mutex<HashMap<i32, Vec<Idle>>>> = OnceLock::new();
    HANDLES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A device's cuBLAS handle taken for one call on `stream`; back to the idle list on drop, with
/// an event after the work queued with it (a handle whose event cannot be recorded is not reused:
/// a failing device, whose later users could otherwise share its workspace).
struct TakenHandle<'m> {
    m: &'m Manager,
    handle: Option<Handle>,
    /// The previous user's event, recycled for this user's.
    event: Option<Box<dyn Event>>,
}

impl Drop for TakenHandle<'_> {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else { return };
        let event = match self.event.take() {
            Some(e) => Ok(e),
            None => self.m.backend().create_event(),
        };
        if let Ok(after) = event.and_then(|e| self.m.stream().record(e.as_ref()).map(|_| e)) {
            lock(idle_handles()).entry(self.m.device()).or_default().push(Idle { handle, after: Some(after) });
        }
    }
}

/// Runs `f` with a cuBLAS handle of the manager's device bound to the manager's stream.
pub(super) fn with_cublas<R>(m: &Manager, f: impl FnOnce(cb::cublasHandle_t) -> Result<R>) -> Result<R> {
    with_handle(m, |h| f(h.blas))
}

/// Runs `f` with the cuBLAS handle and, when `need_solver`, a cuSOLVER handle (created on first
/// use) of the manager's device, both bound to the manager's stream; `None` when not needed or
/// cuSOLVER is not found.
pub(super) fn with_solver<R>(m: &Manager, need_solver: bool, f: impl FnOnce(cb::cublasHandle_t, Option<cs::cusolverDnHandle_t>) -> Result<R>) -> Result<R> {
    with_handle(m, |h| {
        if !need_solver {
            return f(h.blas, None);
        }
        if h.solver.is_none() && unsafe { cs::is_culib_present() } {
            let mut s = std::ptr::null_mut();
            if unsafe { cs::cusolverDnCreate(&mut s) } == cs::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
                h.solver = Some(s);
            }
        }
        if let Some(s) = h.solver {
            if unsafe { cs::cusolverDnSetStream(s, m.raw_stream() as cs::cudaStream_t) } != cs::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
                fail!(KMM_ERROR_BACKEND, "cusolverDnSetStream failed");
            }
        }
        f(h.blas, h.solver)
    })
}

fn with_handle<R>(m: &Manager, f: impl FnOnce(&mut Handle) -> Result<R>) -> Result<R> {
    if !unsafe { cb::is_culib_present() } {
        fail!(KMM_ERROR_BACKEND_UNAVAILABLE, "matching on the CUDA backend needs cuBLAS, which was not found: put a directory holding libcublas.so (a link to libcublas.so.13 or .12) and libcublasLt on LD_LIBRARY_PATH");
    }
    let _current = module::device_info(m.device())?.enter()?;
    let idle = lock(idle_handles()).get_mut(&m.device()).and_then(Vec::pop);
    let taken = match idle {
        Some(Idle { handle, after }) => {
            // Stream-ordered: this call's work with the handle follows the last user's.
            if let Some(Err(e)) = after.as_ref().map(|a| m.stream().wait_event(a.as_ref())) {
                lock(idle_handles()).entry(m.device()).or_default().push(Idle { handle, after });
                return Err(e);
            }
            TakenHandle { m, handle: Some(handle), event: after }
        }
        None => {
            let mut h = std::ptr::null_mut();
            cublas_check(unsafe { cb::cublasCreate_v2(&mut h) }, "cublasCreate")?;
            TakenHandle { m, handle: Some(Handle { blas: h, solver: None }), event: None }
        }
    };
    let mut taken = taken;
    let handle = taken.handle.as_mut().expect("just taken");
    let h = handle.blas;
    cublas_check(unsafe { cb::cublasSetStream_v2(h, m.raw_stream() as cb::cudaStream_t) }, "cublasSetStream")?;
    // KMM_MATCH_MATH=tf32 lets cuBLAS use TF32 tensor cores (about 10 mantissa bits in the
    // products: much faster, and near-equal atoms may swap); default: full FP32.
    let math = match std::env::var("KMM_MATCH_MATH").ok().as_deref() {
        Some("tf32") => cb::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
        _ => cb::cublasMath_t::CUBLAS_DEFAULT_MATH,
    };
    cublas_check(unsafe { cb::cublasSetMathMode(h, math) }, "cublasSetMathMode")?;
    f(handle)
}

/// C (m x n, ldc) = op(A) op(B) in complex f32, column-major.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn cgemm(
    h: cb::cublasHandle_t,
    ta: cb::cublasOperation_t,
    tb: cb::cublasOperation_t,
    mm: usize,
    n: usize,
    k: usize,
    a: u64,
    lda: usize,
    b: u64,
    ldb: usize,
    c: u64,
    ldc: usize,
) -> Result<()> {
    let one = cb::cuComplex { x: 1.0, y: 0.0 };
    let zero = cb::cuComplex { x: 0.0, y: 0.0 };
    cublas_check(
        cb::cublasCgemm_v2_64(
            h,
            ta,
            tb,
            mm as i64,
            n as i64,
            k as i64,
            &one,
            a as *const cb::cuComplex,
            lda as i64,
            b as *const cb::cuComplex,
            ldb as i64,
            &zero,
            c as *mut cb::cuComplex,
            ldc as i64,
        ),
        "cublasCgemm",
    )
}

/// Largest rank the fused kernel takes (its shared-memory tile, `MATCH_K` in kernels.cu).
const FUSED_MAX_RANK: usize = 32;
/// Voxels per block of the fused kernel (`MATCH_V`).
const FUSED_VOXELS: u64 = 128;

/// `KMM_MATCH_FUSED=0` matches compressed problems with GEMM and argmax instead of the fused
/// kernel (for comparison).
fn fused_enabled() -> bool {
    std::env::var("KMM_MATCH_FUSED").map_or(true, |v| v != "0")
}

/// Compressed matching in one kernel (kmm_match_fused): no GEMM scratch, no chunks.
#[allow(clippy::too_many_arguments)]
fn match_fused(m: &Manager, norms_fn: &Function, cdict: u64, k: usize, natoms: usize, inv: u64, csig: u64, sig: u64, ntr: usize, nvoxels: usize, a: MatchAddrs) -> Result<()> {
    let fused_fn = function(m, &[], "kmm_match_fused")?;
    let inv_x = Scratch::new(m, (nvoxels * 4) as u64)?;
    let mut p = [sig, ntr as u64, nvoxels as u64, inv_x.addr];
    let mut q = [
        cdict,
        k as u64,
        natoms as u64,
        inv,
        csig,
        inv_x.addr,
        nvoxels as u64,
        a.index,
        a.score,
        a.pd,
        a.params,
        a.out_params,
        a.atom_offset,
        a.accumulate as u64,
    ];
    // SAFETY: the buffers hold the sizes checked in run::match_dictionary; one stream orders them.
    unsafe {
        norms_fn.launch(m.raw_stream(), grid_for(nvoxels as u64 * 32, 256)?, [256, 1, 1], 0, &mut p)?;
        fused_fn.launch(m.raw_stream(), grid_for(nvoxels as u64, FUSED_VOXELS as u32)?, [256, 1, 1], 0, &mut q)
    }
}

/// Voxels per GEMM chunk: the scratch of natoms x chunk complex values takes at most half the
/// free memory, and at most `KMM_MATCH_SCRATCH_BYTES` (default 2 GiB).
pub fn match_chunk(m: &Manager, natoms: usize, nvoxels: usize) -> Result<usize> {
    let (free, _) = m.memory_info()?;
    let cap = std::env::var("KMM_MATCH_SCRATCH_BYTES").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(2 << 30);
    let mut budget = (free / 2).min(cap);
    // Under a hard limit, a quarter of it at most: the dictionary and signals share it.
    if m.config().hard_limit > 0 {
        budget = budget.min(m.config().hard_limit / 4);
    }
    let per_voxel = natoms as u64 * 8;
    Ok(((budget / per_voxel) as usize).clamp(1, nvoxels))
}

/// Writes the compression basis of a dictionary (`ntr x rank` complex f32) to the device
/// address `out`: on the device with cuSOLVER ([`super::gpu_svd`]); without it, the Gram matrix
/// by CGEMM is downloaded (the stream is waited for) and iterated on the host.
#[allow(clippy::too_many_arguments)]
fn compression_basis(m: &Manager, h: cb::cublasHandle_t, solver: Option<cs::cusolverDnHandle_t>, dict: u64, ntr: usize, natoms: usize, rank: usize, out: u64) -> Result<()> {
    use cb::cublasOperation_t::*;
    if let Some(s) = solver {
        return super::gpu_svd::compression_basis(m, h, s, dict, ntr, natoms, rank, out);
    }
    let g = Scratch::new(m, (ntr * ntr * 8) as u64)?;
    unsafe { cgemm(h, CUBLAS_OP_N, CUBLAS_OP_C, ntr, ntr, natoms, dict, ntr, dict, ntr, g.addr, ntr)? };
    let mut host = vec![[0f32; 2]; ntr * ntr];
    unsafe { m.copy_to_host(host.as_mut_ptr() as *mut u8, g.handle, 0, (ntr * ntr * 8) as u64, Completion::Wait)? };
    let gram: Vec<_> = host.iter().map(|c| super::cpu::C64::new(c[0] as f64, c[1] as f64)).collect();
    let u: Vec<[f32; 2]> = svd::dominant_subspace(&gram, ntr, rank).iter().map(|c| [c.re as f32, c.im as f32]).collect();
    let up = Scratch::upload(m, &u)?;
    // SAFETY: both hold ntr x rank values on the device; the copy is on the manager's stream.
    unsafe { m.stream().copy_d2d(out, up.addr, (ntr * rank * 8) as u64) }
}

/// Writes the compression basis of a dictionary to the device address `basis`.
pub fn compression_basis_into(m: &Manager, dict: u64, ntr: usize, natoms: usize, rank: usize, basis: u64) -> Result<()> {
    with_solver(m, true, |h, s| compression_basis(m, h, s, dict, ntr, natoms, rank, basis))
}

/// Matching on the device. Compressed, the dictionary and signals are first projected on the
/// basis (D <- U^H D, X <- U^H X by CGEMM) and atoms are normalised in the basis; the signal
/// norms in the scores are those of the uncompressed signals either way.
#[allow(clippy::too_many_arguments)]
pub fn match_dictionary(m: &Manager, dict: u64, ntr: usize, natoms: usize, sig: u64, nvoxels: usize, compression: MappedCompression, a: MatchAddrs) -> Result<()> {
    use cb::cublasOperation_t::*;
    let norms_fn = function(m, &[], "kmm_inv_norms")?;
    let argmax_fn = function(m, &[], "kmm_argmax")?;
    with_solver(m, matches!(compression, MappedCompression::OwnBasis(_)), |h, solver| {
        let (_own, basis) = match compression {
            MappedCompression::Full => (None, None),
            MappedCompression::OwnBasis(rank) => {
                let u = Scratch::new(m, (ntr * rank * 8) as u64)?;
                compression_basis(m, h, solver, dict, ntr, natoms, rank, u.addr)?;
                let addr = u.addr;
                (Some(u), Some((addr, rank)))
            }
            MappedCompression::Basis { addr, rank } => (None, Some((addr, rank))),
        };
        let (_dc, _xc, cdict, csig, k) = match basis {
            Some((u, rank)) => {
                let dc = Scratch::new(m, (rank * natoms * 8) as u64)?;
                let xc = Scratch::new(m, (rank * nvoxels * 8) as u64)?;
                unsafe {
                    cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, rank, natoms, ntr, u, ntr, dict, ntr, dc.addr, rank)?;
                    cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, rank, nvoxels, ntr, u, ntr, sig, ntr, xc.addr, rank)?;
                }
                let (d, x) = (dc.addr, xc.addr);
                (Some(dc), Some(xc), d, x, rank)
            }
            None => (None, None, dict, sig, ntr),
        };
        // 1/||d|| of the atoms as matched (projected when compressed).
        let inv = Scratch::new(m, (natoms * 4) as u64)?;
        let mut p = [cdict, k as u64, natoms as u64, inv.addr];
        unsafe { norms_fn.launch(m.raw_stream(), grid_for(natoms as u64 * 32, 256)?, [256, 1, 1], 0, &mut p)? };
        if k < ntr && k <= FUSED_MAX_RANK && fused_enabled() {
            return match_fused(m, &norms_fn, cdict, k, natoms, inv.addr, csig, sig, ntr, nvoxels, a);
        }
        let mut chunk = match_chunk(m, natoms, nvoxels)?;
        // The manager may hold less than the device's free memory suggests (its hard limit,
        // other buffers, fragmentation): a scratch that does not fit halves the voxels per pass.
        let scratch = loop {
            match Scratch::new(m, (natoms * chunk * 8) as u64) {
                Ok(s) => break s,
                Err(e) if e.status == crate::error::KmmStatus::KMM_ERROR_OUT_OF_MEMORY && chunk > 1 => chunk = chunk.div_ceil(2),
                Err(e) => return Err(e),
            }
        };
        let at = |base: u64, v0: usize, each: usize| if base == 0 { 0 } else { base + (v0 * each) as u64 };
        let mut v0 = 0;
        while v0 < nvoxels {
            let nv = chunk.min(nvoxels - v0);
            unsafe {
                cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, nv, k, cdict, k, csig + (v0 * k * 8) as u64, k, scratch.addr, natoms)?;
                // The signal norms come from the uncompressed signals.
                let mut p = [
                    scratch.addr,
                    natoms as u64,
                    natoms as u64,
                    inv.addr,
                    sig + (v0 * ntr * 8) as u64,
                    ntr as u64,
                    at(a.index, v0, 4),
                    at(a.score, v0, 4),
                    at(a.pd, v0, 8),
                    a.params,
                    at(a.out_params, v0, 16),
                    a.atom_offset,
                    a.accumulate as u64,
                ];
                argmax_fn.launch(m.raw_stream(), [nv as u32, 1, 1], [256, 1, 1], 0, &mut p)?;
            }
            v0 += nv;
        }
        Ok(())
    })
}

/// The GEMMs of an uncompressed match alone (same chunking, no reduction): the benchmark's
/// baseline. Queued on the manager's stream.
pub fn bare_gemm(m: &Manager, dict: u64, ntr: usize, natoms: usize, sig: u64, nvoxels: usize) -> Result<()> {
    with_cublas(m, |h| chunked_gemm(m, h, dict, ntr, natoms, sig, nvoxels))
}

/// The GEMMs of a match in a given basis alone: the projections of dictionary and signals and
/// the compressed GEMM (same chunking, no norms, no reduction). The benchmark's baseline.
#[allow(clippy::too_many_arguments)]
pub fn bare_compressed_gemm(m: &Manager, basis: u64, rank: usize, dict: u64, ntr: usize, natoms: usize, sig: u64, nvoxels: usize) -> Result<()> {
    use cb::cublasOperation_t::*;
    with_cublas(m, |h| {
        let dc = Scratch::new(m, (rank * natoms * 8) as u64)?;
        let xc = Scratch::new(m, (rank * nvoxels * 8) as u64)?;
        unsafe {
            cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, rank, natoms, ntr, basis, ntr, dict, ntr, dc.addr, rank)?;
            cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, rank, nvoxels, ntr, basis, ntr, sig, ntr, xc.addr, rank)?;
        }
        chunked_gemm(m, h, dc.addr, rank, natoms, xc.addr, nvoxels)
    })
}

fn chunked_gemm(m: &Manager, h: cb::cublasHandle_t, dict: u64, k: usize, natoms: usize, sig: u64, nvoxels: usize) -> Result<()> {
    use cb::cublasOperation_t::*;
    let chunk = match_chunk(m, natoms, nvoxels)?;
    let scratch = Scratch::new(m, (natoms * chunk * 8) as u64)?;
    let mut v0 = 0;
    while v0 < nvoxels {
        let nv = chunk.min(nvoxels - v0);
        unsafe { cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, nv, k, dict, k, sig + (v0 * k * 8) as u64, k, scratch.addr, natoms)? };
        v0 += nv;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fisp_lanes;

    /// The choice at the sizes measured on an H100 (132 multiprocessors), and for other state
    /// counts: never more than 32 states a thread, never more than a warp per atom.
    #[test]
    fn fisp_lanes_follow_the_atoms_per_wave() {
        if std::env::var_os("KMM_FISP_LANES").is_some() {
            return;
        }
        let at = |ns, natoms| fisp_lanes(ns, natoms, 132);
        assert_eq!([at(32, 8_000), at(32, 20_000), at(32, 50_000), at(32, 100_000), at(32, 350_000)], [4, 4, 4, 1, 1]);
        assert_eq!([at(64, 1_000), at(64, 50_000), at(64, 1_000_000)], [8, 8, 2]);
        assert_eq!([at(17, 1_000), at(17, 1_000_000)], [4, 1]);
        assert_eq!([at(100, 1_000), at(100, 1_000_000)], [16, 8]);
        assert_eq!([at(512, 1), at(512, 10_000_000)], [32, 32]);
        assert_eq!(at(1, 10), 1);
    }
}
