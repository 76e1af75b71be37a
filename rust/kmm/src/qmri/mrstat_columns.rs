//! The column path of the MR-STAT operations on CUDA (`mrstat_columns.cu` says the math): on a
//! Cartesian trajectory with one step, voxels of equal projection on the step (the columns of a
//! grid phantom) share the readout's phase, and the readout's decay and off-resonance is a short
//! series in time. The products' inner dimension is then the number of segments (columns, cut
//! at [`SEGMENT_VOXELS`]) times the series' terms instead of the number of voxels: at 224 x 224
//! voxels and four terms, about 25 times fewer flops than the dense path's products.
//!
//! The grouping of voxels is made on the host from the positions and kept (a few models, by a
//! 128-bit hash of the positions computed on the device with the model's check), so that a
//! Gauss-Newton loop, whose positions never change, groups once.

use super::{coils_per_product, synthesis_product, adjoint_product, with_fp32_blas, DeviceModel, BLOCK};
use crate::qmri::gpu::{grid_for, Scratch};
use crate::backend::cuda::module::{self, Function};
use crate::error::Result;
use crate::manager::copy::Completion;
use crate::manager::Manager;
use std::sync::{Arc, Mutex, OnceLock};

/// Terms the kernels hold at most (`MAX_TERMS` of `mrstat_columns.cu`).
const MAX_TERMS: usize = 12;
/// Bound of the series' remainder relative to the voxel's smallest decay factor.
const REMAINDER: f64 = 1e-7;
/// Most voxels of a segment (a longer column is cut): a block of `kmm_col_b_*` stages a
/// segment's voxels in shared memory and runs them in turn. `KMM_MRSTAT_SEGMENT_VOXELS` sets a
/// smaller bound (the GPU tests cut short columns).
const SEGMENT_VOXELS: usize = 256;
/// Groupings kept.
const KEPT: usize = 4;

/// The terms of the series of exp(tau w) over |tau| <= 1 for every |w| <= `a` (w = h z of a
/// voxel): the least n with a^n / n! e^(2a) <= [`REMAINDER`] (e^a bounds the remainder's series
/// over its first term, e^-a the smallest |exp(tau w)|), or None past [`MAX_TERMS`].
pub(super) fn terms_for(a: f64) -> Option<usize> {
    if !a.is_finite() {
        return None;
    }
    let mut term = 1.0; // a^n / n!
    for n in 1..=MAX_TERMS {
        term *= a / n as f64;
        if term * (2.0 * a).exp() <= REMAINDER {
            return Some(n);
        }
    }
    None
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
    kept.insert(0, (key, segs.clone()));
    kept.truncate(KEPT);
    Ok(segs)
}

/// The column path's data for one call: the grouping on the device, E (ns x segments) and the
/// series' terms.
pub(super) struct Columns<'a> {
    voxel: Scratch<'a>,
    start: Scratch<'a>,
    e: Scratch<'a>,
    nseg: u64,
    longest: u64,
    nterms: u64,
    /// h = ns dt / 2 (s): the series runs over t / h.
    h: f64,
}

/// A kernel of the column path, compiled for `nterms` terms (each count compiles once).
fn column_function(m: &Manager, name: &str, nterms: u64) -> Result<Function> {
    let defines = [format!("-DCOL_TERMS={nterms}"), format!("-DMAX_SEGMENT={SEGMENT_VOXELS}")];
    module::compile(m.device(), super::COLUMN_KERNELS, &crate::qmri::gpu::options(&defines))?.function(name)
}

