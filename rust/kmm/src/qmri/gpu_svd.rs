//! The compression basis on the GPU, by a randomized range finder with power iterations
//! (Halko, Martinsson and Tropp 2011): starting from a fixed pseudo-random block Q (`ntr x l`,
//! l = rank + [`OVERSAMPLE`]), each iteration Q <- QR(D (Dᴴ Q)) with two CGEMMs and cuSOLVER's
//! Householder QR; then Rayleigh-Ritz on the small (DᴴQ)ᴴ(DᴴQ) (on the host, in f64) keeps the
//! dominant `rank` directions. The Gram matrix D Dᴴ is never formed: with 100000 atoms its
//! CHERK alone took longer than all of this. Everything of size ntr x natoms stays on the
//! device; the host sees an l x l matrix once.
//! Without cuSOLVER the Gram matrix is downloaded and iterated on the host ([`super::svd`]).

use super::gpu::{cgemm as gemm, Scratch};
use super::svd;
use crate::error::Result;
use crate::fail;
use crate::manager::copy::Completion;
use crate::manager::Manager;
use cudarc::cublas::sys as cb;
use cudarc::cusolver::sys as cs;

/// Extra columns of the iterated block: the dominant `rank` directions converge at the rate of
/// (lambda_{rank + OVERSAMPLE} / lambda_rank) per iteration instead of lambda_{rank+1} / lambda_rank.
const OVERSAMPLE: usize = 8;
/// Power iterations. MRF dictionaries have fast-decaying spectra; with the oversampling, four
/// keep what the f64 reference's basis keeps to about 1e-6 of each atom's energy (tests).
/// `KMM_BASIS_ITERATIONS` overrides it (1 to 100), for tuning.
const ITERATIONS: usize = 4;

fn iterations() -> usize {
    std::env::var("KMM_BASIS_ITERATIONS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|n| (1..=100).contains(n)).unwrap_or(ITERATIONS)
}

fn solver_check(status: cs::cusolverStatus_t, call: &str) -> Result<()> {
    if status == cs::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
        Ok(())
    } else {
        fail!(KMM_ERROR_BACKEND, "{call} failed: {status:?}")
    }
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
    let q = Scratch::upload(m, &svd::start_block(ntr, l).iter().map(|c| [c.re as f32, c.im as f32]).collect::<Vec<_>>())?;
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
    for _ in 0..iterations() {
        // SAFETY: all buffers are on the device with the sizes above; one stream orders them.
        unsafe {
            gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, l, ntr, dict, ntr, q.addr, ntr, z.addr, natoms)?; // Z = D^H Q
            gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr, l, natoms, dict, ntr, z.addr, natoms, q.addr, ntr)?; // Y = D Z
            let a = q.addr as *mut cs::cuComplex;
            let (t, wk, inf) = (tau.addr as *mut cs::cuComplex, work.addr as *mut cs::cuComplex, info.addr as *mut i32);
            solver_check(cs::cusolverDnCgeqrf(solver, ntr as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCgeqrf")?;
            solver_check(cs::cusolverDnCungqr(solver, ntr as i32, l as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCungqr")?;
        }
    }
    // Rayleigh-Ritz: H = (D^H Q)^H (D^H Q) = Q^H D D^H Q (l x l) on the host; its dominant
    // rank-dimensional subspace R gives the basis Q R.
    let small = Scratch::new(m, (l * l * 8) as u64)?;
    unsafe {
        gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, natoms, l, ntr, dict, ntr, q.addr, ntr, z.addr, natoms)?;
        gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, l, l, natoms, z.addr, natoms, z.addr, natoms, small.addr, l)?;
    }
    let mut host = vec![[0f32; 2]; l * l];
    // SAFETY: `host` has room for l x l values; the copy completes before return.
    unsafe { m.copy_to_host(host.as_mut_ptr() as *mut u8, small.handle, 0, (l * l * 8) as u64, Completion::Wait)? };
    let hm: Vec<_> = host.iter().map(|c| super::cpu::C64::new(c[0] as f64, c[1] as f64)).collect();
    let r: Vec<[f32; 2]> = svd::dominant_subspace(&hm, l, rank).iter().map(|c| [c.re as f32, c.im as f32]).collect();
    let rd = Scratch::upload(m, &r)?;
    unsafe { gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ntr, rank, l, q.addr, ntr, rd.addr, l, out, ntr) }
}
