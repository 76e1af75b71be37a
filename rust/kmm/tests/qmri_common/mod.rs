//! Helpers for the qMRI tests: sequences, uploads and the calls through the C ABI.
#![allow(dead_code)]

use crate::common::*;
#[allow(unused_imports)]
pub use kmm::ffi::module::*;
pub use kmm::ffi::qmri::*;

pub type Cf = [f32; 2];

pub fn bytes_of<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, n) }.to_vec()
}

pub fn from_bytes<T: Copy + Default>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr() as *mut u8, n * std::mem::size_of::<T>()) };
    v
}

pub fn upload<T: Copy>(m: &Mgr, v: &[T]) -> KmmBuffer {
    let data = bytes_of(v);
    let b = m.alloc(data.len() as u64, DEVICE);
    m.upload(b, 0, &data);
    b
}

pub fn download<T: Copy + Default>(m: &Mgr, b: KmmBuffer, n: usize) -> Vec<T> {
    from_bytes(&m.download(b, 0, n * std::mem::size_of::<T>()))
}

/// The arrays a `KmmFispSequence` points into.
#[derive(Clone, Debug)]
pub struct FispSpec {
    pub flip: Vec<f32>,
    pub phase: Vec<f32>,
    pub profile: Vec<f32>,
    pub nprofile: u32,
    pub max_state: u32,
    pub tr: f32,
    pub te: f32,
    pub ti: f32,
}

