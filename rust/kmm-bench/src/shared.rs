//! What `bin/qmri.rs` and `bin/devices.rs` share (included with `#[path]`): the status check
//! and the qMRI benchmark's inputs (random atoms over the tissue range, the FISP sequence).

use kmm::ffi::types::KmmMemoryKind;
use kmm::qmri::{Atom, Fisp};
use kmm::KmmStatus;

pub const DEVICE: u32 = KmmMemoryKind::KMM_MEMORY_DEVICE as u32;

/// Panics with the library's message unless `s` is `KMM_OK`.
pub fn ok(s: KmmStatus) {
    if s != KmmStatus::KMM_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(kmm::ffi::kmm_last_error()) };
        panic!("{s:?}: {}", msg.to_string_lossy());
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub fn atoms(n: usize, seed: u64) -> Vec<Atom> {
    let mut r = Rng(seed | 1);
    (0..n)
        .map(|_| {
            let t1 = 0.1 + 4.9 * r.unit();
            let t2 = (0.005 + 0.6 * r.unit()).min(t1);
            Atom { t1, t2, b1: 0.7 + 0.6 * r.unit(), b0: -30.0 + 60.0 * r.unit() }
        })
        .collect()
}

pub fn fisp_seq(ntr: usize, ns: u32) -> Fisp {
    let flip: Vec<f32> = (0..ntr).map(|n| (n as f32 / 160.0 * std::f32::consts::PI).sin().abs() * 1.05 + 0.02).collect();
    Fisp { phase: vec![0.0; ntr], flip, tr: 0.0087, te: 0.0035, ti: 0.0204, max_state: ns, profile: vec![] }
}
