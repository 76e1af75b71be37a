//! The compression basis on the GPU: the Gram matrix G = D D^H by CHERK, then orthogonal
//! (subspace) iteration V <- QR(G V) with CHEMM and cuSOLVER's Householder QR, oversampled by
//! [`OVERSAMPLE`] columns, and a Rayleigh-Ritz step on the small V^H G V (on the host, in f64)
//! that keeps the dominant `rank` directions. Everything of size ntr x ntr or ntr x natoms stays
//! on the device; the host sees an l x l matrix (l = rank + oversampling) once.
//! Without cuSOLVER the Gram matrix is downloaded and iterated on the host ([`super::svd`]).

use super::gpu::Scratch;
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
/// Orthogonal iterations on the device. MRF dictionaries have fast-decaying spectra.
/// `KMM_BASIS_ITERATIONS` overrides it (1 to 100), for tuning.
const ITERATIONS: usize = 10;

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

fn blas_check(status: cb::cublasStatus_t, call: &str) -> Result<()> {
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        fail!(KMM_ERROR_BACKEND, "{call} failed: {status:?}")
    }
}

const ONE: cb::cuComplex = cb::cuComplex { x: 1.0, y: 0.0 };
const ZERO: cb::cuComplex = cb::cuComplex { x: 0.0, y: 0.0 };

/// The Gram matrix D D^H (`ntr x ntr`, upper triangle) into `g`.
fn gram(h: cb::cublasHandle_t, dict: u64, ntr: usize, natoms: usize, g: u64) -> Result<()> {
    let (one, zero) = (1f32, 0f32);
    // SAFETY: dict holds ntr x natoms and g ntr x ntr complex f32 on the device.
    blas_check(
        unsafe {
            cb::cublasCherk_v2_64(
                h,
                cb::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
                cb::cublasOperation_t::CUBLAS_OP_N,
                ntr as i64,
                natoms as i64,
                &one,
                dict as *const cb::cuComplex,
                ntr as i64,
                &zero,
                g as *mut cb::cuComplex,
                ntr as i64,
            )
        },
        "cublasCherk",
    )
}

/// W = G V for the Hermitian G (upper triangle), V and W `ntr x l`.
unsafe fn hemm(h: cb::cublasHandle_t, g: u64, v: u64, w: u64, ntr: usize, l: usize) -> Result<()> {
    blas_check(
        cb::cublasChemm_v2_64(
            h,
            cb::cublasSideMode_t::CUBLAS_SIDE_LEFT,
            cb::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
            ntr as i64,
            l as i64,
            &ONE,
            g as *const cb::cuComplex,
            ntr as i64,
            v as *const cb::cuComplex,
            ntr as i64,
            &ZERO,
            w as *mut cb::cuComplex,
            ntr as i64,
        ),
        "cublasChemm",
    )
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
    let l = (rank + OVERSAMPLE).min(ntr);
    let g = Scratch::new(m, (ntr * ntr * 8) as u64)?;
    gram(h, dict, ntr, natoms, g.addr)?;
    let v = Scratch::upload(m, &svd::start_block(ntr, l).iter().map(|c| [c.re as f32, c.im as f32]).collect::<Vec<_>>())?;
    let w = Scratch::new(m, (ntr * l * 8) as u64)?;
    let tau = Scratch::new(m, (l * 8) as u64)?;
    let info = Scratch::new(m, 4)?;
    let (mut lq, mut lg) = (0i32, 0i32);
    // SAFETY: size queries on valid shapes (w is ntr x l, l <= ntr).
    unsafe {
        solver_check(cs::cusolverDnCgeqrf_bufferSize(solver, ntr as i32, l as i32, w.addr as *mut cs::cuComplex, ntr as i32, &mut lq), "cusolverDnCgeqrf_bufferSize")?;
        solver_check(
            cs::cusolverDnCungqr_bufferSize(solver, ntr as i32, l as i32, l as i32, w.addr as *const cs::cuComplex, ntr as i32, tau.addr as *const cs::cuComplex, &mut lg),
            "cusolverDnCungqr_bufferSize",
        )?;
    }
    let lwork = lq.max(lg).max(1);
    let work = Scratch::new(m, lwork as u64 * 8)?;
    let (mut cur, mut next) = (&v, &w);
    for _ in 0..iterations() {
        // SAFETY: all buffers are on the device with the sizes above; one stream orders them.
        unsafe {
            hemm(h, g.addr, cur.addr, next.addr, ntr, l)?;
            let a = next.addr as *mut cs::cuComplex;
            let (t, wk, inf) = (tau.addr as *mut cs::cuComplex, work.addr as *mut cs::cuComplex, info.addr as *mut i32);
            solver_check(cs::cusolverDnCgeqrf(solver, ntr as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCgeqrf")?;
            solver_check(cs::cusolverDnCungqr(solver, ntr as i32, l as i32, l as i32, a, ntr as i32, t, wk, lwork, inf), "cusolverDnCungqr")?;
        }
        std::mem::swap(&mut cur, &mut next);
    }
    // Rayleigh-Ritz: H = V^H G V (l x l) on the host; its dominant rank-dimensional subspace R
    // gives the basis V R.
    let small = Scratch::new(m, (l * l * 8) as u64)?;
    unsafe {
        hemm(h, g.addr, cur.addr, next.addr, ntr, l)?;
        super::gpu::cgemm(h, cb::cublasOperation_t::CUBLAS_OP_C, cb::cublasOperation_t::CUBLAS_OP_N, l, l, ntr, cur.addr, ntr, next.addr, ntr, small.addr, l)?;
    }
    let mut host = vec![[0f32; 2]; l * l];
    // SAFETY: `host` has room for l x l values; the copy completes before return.
    unsafe { m.copy_to_host(host.as_mut_ptr() as *mut u8, small.handle, 0, (l * l * 8) as u64, Completion::Wait)? };
    let hm: Vec<_> = host.iter().map(|c| super::cpu::C64::new(c[0] as f64, c[1] as f64)).collect();
    let r: Vec<[f32; 2]> = svd::dominant_subspace(&hm, l, rank).iter().map(|c| [c.re as f32, c.im as f32]).collect();
    let rd = Scratch::upload(m, &r)?;
    unsafe { super::gpu::cgemm(h, cb::cublasOperation_t::CUBLAS_OP_N, cb::cublasOperation_t::CUBLAS_OP_N, ntr, rank, l, cur.addr, ntr, rd.addr, l, out, ntr) }
}
