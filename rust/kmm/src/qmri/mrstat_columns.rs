//! The column path of the MR-STAT operations on CUDA (`mrstat_columns.cu` says the math): on a
//! Cartesian trajectory with one step, voxels of equal projection on the step (the columns of a
//! grid phantom) share the readout's phase, and the readout's decay and off-resonance is a short
//! series in time on each of a few pieces of the readout. The products' inner dimension is then
//! the number of segments (columns, cut at [`SEGMENT_VOXELS`]) times the series' terms instead of
//! the number of voxels: at 224 x 224 voxels and four terms, about 25 times fewer flops than the
//! dense path's products.
//!
//! The grouping of voxels is made on the host from the positions and kept (a few models, by a
//! 128-bit hash of the positions computed on the device with the model's check), so that a
//! Gauss-Newton loop, whose positions never change, groups once.

use super::{coil_groups, coils_per_product, with_fp32_blas, DeviceModel, BLOCK};
use crate::backend::cuda::module::{self, Function};
use crate::error::Result;
use crate::manager::copy::Completion;
use crate::manager::Manager;
use crate::qmri::gpu::{cgemm, grid_for, Scratch};
use cudarc::cublas::sys::cublasOperation_t::*;
use std::sync::{Arc, Mutex, OnceLock};

/// Terms of a piece's series at most.
const MAX_TERMS: usize = 12;
/// Pieces of a readout at most (`KMM_MRSTAT_PIECES` sets the fewest: the GPU tests cut the
/// readout with it).
const MAX_PIECES: usize = 8;
/// Bound of the series' remainder relative to the smallest decay factor of a piece.
const REMAINDER: f64 = 1e-7;
/// Most voxels of a segment (a longer column is cut): a block of `kmm_col_b_*` stages a
/// segment's voxels in shared memory and runs them in turn. `KMM_MRSTAT_SEGMENT_VOXELS` sets a
/// smaller bound (the GPU tests cut short columns).
const SEGMENT_VOXELS: usize = 256;
/// Voxels of the groupings kept, all together (16 bytes each).
const KEPT_VOXELS: usize = 1 << 24;
/// Pieces x (terms + 1) of the column adjoint at most where the path is not forced.
const ADJOINT_TERMS: u64 = 16;
/// Readout blocks of `kmm_col_b_*` at most (grid y).
const GRID_Y: u64 = 65535;

/// The terms of the series of exp(tau w) over |tau| <= 1 for every |w| <= `a` with
/// Re(tau w) >= -`d`: the least n <= `most` with a^n / n! e^(a + d) <= [`REMAINDER`] (e^a
/// bounds the remainder's series over its first term, e^-d the smallest |exp(tau w)|), or None.
pub(super) fn terms_for(a: f64, d: f64, most: usize) -> Option<usize> {
    if !(a.is_finite() && d.is_finite()) {
        return None;
    }
    let mut term = 1.0; // a^n / n!
    for n in 1..=most {
        term *= a / n as f64;
        if term * (a + d).exp() <= REMAINDER {
            return Some(n);
        }
    }
    None
}

/// A piece of the readout: samples `s0 .. s0 + n`, times within `c +- h` (s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Piece {
    pub s0: u64,
    pub n: u64,
    pub c: f64,
    pub h: f64,
}

/// The readout (sample s at t = (s - ns/2) dt) in `count` pieces of near equal length.
pub(super) fn pieces(ns: u64, dt: f64, count: u64) -> Vec<Piece> {
    let t = |s: u64| (s as f64 - 0.5 * ns as f64) * dt;
    (0..count)
        .map(|k| {
            let (s0, s1) = (k * ns / count, (k + 1) * ns / count);
            // A one-sample piece still gets a width: its tau is 0.
            Piece { s0, n: s1 - s0, c: 0.5 * (t(s0) + t(s1 - 1)), h: (0.5 * (s1 - s0 - 1) as f64 * dt).max(0.5 * dt) }
        })
        .collect()
}

/// The pieces (at least `fewest`, at most [`MAX_PIECES`] and one a sample) and terms of the
/// cheapest series (fewest pieces x terms, then fewest terms) that holds the remainder for
/// rates |z| up to `rate` and decay rates 1/T2 up to `decay` (1/s); None where none does.
pub(super) fn plan(ns: u64, dt: f64, rate: f64, decay: f64, fewest: usize) -> Option<(Vec<Piece>, usize)> {
    // The device's rates are f32: a margin over their rounding.
    let (rate, decay) = (rate * (1.0 + 1e-5), decay * (1.0 + 1e-5));
    let most = (MAX_PIECES as u64).min(ns);
    ((fewest as u64).min(most)..=most)
        .filter_map(|count| {
            let p = pieces(ns, dt, count);
            let h = p.iter().map(|p| p.h).fold(0.0, f64::max);
            terms_for(rate * h, decay * h, MAX_TERMS).map(|n| (p, n))
        })
        .min_by_key(|(p, n)| (p.len() * n, *n))
}