impl DeviceModel<'_> {
    /// The column path's data where it applies and pays, else None; `forced`: wherever it
    /// applies, and an error where the series would take more than [`MAX_TERMS`] terms.
    pub(super) fn columns<'m>(&self, m: &'m Manager, dk: [f32; 2], forced: bool) -> Result<Option<Columns<'m>>> {
        let (nv, ns) = (self.nvoxels, self.nsamples);
        let h = 0.5 * ns as f64 * self.dt as f64;
        // The device's |z| is f32: a margin over its rounding.
        let a = self.max_rate as f64 * h * (1.0 + 1e-5);
        let Some(nterms) = terms_for(a) else {
            if forced {
                crate::fail!(
                    KMM_ERROR_INVALID_ARGUMENT,
                    "KMM_MRSTAT_PATH = \"columns\": the readout's decay and off-resonance (|-1/T2 + i 2 pi B0| ns dt / 2 up to {a:.3}) needs more than {MAX_TERMS} terms"
                );
            }
            return Ok(None);
        };
        let nterms = nterms as u64;
        let most = std::env::var("KMM_MRSTAT_SEGMENT_VOXELS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&g| g > 0 && g <= SEGMENT_VOXELS).unwrap_or(SEGMENT_VOXELS);
        // Products of nterms x (segments x ns) and kernels of nterms x nv, against ns x nv.
        let pays = |nseg: u64| 2 * nterms * (nseg * ns + 4 * nv) <= ns * nv;
        if !forced && !pays(nv.div_ceil(most as u64)) {
            return Ok(None);
        }
        let segs = grouping(m, self, dk, most)?;
        let nseg = segs.proj.len() as u64;
        if !forced && !pays(nseg) {
            return Ok(None);
        }
        let (voxel, start, proj) = (Scratch::upload(m, &segs.voxel)?, Scratch::upload(m, &segs.start)?, Scratch::upload(m, &segs.proj)?);
        let e = Scratch::new(m, ns * nseg * 8)?;
        let mut p = [proj.addr, e.addr, ns];
        // SAFETY: the arguments match kmm_col_e; e holds ns x nseg values.
        unsafe { column_function(m, "kmm_col_e", nterms)?.launch(m.raw_stream(), [nseg as u32, 1, 1], [BLOCK, 1, 1], 0, &mut p)? };
        Ok(Some(Columns { voxel, start, e, nseg, longest: segs.longest as u64, nterms, h }))
    }

    /// The signal (`v` None) or J v, for groups of coils: B by `kmm_col_b`, E B^T by one
    /// product, the terms summed by `kmm_col_sum`.
    pub(super) fn column_synthesis(&self, m: &Manager, c: &Columns, mag: [u64; 3], v: Option<u64>, out: u64) -> Result<()> {
        let (nr, ns, nc) = (self.nreadouts, self.nsamples, self.ncoils);
        let terms = if v.is_some() { 2 * c.nterms } else { c.nterms };
        // Per coil: its B (terms x nr x nseg) and product (ns x terms x nr).
        let group = coils_per_product(nc, terms * nr * (c.nseg + ns) * 8);
        let b = Scratch::new(m, terms * group * nr * c.nseg * 8)?;
        let prod = Scratch::new(m, ns * terms * group * nr * 8)?;
        let fb = column_function(m, if v.is_some() { "kmm_col_b_jv" } else { "kmm_col_b_signal" }, c.nterms)?;
        let fsum = column_function(m, "kmm_col_sum", c.nterms)?;
        let [gr, _, _] = grid_for(nr, BLOCK)?;
        with_fp32_blas(m, |h| {
            for c0 in (0..nc).step_by(group as usize) {
                let gc = group.min(nc - c0);
                let stride = gc * nr;
                let cols = terms * stride;
                for i in 0..gc {
                    #[rustfmt::skip]
                    let mut p = [
                        self.coils + (c0 + i) * self.nvoxels * 8, self.rho.addr, self.x.addr, self.y.addr, self.t2.addr, self.b0.addr,
                        mag[0], mag[1], mag[2], v.unwrap_or(0), self.k.addr, c.voxel.addr, c.start.addr,
                        b.addr + i * nr * 8, cols, stride, nr, c.h.to_bits(),
                    ];
                    // SAFETY: the arguments match kmm_col_b_*; b holds cols x nseg values.
                    unsafe { fb.launch(m.raw_stream(), [c.nseg as u32, gr, 1], [BLOCK, 1, 1], 0, &mut p)? };
                }
                // SAFETY: e (ns x nseg), b (cols x nseg) and prod (ns x cols) hold the product's shapes.
                unsafe { synthesis_product(h, c.e.addr, b.addr, ns, c.nseg, cols, prod.addr)? };
                let halves = if v.is_some() { 2 } else { 1 };
                let mut p = [prod.addr, out + c0 * nr * ns * 8, ns, stride, halves, self.dt.to_bits() as u64];
                // SAFETY: the arguments match kmm_col_sum; `out` holds the group's ns x stride values.
                unsafe { fsum.launch(m.raw_stream(), grid_for(ns * stride, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
            }
            Ok(())
        })
    }

    /// Re(J^H w), for groups of coils: G = W'^H E with W' = [tau^l W] (l = 0..=nterms) by one
    /// product, then a reduction per voxel and coil (`kmm_col_adjoint`).
    pub(super) fn column_adjoint(&self, m: &Manager, c: &Columns, mag: [u64; 3], w: u64, out: u64) -> Result<()> {
        let (nr, ns, nc) = (self.nreadouts, self.nsamples, self.ncoils);
        let terms = c.nterms + 1;
        // Per coil: its part of W' (ns x terms x nr) and of G (terms x nr x nseg).
        let group = coils_per_product(nc, terms * nr * (ns + c.nseg) * 8);
        let wp = Scratch::new(m, ns * terms * group * nr * 8)?;
        let g = Scratch::new(m, terms * group * nr * c.nseg * 8)?;
        let (ftw, fadj) = (column_function(m, "kmm_col_tw", c.nterms)?, column_function(m, "kmm_col_adjoint", c.nterms)?);
        let [gv, _, _] = grid_for(c.longest * 32, BLOCK)?;
        with_fp32_blas(m, |h| {
            for c0 in (0..nc).step_by(group as usize) {
                let gc = group.min(nc - c0);
                let stride = gc * nr;
                let cols = terms * stride;
                let mut p = [w + c0 * nr * ns * 8, wp.addr, ns, stride];
                // SAFETY: the arguments match kmm_col_tw; wp holds ns x cols values.
                unsafe { ftw.launch(m.raw_stream(), grid_for(ns * stride, BLOCK)?, [BLOCK, 1, 1], 0, &mut p)? };
                // SAFETY: wp (ns x cols), e (ns x nseg) and g (cols x nseg) hold the product's shapes.
                unsafe { adjoint_product(h, wp.addr, c.e.addr, ns, c.nseg, cols, g.addr)? };
                for i in 0..gc {
                    #[rustfmt::skip]
                    let mut p = [
                        g.addr + i * nr * 8, cols, stride, self.coils + (c0 + i) * self.nvoxels * 8, self.rho.addr,
                        self.x.addr, self.y.addr, self.t2.addr, self.b0.addr, mag[0], mag[1], mag[2], self.k.addr,
                        c.voxel.addr, c.start.addr, out, nr, c.h.to_bits(), (c0 + i > 0) as u64,
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
        // A step along y groups rows; -0 and +0 are one projection.
        let rows = segments(&[-0.0, 0.0, 1.0], &[0.0, 0.0, 0.0], [1.0, 0.0], 256);
        assert_eq!((rows.start, rows.proj), (vec![0, 2, 3], vec![0.0, 1.0]));
    }

    /// The series' terms bound its remainder: checked against exp itself at the bound.
    #[test]
    fn terms_bound_the_remainder() {
        assert_eq!(terms_for(0.0), Some(1));
        assert_eq!(terms_for(f64::INFINITY), None);
        assert_eq!(terms_for(5.0), None);
        for a in [0.011, 0.1, 0.5, 1.0] {
            let n = terms_for(a).unwrap();
            // The worst of w = a e^(i phi), tau = +-1.
            let worst = (0..64)
                .map(|k| {
                    let phi = k as f64 * std::f64::consts::TAU / 64.0;
                    let (wr, wi) = (a * phi.cos(), a * phi.sin());
                    let (mut sr, mut si, mut tr, mut ti) = (0.0, 0.0, 1.0, 0.0);
                    for l in 0..n {
                        sr += tr;
                        si += ti;
                        let f = 1.0 / (l + 1) as f64;
                        (tr, ti) = ((tr * wr - ti * wi) * f, (tr * wi + ti * wr) * f);
                    }
                    let e = wr.exp();
                    (((sr - e * wi.cos()).powi(2) + (si - e * wi.sin()).powi(2)).sqrt()) / e
                })
                .fold(0.0, f64::max);
            assert!(worst <= REMAINDER, "a = {a}: {n} terms leave {worst:e}");
            if n > 1 {
                assert!(terms_for(a * 0.999).unwrap() <= n);
            }
        }
    }
}
