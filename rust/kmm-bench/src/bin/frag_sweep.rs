//! Fragmentation of trace R across chunk sizes and suballocators (host backend; the figure is
//! pure bookkeeping, so it is the same on a GPU).
use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::types::*;

fn main() {
    for sub in [0u32, 1] {
        for chunk_mib in [2u64, 4, 8, 16, 32, 64] {
            let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
            kmm_config_default(&mut c);
            c.backend = 1;
            c.suballocator = sub;
            c.chunk_size = chunk_mib << 20;
            let mut m = 0;
            kmm_manager_create(&c, &mut m);
            let mut x: u64 = 42 | 1;
            let mut rnd = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let (lmin, lmax) = ((256f64).ln(), ((4u64 << 20) as f64).ln());
            let mut live: Vec<u64> = Vec::new();
            for _ in 0..100_000 {
                let r = rnd();
                if live.is_empty() || (live.len() < 1000 && r & 1 == 0) {
                    let u = (rnd() >> 11) as f64 / (1u64 << 53) as f64;
                    let mut b = 0;
                    kmm_buffer_alloc(m, (lmin + u * (lmax - lmin)).exp() as u64, 0, &mut b);
                    live.push(b);
                } else {
                    let i = (rnd() % live.len() as u64) as usize;
                    kmm_buffer_free(m, live.swap_remove(i), 0);
                }
            }
            let mut s = KmmMemoryStats::default();
            kmm_manager_stats(m, 0, &mut s);
            println!("sub {sub} chunk {chunk_mib:>3} MiB: peak reserved {:>10} peak in use {:>10} ratio {:.3}", s.peak_reserved, s.peak_in_use, s.peak_reserved as f64 / s.peak_in_use as f64);
            kmm_manager_destroy(m, 0);
        }
    }
}