/// Voxels grouped by their projection `dk . x` (f64 of the f32 positions): segment g holds the
/// voxels `voxel[start[g]..start[g + 1]]` (ascending), all of projection `proj[g]`.
#[derive(Debug, PartialEq)]
pub(super) struct Segments {
    pub voxel: Vec<i32>,
    pub start: Vec<i32>,
    pub proj: Vec<f64>,
    /// Voxels of the longest segment.
    pub longest: usize,
}

/// Groups voxels of equal projection, in order of projection, at most `most` to a segment.
pub(super) fn segments(x: &[f32], y: &[f32], dk: [f32; 2], most: usize) -> Segments {
    // + 0.0 makes -0 and +0 one projection.
    let proj: Vec<f64> = x.iter().zip(y).map(|(&x, &y)| dk[0] as f64 * x as f64 + dk[1] as f64 * y as f64 + 0.0).collect();
    let mut order: Vec<i32> = (0..x.len() as i32).collect();
    order.sort_unstable_by(|&a, &b| proj[a as usize].total_cmp(&proj[b as usize]).then(a.cmp(&b)));
    let (mut start, mut seg_proj, mut longest) = (Vec::new(), Vec::new(), 0);
    for (i, &v) in order.iter().enumerate() {
        let p = proj[v as usize];
        let first = start.last().map_or(0, |&s| s as usize);
        if i == 0 || p.to_bits() != seg_proj.last().map_or(0, |q: &f64| q.to_bits()) || i - first == most {
            longest = longest.max(i - first);
            start.push(i as i32);
            seg_proj.push(p);
        }
    }
    longest = longest.max(order.len() - start.last().map_or(0, |&s| s as usize));
    start.push(order.len() as i32);
    Segments { voxel: order, start, proj: seg_proj, longest }
}

/// What a grouping is kept by: the positions' hash, the voxel count, the step's bits and the
/// segment bound.
type Key = ([u64; 2], u64, [u32; 2], usize);
/// The groupings kept, the last used first.
type Kept = Vec<(Key, Arc<Segments>)>;

/// The grouping of the model's voxels, made from its positions (read from the device) unless
/// kept.
fn grouping(m: &Manager, d: &DeviceModel, dk: [f32; 2], most: usize) -> Result<Arc<Segments>> {
    static KEEP: OnceLock<Mutex<Kept>> = OnceLock::new();
    let key: Key = (d.positions_hash, d.nvoxels, dk.map(f32::to_bits), most);
    let keep = KEEP.get_or_init(|| Mutex::new(Vec::new()));
    {
        let mut kept = keep.lock().unwrap();
        if let Some(i) = kept.iter().position(|(k, _)| *k == key) {
            let hit = kept.remove(i);
            let segs = hit.1.clone();
            kept.insert(0, hit);
            return Ok(segs);
        }
    }
    let n = d.nvoxels as usize;
    let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
    for (to, from) in [(&mut x, &d.x), (&mut y, &d.y)] {
        // SAFETY: `to` has room for the field's n floats; the copy completes before return.
        unsafe { m.copy_to_host(to.as_mut_ptr() as *mut u8, from.handle, 0, 4 * d.nvoxels, Completion::Wait)? };
    }
    let segs = Arc::new(segments(&x, &y, dk, most));
    let mut kept = keep.lock().unwrap();
    // Another thread may have grouped the same model meanwhile: keep one.
    kept.retain(|(k, _)| *k != key);
    kept.insert(0, (key, segs.clone()));
    let mut voxels = 0;
    kept.retain(|(_, s)| {
        voxels += s.voxel.len();
        voxels <= KEPT_VOXELS.max(s.voxel.len())
    });
    Ok(segs)
}

