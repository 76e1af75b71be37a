//! The compression basis on the GPU, by a randomized range finder with power iterations
//! (Halko, Martinsson and Tropp 2011): starting from a fixed pseudo-random block Q (`ntr x l`,
//! l = rank + [`OVERSAMPLE`]), each iteration Q <- QR(D (Dᴴ Q)) with two CGEMMs and cuSOLVER's
//! Householder QR; then Rayleigh-Ritz on the small Qᴴ D Dᴴ Q (cuSOLVER's Hermitian eigensolver)
//! keeps the dominant `rank` directions. The Gram matrix D Dᴴ is never formed: with 100000
//! atoms its CHERK alone took longer than all of this. Everything stays on the device.
//! Without cuSOLVER the Gram matrix is downloaded and iterated on the host ([`super::svd`]).

use super::gpu::{cgemm as gemm, Scratch};
use crate::error::Result;
use crate::fail;
use crate::manager::copy::Completion;
use crate::manager::Manager;
use cudarc::cublas::sys as cb;
use cudarc::cusolver::sys as cs;

/// Extra columns of the iterated block: the dominant `rank` directions converge at the rate of
/// (lambda_{rank + OVERSAMPLE} / lambda_rank) per iteration instead of lambda_{rank+1} / lambda_rank.
const OVERSAMPLE: usize = 16;
/// Power iterations. MRF dictionaries have fast-decaying spectra: with the oversampling, two
/// already give the basis that six give (the same energy kept to 1e-6 in the GPU tests, the
/// same exactness of the benchmark's rank-32 match, bench/results/qmri.md); three leave a
/// margin. `KMM_BASIS_ITERATIONS` overrides it (1 to 100), for tuning.
const ITERATIONS: usize = 3;

fn iterations() -> usize {
    std::env::var("KMM_BASIS_ITERATIONS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|n| (1..=100).contains(n)).unwrap_or(ITERATIONS)
}

/// The power iterations' products run on TF32 tensor cores: they only find the subspace, and
/// the Rayleigh-Ritz step that makes the basis from it runs in full FP32 (whatever
/// `KMM_MATCH_MATH` asks of matching), so the basis is as good (same benchmark evidence) at half
/// the time. `KMM_BASIS_MATH=fp32` keeps FP32 throughout.
fn iteration_math() -> cb::cublasMath_t {
    match std::env::var("KMM_BASIS_MATH").ok().as_deref() {
        Some("fp32") => cb::cublasMath_t::CUBLAS_DEFAULT_MATH,
        _ => cb::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
    }
}

fn set_math(h: cb::cublasHandle_t, math: cb::cublasMath_t) -> Result<()> {
    // SAFETY: a valid handle; the mode applies to the products queued after it.
    if unsafe { cb::cublasSetMathMode(h, math) } != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        fail!(KMM_ERROR_BACKEND, "cublasSetMathMode failed");
    }
    Ok(())
}

fn solver_check(status: cs::cusolverStatus_t, call: &str) -> Result<()> {
    if status == cs::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
        Ok(())
    } else {
        fail!(KMM_ERROR_BACKEND, "{call} failed: {status:?}")
    }
}

/// A fixed pseudo-random `ntr x l` start block. Not orthonormalised: the first product and QR
/// do that on the device (Gram-Schmidt on the host cost milliseconds at ntr = 1000).
fn random_block(ntr: usize, l: usize) -> Vec<[f32; 2]> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..ntr * l).map(|_| [rnd(), rnd()]).collect()
}

/// Atoms per slice of a split product over atoms: enough slices to fill the GPU, since a
/// product with a small `ntr x l` output and `natoms` terms gets few thread blocks.
const SPLIT_ATOMS: usize = 2048;