impl FispSpec {
    pub fn constant(ntr: usize, flip: f32) -> FispSpec {
        FispSpec { flip: vec![flip; ntr], phase: vec![0.0; ntr], profile: vec![], nprofile: 0, max_state: 20, tr: 0.01, te: 0.005, ti: 0.02 }
    }
    /// A flip-angle train of the kind MRF uses: smooth sweeps between 0 and about 70 degrees.
    pub fn mrf(ntr: usize, max_state: u32) -> FispSpec {
        let flip = (0..ntr).map(|n| (n as f32 / 40.0).sin().abs() * 1.2 + 0.05).collect();
        FispSpec { flip, phase: vec![0.0; ntr], profile: vec![], nprofile: 0, max_state, tr: 0.0087, te: 0.0035, ti: 0.015 }
    }
    pub fn raw(&self) -> KmmFispSequence {
        KmmFispSequence {
            flip_angle: self.flip.as_ptr(),
            phase: self.phase.as_ptr(),
            profile: if self.nprofile == 0 { std::ptr::null() } else { self.profile.as_ptr() },
            ntr: self.flip.len() as u32,
            max_state: self.max_state,
            nprofile: self.nprofile,
            tr: self.tr,
            te: self.te,
            ti: self.ti,
        }
    }
    pub fn rust(&self) -> kmm::qmri::Fisp {
        kmm::qmri::Fisp {
            flip: self.flip.clone(),
            phase: self.phase.clone(),
            tr: self.tr,
            te: self.te,
            ti: self.ti,
            max_state: self.max_state,
            profile: self.profile.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct PssfpSpec {
    pub flip: Vec<f32>,
    pub phase: Vec<f32>,
    pub rf_shape: Vec<f32>,
    pub z: Vec<f32>,
    pub dt_ex: f32,
    pub dt_inv: f32,
    pub dt_pr: f32,
    pub gz_ex: f32,
    pub gz_pr: f32,
}

impl PssfpSpec {
    pub fn mrf(ntr: usize, nz: usize) -> PssfpSpec {
        let flip = (0..ntr).map(|n| (n as f32 / 30.0).sin().abs() * 1.0 + 0.05).collect();
        let nrf = 10;
        let z = (0..nz).map(|i| (i as f32 - (nz as f32 - 1.0) / 2.0) * 0.05).collect();
        PssfpSpec {
            flip,
            phase: vec![0.0; ntr],
            rf_shape: vec![1.0 / nrf as f32; nrf],
            z,
            dt_ex: 1e-4,
            dt_inv: 0.015,
            dt_pr: 0.002,
            gz_ex: 2.0,
            gz_pr: -10.0,
        }
    }
    pub fn raw(&self) -> KmmPssfpSequence {
        KmmPssfpSequence {
            flip_angle: self.flip.as_ptr(),
            phase: self.phase.as_ptr(),
            rf_shape: self.rf_shape.as_ptr(),
            z: self.z.as_ptr(),
            ntr: self.flip.len() as u32,
            nrf: self.rf_shape.len() as u32,
            nz: self.z.len() as u32,
            dt_ex: self.dt_ex,
            dt_inv: self.dt_inv,
            dt_pr: self.dt_pr,
            gz_ex: self.gz_ex,
            gz_pr: self.gz_pr,
        }
    }
    pub fn rust(&self) -> kmm::qmri::Pssfp {
        kmm::qmri::Pssfp {
            flip: self.flip.clone(),
            phase: self.phase.clone(),
            rf_shape: self.rf_shape.clone(),
            z: self.z.clone(),
            dt_ex: self.dt_ex,
            dt_inv: self.dt_inv,
            dt_pr: self.dt_pr,
            gz_ex: self.gz_ex,
            gz_pr: self.gz_pr,
        }
    }
}

pub fn atom(t1: f32, t2: f32, b1: f32, b0: f32) -> [f32; 4] {
    [t1, t2, b1, b0]
}

pub fn try_fisp(m: &Mgr, seq: &FispSpec, atoms: &[[f32; 4]]) -> Result<Vec<Cf>, KmmStatus> {
    let p = upload(m, atoms);
    let ntr = seq.flip.len();
    let out = m.alloc((ntr * atoms.len() * 8) as u64, DEVICE);
    let raw = seq.raw();
    let s = kmm_qmri_simulate_fisp(m.0, &raw, p, 0, atoms.len() as u64, out, 0);
    let r = if s == KMM_OK {
        m.sync();
        Ok(download(m, out, ntr * atoms.len()))
    } else {
        Err(s)
    };
    m.free(p);
    m.free(out);
    r
}

pub fn fisp(m: &Mgr, seq: &FispSpec, atoms: &[[f32; 4]]) -> Vec<Cf> {
    try_fisp(m, seq, atoms).unwrap_or_else(|s| panic!("{s:?}: {}", last_error()))
}

pub fn pssfp(m: &Mgr, seq: &PssfpSpec, atoms: &[[f32; 4]]) -> Vec<Cf> {
    let p = upload(m, atoms);
    let ntr = seq.flip.len();
    let out = m.alloc((ntr * atoms.len() * 8) as u64, DEVICE);
    let raw = seq.raw();
    ok(kmm_qmri_simulate_pssfp(m.0, &raw, p, 0, atoms.len() as u64, out, 0));
    m.sync();
    let r = download(m, out, ntr * atoms.len());
    m.free(p);
    m.free(out);
    r
}

pub struct Matched {
    pub index: Vec<i32>,
    pub score: Vec<f32>,
    pub pd: Vec<Cf>,
    pub params: Vec<[f32; 4]>,
}

pub fn match_signals(m: &Mgr, dict: &[Cf], ntr: usize, params: &[[f32; 4]], signals: &[Cf], rank: u32) -> Matched {
    let natoms = dict.len() / ntr;
    let nvox = signals.len() / ntr;
    let d = upload(m, dict);
    let x = upload(m, signals);
    let p = upload(m, params);
    let index = m.alloc(nvox as u64 * 4, DEVICE);
    let score = m.alloc(nvox as u64 * 4, DEVICE);
    let pd = m.alloc(nvox as u64 * 8, DEVICE);
    let op = m.alloc(nvox as u64 * 16, DEVICE);
    let outs = KmmMatchOutputs { index, score, pd, params: op };
    ok(kmm_qmri_match(m.0, d, ntr as u64, natoms as u64, 0, x, nvox as u64, rank, p, &outs, 0));
    m.sync();
    let r = Matched {
        index: download(m, index, nvox),
        score: download(m, score, nvox),
        pd: download(m, pd, nvox),
        params: download(m, op, nvox),
    };
    for b in [d, x, p, index, score, pd, op] {
        m.free(b);
    }
    r
}

/// ||a - b|| / ||b|| over one atom's signal.
pub fn rel_err(a: &[Cf], b: &[Cf]) -> f64 {
    let mut num = 0.0;
    let mut den = 0.0;
    for (x, y) in a.iter().zip(b) {
        num += ((x[0] - y[0]) as f64).powi(2) + ((x[1] - y[1]) as f64).powi(2);
        den += (y[0] as f64).powi(2) + (y[1] as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// A T1 x T2 grid (T2 < T1), B1 = 1, B0 = 0.
pub fn grid(n1: usize, n2: usize) -> Vec<[f32; 4]> {
    let mut v = Vec::new();
    for i in 0..n1 {
        let t1 = 0.1 * 1.25f32.powi(i as i32);
        for j in 0..n2 {
            let t2 = 0.01 * 1.3f32.powi(j as i32);
            if t2 < t1 {
                v.push([t1, t2, 1.0, 0.0]);
            }
        }
    }
    v
}