/// Whether the column path pays for `nseg` segments, `npieces` pieces of `nterms` terms, `ns`
/// samples and `nv` voxels: its products (terms x segments x samples) and kernels (pieces x
/// terms x voxels) against the dense products (samples x voxels). The adjoint's reduction reads
/// every piece's terms for every voxel and readout: past [`ADJOINT_TERMS`] of them it ran
/// slower than the dense path (H200: 4.95 against 4.49 ms at 2 pieces of 10 terms, 1.14 ms at 1
/// of 4; bench/results/qmri.md).
fn pays(adjoint: bool, npieces: u64, nterms: u64, nseg: u64, ns: u64, nv: u64) -> bool {
    if adjoint && npieces * (nterms + 1) > ADJOINT_TERMS {
        return false;
    }
    2 * nterms * (nseg * ns + 4 * npieces * nv) <= ns * nv
}

/// The column path's data for one call: the grouping on the device, E (ns x segments), the
/// pieces of the readout and the terms of their series.
pub(super) struct Columns<'a> {
    voxel: Scratch<'a>,
    start: Scratch<'a>,
    e: Scratch<'a>,
    nseg: u64,
    longest: u64,
    nterms: u64,
    pieces: Vec<Piece>,
    /// (c, h) of each piece, for the adjoint's reduction.
    piece_table: Scratch<'a>,
}

impl Columns<'_> {
    /// The compiled form its kernels take: terms and pieces.
    fn variant(&self) -> (u64, usize) {
        (self.nterms, self.pieces.len())
    }
}

/// A kernel of the column path, compiled for `c`'s terms and pieces (each pair compiles once).
fn column_function(m: &Manager, name: &str, c: (u64, usize)) -> Result<Function> {
    let defines = [format!("-DCOL_TERMS={}", c.0), format!("-DCOL_PIECES={}", c.1), format!("-DMAX_SEGMENT={SEGMENT_VOXELS}")];
    module::compile(m.device(), super::COLUMN_KERNELS, &crate::qmri::gpu::options(&defines))?.function(name)
}

/// A test setting of the column path: `name`'s value in 1..=`most`, or `unset` where unset.
fn setting(name: &str, most: usize, unset: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(unset),
        Ok(v) if v.is_empty() => Ok(unset),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (1..=most).contains(&n) => Ok(n),
            _ => crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {v:?} must be a whole number in 1..={most}"),
        },
    }
}