/// Y = D Z (`ntr x l`) for D `ntr x natoms` and Z `natoms x l` (ld natoms): partial products
/// over slices of atoms in one strided-batched CGEMM, then their sum by one more CGEMM.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_over_atoms(m: &Manager, h: cb::cublasHandle_t, dict: u64, ntr: usize, natoms: usize, z: u64, l: usize, y: u64) -> Result<()> {
    use cb::cublasOperation_t::*;
    let slices = natoms / SPLIT_ATOMS;
    if slices < 2 {
        return gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr, l, natoms, dict, ntr, z, natoms, y, ntr);
    }
    let rest = natoms - slices * SPLIT_ATOMS;
    let parts = slices + (rest > 0) as usize;
    let partial = Scratch::new(m, (parts * ntr * l * 8) as u64)?;
    let (one, zero) = (cb::cuComplex { x: 1.0, y: 0.0 }, cb::cuComplex { x: 0.0, y: 0.0 });
    let status = cb::cublasCgemmStridedBatched(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        ntr as i32,
        l as i32,
        SPLIT_ATOMS as i32,
        &one,
        dict as *const cb::cuComplex,
        ntr as i32,
        (ntr * SPLIT_ATOMS) as i64,
        z as *const cb::cuComplex,
        natoms as i32,
        SPLIT_ATOMS as i64,
        &zero,
        partial.addr as *mut cb::cuComplex,
        ntr as i32,
        (ntr * l) as i64,
        slices as i32,
    );
    if status != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        fail!(KMM_ERROR_BACKEND, "cublasCgemmStridedBatched failed: {status:?}");
    }
    if rest > 0 {
        let at = slices * SPLIT_ATOMS;
        gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr, l, rest, dict + (at * ntr * 8) as u64, ntr, z + (at * 8) as u64, natoms, partial.addr + (slices * ntr * l * 8) as u64, ntr)?;
    }
    // Y = [partials] (ntr*l x parts) times a vector of ones.
    let ones = Scratch::upload(m, &vec![[1f32, 0.0]; parts])?;
    gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr * l, 1, parts, partial.addr, ntr * l, ones.addr, parts, y, ntr * l)
}