impl DeviceModel<'_> {
    /// The column path's data where it applies and pays, else None; `forced`: wherever it
    /// applies, and an error where it cannot (the series would need more than [`MAX_PIECES`]
    /// pieces, or the readouts more than the kernels' grid holds).
    pub(super) fn columns<'m>(&self, m: &'m Manager, dk: [f32; 2], forced: bool, adjoint: bool) -> Result<Option<Columns<'m>>> {
        let (nv, ns, nr) = (self.nvoxels, self.nsamples, self.nreadouts);
        let fewest_pieces = setting("KMM_MRSTAT_PIECES", MAX_PIECES, 1)?;
        let most = setting("KMM_MRSTAT_SEGMENT_VOXELS", SEGMENT_VOXELS, SEGMENT_VOXELS)?;
        let refuse = |why: String| -> Result<Option<Columns<'m>>> {
            if forced {
                crate::fail!(KMM_ERROR_INVALID_ARGUMENT, "KMM_MRSTAT_PATH = \"columns\" cannot run: {why}");
            }
            Ok(None)
        };
        if nr.div_ceil(BLOCK as u64) > GRID_Y {
            return refuse(format!("model->nreadouts = {nr} exceeds {}", GRID_Y * BLOCK as u64));
        }
        let Some((pieces, nterms)) = plan(ns, self.dt as f64, self.max_rate as f64, self.max_decay as f64, fewest_pieces) else {
            return refuse(format!(
                "the readout's decay and off-resonance (|-1/T2 + i 2 pi B0| up to {:.4e} 1/s over {:.4e} s) needs more than {} pieces of {MAX_TERMS} terms",
                self.max_rate,
                ns as f64 * self.dt as f64,
                ns.min(MAX_PIECES as u64)
            ));
        };
        let (npieces, nterms) = (pieces.len() as u64, nterms as u64);
        let worth = |nseg: u64| forced || pays(adjoint, npieces, nterms, nseg, ns, nv);
        // Before grouping: the fewest segments the voxels can make.
        if !worth(nv.div_ceil(most as u64)) {
            return Ok(None);
        }
        let segs = grouping(m, self, dk, most)?;
        let nseg = segs.proj.len() as u64;
        if !worth(nseg) {
            return Ok(None);
        }
        let (voxel, start, proj) = (Scratch::upload(m, &segs.voxel)?, Scratch::upload(m, &segs.start)?, Scratch::upload(m, &segs.proj)?);
        let piece_table = Scratch::upload(m, &pieces.iter().map(|p| [p.c, p.h]).collect::<Vec<_>>())?;
        let e = Scratch::new(m, ns * nseg * 8)?;
        let mut p = [proj.addr, e.addr, ns];
        // SAFETY: the arguments match kmm_col_e; e holds ns x nseg values.
        unsafe { column_function(m, "kmm_col_e", (nterms, pieces.len()))?.launch(m.raw_stream(), [nseg as u32, 1, 1], [BLOCK, 1, 1], 0, &mut p)? };
        Ok(Some(Columns { voxel, start, e, nseg, longest: segs.longest as u64, nterms, pieces, piece_table }))
    }

    /// The signal (`v` None) or J v, for groups of coils and pieces of the readout: B by
    /// `kmm_col_b_*`, the piece's rows of E times B^T by one product, the terms summed by
    /// `kmm_col_sum` into the piece's samples.
    pub(super) fn column_synthesis(&self, m: &Manager, c: &Columns, mag: [u64; 3], v: Option<u64>, out: u64) -> Result<()> {
        let (nr, ns, nc) = (self.nreadouts, self.nsamples, self.ncoils);
        let halves = if v.is_some() { 2 } else { 1 };
        let terms = halves * c.nterms;
        // Per coil: its B (terms x nr x nseg) and product (ns x terms x nr).
        let group = coils_per_product(nc, terms * nr * (c.nseg + ns) * 8);
        let b = Scratch::new(m, terms * group * nr * c.nseg * 8)?;
        let prod = Scratch::new(m, ns * terms * group * nr * 8)?;
        let fb = column_function(m, if v.is_some() { "kmm_col_b_jv" } else { "kmm_col_b_signal" }, c.variant())?;
        let fsum = column_function(m, "kmm_col_sum", c.variant())?;
        let [gr, _, _] = grid_for(nr, BLOCK)?;
        let dt = self.dt.to_bits() as u64;
        with_fp32_blas(m, |h| {
            for (c0, gc) in coil_groups(nc, group) {
                let stride = gc * nr;
                let cols = terms * stride;
                for piece in &c.pieces {
                    for i in 0..gc {
                        #[rustfmt::skip]
                        let mut p = [
                            self.coils + (c0 + i) * self.nvoxels * 8, self.rho.addr, self.x.addr, self.y.addr, self.t2.addr, self.b0.addr,
                            mag[0], mag[1], mag[2], v.unwrap_or(0), self.k.addr, c.voxel.addr, c.start.addr,
                            b.addr + i * nr * 8, cols, stride, nr, piece.c.to_bits(), piece.h.to_bits(),
                        ];
                        // SAFETY: the arguments match kmm_col_b_*; b holds cols x nseg values.
                        unsafe { fb.launch(m.raw_stream(), [c.nseg as u32, gr, 1], [BLOCK, 1, 1], 0, &mut p)? };
                    }
                    let (s0, n) = (piece.s0 as usize, piece.n as usize);
                    // prod (n x cols) = E[s0.., :] (n x nseg of ns x nseg) times b^T (b: cols x nseg).
                    // SAFETY: the scratch holds those shapes.
                    unsafe { cgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, cols as usize, c.nseg as usize, c.e.addr + 8 * s0 as u64, ns as usize, b.addr, cols as usize, prod.addr, n)? };
                    let mut p = [prod.addr, out + c0 * nr * ns * 8, ns, piece.s0, piece.n, stride, halves, dt, piece.c.to_bits(), piece.h.to_bits()];
                    // SAFETY: the arguments match kmm_col_sum; `out` holds the group's ns x stride values.
                    unsafe { fsum.launch(m.raw_stream(), grid_for(piece.n * stride, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
                }
            }
            Ok(())
        })
    }

    /// Re(J^H w), for groups of coils: per piece of the readout G = W'^H E with
    /// W' = [tau^l W] (l = 0..=nterms, the piece's samples) by one product, then a reduction
    /// per voxel and coil over every piece's G (`kmm_col_adjoint`).
    pub(super) fn column_adjoint(&self, m: &Manager, c: &Columns, mag: [u64; 3], w: u64, out: u64) -> Result<()> {
        let (nr, ns, nc) = (self.nreadouts, self.nsamples, self.ncoils);
        let terms = c.nterms + 1;
        let npieces = c.pieces.len() as u64;
        let longest_piece = c.pieces.iter().map(|p| p.n).max().unwrap_or(ns);
        // Per coil: its part of W' (samples of a piece x terms x nr) and of G (pieces x terms x nr x nseg).
        let group = coils_per_product(nc, terms * nr * (longest_piece + npieces * c.nseg) * 8);
        let wp = Scratch::new(m, longest_piece * terms * group * nr * 8)?;
        let g = Scratch::new(m, npieces * terms * group * nr * c.nseg * 8)?;
        let (ftw, fadj) = (column_function(m, "kmm_col_tw", c.variant())?, column_function(m, "kmm_col_adjoint", c.variant())?);
        let [gv, _, _] = grid_for(c.longest * 32, BLOCK)?;
        let dt = self.dt.to_bits() as u64;
        with_fp32_blas(m, |h| {
            for (c0, gc) in coil_groups(nc, group) {
                let stride = gc * nr;
                let cols = terms * stride;
                let pstride = cols * c.nseg;
                for (k, piece) in c.pieces.iter().enumerate() {
                    let mut p = [w + c0 * nr * ns * 8, wp.addr, ns, piece.s0, piece.n, stride, dt, piece.c.to_bits(), piece.h.to_bits()];
                    // SAFETY: the arguments match kmm_col_tw; wp holds n x cols values.
                    unsafe { ftw.launch(m.raw_stream(), grid_for(piece.n * stride, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
                    let (s0, n) = (piece.s0 as usize, piece.n as usize);
                    // G_k (cols x nseg) = wp^H (wp: n x cols) times E[s0.., :] (n x nseg of ns x nseg).
                    // SAFETY: the scratch holds those shapes.
                    unsafe { cgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, cols as usize, c.nseg as usize, n, wp.addr, n, c.e.addr + 8 * s0 as u64, ns as usize, g.addr + 8 * k as u64 * pstride, cols as usize)? };
                }
                for i in 0..gc {
                    #[rustfmt::skip]
                    let mut p = [
                        g.addr + i * nr * 8, cols, stride, pstride, c.piece_table.addr,
                        self.coils + (c0 + i) * self.nvoxels * 8, self.rho.addr, self.x.addr, self.y.addr, self.t2.addr, self.b0.addr,
                        mag[0], mag[1], mag[2], self.k.addr, c.voxel.addr, c.start.addr, out, nr, (c0 + i > 0) as u64,
                    ];
                    // SAFETY: the arguments match kmm_col_adjoint.
                    unsafe { fadj.launch(m.raw_stream(), [c.nseg as u32, gv, 1], [BLOCK, 1, 1], 0, &mut p)? };
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3 x 4 grid stepped along x: three columns of four, in order of x; cut at three, each
    /// column a segment of three and one of one.
    #[test]
    fn voxels_of_a_grid_group_into_columns() {
        let (x, y): (Vec<f32>, Vec<f32>) = (0..12).map(|i| ((i % 3) as f32 - 1.0, (i / 3) as f32)).unzip();
        let s = segments(&x, &y, [2.0, 0.0], 256);
        assert_eq!(s.start, vec![0, 4, 8, 12]);
        assert_eq!(s.voxel, vec![0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]);
        assert_eq!(s.proj, vec![-2.0, 0.0, 2.0]);
        assert_eq!(s.longest, 4);
        let cut = segments(&x, &y, [2.0, 0.0], 3);
        assert_eq!(cut.start, vec![0, 3, 4, 7, 8, 11, 12]);
        assert_eq!(cut.proj, vec![-2.0, -2.0, 0.0, 0.0, 2.0, 2.0]);
        assert_eq!(cut.longest, 3);
        // -0 and +0 are one projection.
        let zeros = segments(&[-0.0, 0.0, 1.0], &[0.0, 0.0, 0.0], [1.0, 0.0], 256);
        assert_eq!((zeros.start, zeros.proj), (vec![0, 2, 3], vec![0.0, 1.0]));
    }

    /// The worst relative error of the series of exp(tau w) in `n` terms over |w| = a at angles
    /// `phis` (radians), tau = +-1.
    fn worst(a: f64, n: usize, phis: &[f64]) -> f64 {
        let mut worst: f64 = 0.0;
        for &phi in phis {
            for tau in [-1.0, 1.0] {
                let (wr, wi) = (tau * a * phi.cos(), tau * a * phi.sin());
                let (mut sr, mut si, mut tr, mut ti) = (0.0, 0.0, 1.0, 0.0);
                for l in 0..n {
                    sr += tr;
                    si += ti;
                    let f = 1.0 / (l + 1) as f64;
                    (tr, ti) = ((tr * wr - ti * wi) * f, (tr * wi + ti * wr) * f);
                }
                let e = wr.exp();
                worst = worst.max(((sr - e * wi.cos()).powi(2) + (si - e * wi.sin()).powi(2)).sqrt() / e);
            }
        }
        worst
    }

    /// The series' terms bound its remainder, checked against exp itself: every direction of w
    /// with d = a, and off-resonance alone (w imaginary) with d = 0.
    #[test]
    fn terms_bound_the_remainder() {
        assert_eq!(terms_for(0.0, 0.0, MAX_TERMS), Some(1));
        assert_eq!(terms_for(f64::INFINITY, 0.0, MAX_TERMS), None);
        assert_eq!(terms_for(5.0, 5.0, MAX_TERMS), None);
        assert_eq!(terms_for(0.5, 0.5, 3), None);
        let all: Vec<f64> = (0..64).map(|k| k as f64 * std::f64::consts::TAU / 64.0).collect();
        let imaginary = [std::f64::consts::FRAC_PI_2];
        let cases = [0.011, 0.1, 0.5, 1.0].map(|a| (a, a, &all[..])).into_iter().chain([0.011, 0.5, 1.2].map(|a| (a, 0.0, &imaginary[..])));
        for (a, d, phis) in cases {
            let n = terms_for(a, d, MAX_TERMS).unwrap();
            let e = worst(a, n, phis);
            assert!(e <= REMAINDER, "a = {a}, d = {d}: {n} terms leave {e:e}");
            if n > 1 {
                assert!(worst(a, n - 1, phis) > REMAINDER * 1e-3, "a = {a}, d = {d}: {n} terms where fewer would do");
            }
        }
    }

    /// At the benchmark's size (224 columns of 224 voxels, 224 samples) the column path pays
    /// with one piece of 4 terms, and for the synthesis with two pieces of 10, not for the
    /// adjoint; a 6 x 6 grid (the GPU tests' problem) does not pay, nor do voxels in columns of
    /// one.
    #[test]
    fn the_column_path_pays_where_it_is_cheaper() {
        let (nseg, ns, nv) = (224, 224, 224 * 224);
        assert!(pays(false, 1, 4, nseg, ns, nv) && pays(true, 1, 4, nseg, ns, nv));
        assert!(pays(false, 2, 10, nseg, ns, nv));
        assert!(!pays(true, 2, 10, nseg, ns, nv));
        assert!(!pays(false, 1, 2, 6, 6, 36));
        assert!(!pays(false, 1, 4, nv, ns, nv));
    }

    /// Pieces cover the readout in order, each sample within its piece's c +- h; a rate one
    /// piece cannot hold takes several, fewer terms take more pieces, and past the most pieces
    /// there is no plan.
    #[test]
    fn pieces_cover_the_readout() {
        let (ns, dt) = (224u64, 5e-6);
        for count in [1, 2, 3, 7, 8] {
            let p = pieces(ns, dt, count);
            assert_eq!(p.iter().map(|p| p.n).sum::<u64>(), ns);
            let mut next = 0;
            for piece in &p {
                assert_eq!(piece.s0, next);
                next += piece.n;
                for s in piece.s0..piece.s0 + piece.n {
                    let t = (s as f64 - ns as f64 / 2.0) * dt;
                    assert!((t - piece.c).abs() <= piece.h * (1.0 + 1e-12));
                }
            }
        }
        assert!(pieces(3, dt, 3).iter().all(|p| p.n == 1 && p.h > 0.0));
        // T2 >= 50 ms, B0 = 0: one piece of four terms.
        let (p, n) = plan(ns, dt, 20.0, 20.0, 1).unwrap();
        assert_eq!((p.len(), n), (1, 4));
        // |B0| = 1 kHz: several pieces.
        let (p, n) = plan(ns, dt, std::f64::consts::TAU * 1000.0, 20.0, 1).unwrap();
        assert!(p.len() > 1 && n <= MAX_TERMS, "{} pieces of {n}", p.len());
        // At least three pieces where asked, never more than samples.
        assert_eq!(plan(ns, dt, 20.0, 20.0, 3).unwrap().0.len(), 3);
        assert_eq!(plan(2, dt, 20.0, 20.0, 3).unwrap().0.len(), 2);
        assert!(plan(ns, dt, 1e7, 20.0, 1).is_none());
    }
}