/// Writes the compression basis (`ntr x rank` complex f32, orthonormal columns) of the
/// dictionary at `dict` to the device address `out`, on the manager's stream.
#[allow(clippy::too_many_arguments)]
pub fn compression_basis(
    m: &Manager,
    h: cb::cublasHandle_t,
    solver: cs::cusolverDnHandle_t,
    dict: u64,
    ntr: usize,
    natoms: usize,
    rank: usize,
    out: u64,
) -> Result<()> {
    use cb::cublasOperation_t::*;
    let l = (rank + OVERSAMPLE).min(ntr);
    let q = Scratch::upload(m, &random_block(ntr, l))?;
    let z = Scratch::new(m, (natoms * l * 8) as u64)?;
    let tau = Scratch::new(m, (l * 8) as u64)?;
    let info = Scratch::new(m, 4)?;
    let (mut lq, mut lg) = (0i32, 0i32);
    // SAFETY: size queries on valid shapes (q is ntr x l, l <= ntr).
    unsafe {
        solver_check(cs::cusolverDnCgeqrf_bufferSize(solver, ntr as i32, l as i32, q.addr as *mut cs::cuComplex, ntr as i32, &mut lq), "cusolverDnCgeqrf_bufferSize")?;
        solver_check(
            cs::cusolverDnCungqr_bufferSize(solver, ntr as i32, l as i32, l as i32, q.addr as *const cs::cuComplex, ntr as i32, tau.addr as *const cs::cuComplex, &mut lg),
            "cusolverDnCungqr_bufferSize",
        )?;
    }
    let lwork = lq.max(lg).max(1);
    let work = Scratch::new(m, lwork as u64 * 8)?;
    // The caller's math mode (KMM_MATCH_MATH) comes back after the basis is made. (An error on
    // the way leaves the handle in another mode: every taker of a handle sets its own.)
    let mut caller_math = cb::cublasMath_t::CUBLAS_DEFAULT_MATH;
    // SAFETY: a valid handle.
    if unsafe { cb::cublasGetMathMode(h, &mut caller_math) } != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        fail!(KMM_ERROR_BACKEND, "cublasGetMathMode failed");
    }
    set_math(h, iteration_math())?;
    for _ in 0..iterations() {
        // SAFETY: all buffers are on the device with the sizes above; one stream orders them.
        unsafe {
            gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, l, ntr, dict, ntr, q.addr, ntr, z.addr, natoms)?; // Z = D^H Q
            gemm_over_atoms(m, h, dict, ntr, natoms, z.addr, l, q.addr)?; // Y = D Z
            let a = q.addr as *mut cs::cuComplex;
            let (t, wk, inf) = (tau.addr as *mut cs::cuComplex, work.addr as *mut cs::cuComplex, info.addr as *mut i32);
            solver_check(cs::cusolverDnCgeqrf(solver, ntr as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCgeqrf")?;
            solver_check(cs::cusolverDnCungqr(solver, ntr as i32, l as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCungqr")?;
        }
    }
    set_math(h, cb::cublasMath_t::CUBLAS_DEFAULT_MATH)?;
    // Rayleigh-Ritz: H = Q^H (D (D^H Q)) (l x l), its eigenvectors by cuSOLVER (ascending
    // eigenvalues); the basis is Q times the last `rank` of them, dominant first (R selects
    // and reverses them). On the host this small step took milliseconds (subspace iteration).
    let small = Scratch::new(m, (l * l * 8) as u64)?;
    let y = Scratch::new(m, (ntr * l * 8) as u64)?;
    let eigenvalues = Scratch::new(m, (l * 4) as u64)?;
    let select: Vec<[f32; 2]> = (0..rank).flat_map(|j| (0..l).map(move |i| if i == l - 1 - j { [1.0, 0.0] } else { [0.0, 0.0] })).collect();
    let select = Scratch::upload(m, &select)?;
    let r = Scratch::new(m, (l * rank * 8) as u64)?;
    let (jobz, uplo) = (cs::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR, cs::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER);
    let mut le = 0i32;
    // SAFETY: as above; small is l x l, eigenvalues l floats, r l x rank.
    unsafe {
        gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, l, ntr, dict, ntr, q.addr, ntr, z.addr, natoms)?;
        gemm_over_atoms(m, h, dict, ntr, natoms, z.addr, l, y.addr)?;
        gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, l, l, ntr, q.addr, ntr, y.addr, ntr, small.addr, l)?;
        let (a, w) = (small.addr as *mut cs::cuComplex, eigenvalues.addr as *mut f32);
        solver_check(cs::cusolverDnCheevd_bufferSize(solver, jobz, uplo, l as i32, a, l as i32, w, &mut le), "cusolverDnCheevd_bufferSize")?;
        let ework = Scratch::new(m, le.max(1) as u64 * 8)?;
        solver_check(cs::cusolverDnCheevd(solver, jobz, uplo, l as i32, a, l as i32, w, ework.addr as *mut cs::cuComplex, le.max(1), info.addr as *mut i32), "cusolverDnCheevd")?;
    }
    // The eigensolver's status (the QRs' only reports bad arguments, which these are not).
    let mut status = 0i32;
    // SAFETY: `status` has room for the 4 bytes; the copy completes before return.
    unsafe { m.copy_to_host(&mut status as *mut i32 as *mut u8, info.handle, 0, 4, Completion::Wait)? };
    let mut nan_r = None;
    if status == 0 {
        // SAFETY: as above.
        unsafe { gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, l, rank, l, small.addr, l, select.addr, l, r.addr, l)? };
    } else {
        // A dictionary holding NaN or Inf makes a matrix no eigensolver converges on; its basis
        // is NaN, and nothing matches in it (as nothing matches such atoms uncompressed).
        // Otherwise the failure is the solver's.
        let mut host = vec![[0f32; 2]; l * l];
        // SAFETY: q and y are as the step left them; `host` has room for l x l values.
        unsafe {
            gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, l, l, ntr, q.addr, ntr, y.addr, ntr, small.addr, l)?;
            m.copy_to_host(host.as_mut_ptr() as *mut u8, small.handle, 0, (l * l * 8) as u64, Completion::Wait)?;
        }
        if host.iter().all(|c| c[0].is_finite() && c[1].is_finite()) {
            fail!(KMM_ERROR_BACKEND, "cusolverDnCheevd did not converge on the {l} x {l} Rayleigh-Ritz matrix (info = {status})");
        }
        nan_r = Some(Scratch::upload(m, &vec![[f32::NAN, f32::NAN]; l * rank])?);
    }
    let r_addr = nan_r.as_ref().map_or(r.addr, |s| s.addr);
    // SAFETY: as above; r_addr holds l x rank values.
    unsafe { gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr, rank, l, q.addr, ntr, r_addr, l, out, ntr)? };
    set_math(h, caller_math)
}
