//! Fragmentation of trace R across suballocators, chunk sizes, compaction ratios and trace seeds
//! (host backend; the figure is pure bookkeeping, so it is the same on a GPU). Each line is one
//! run of 100,000 operations: peak reserved over peak in use, and what compaction moved.
//! `frag_sweep SUBALLOCATOR CHUNK_MIB RATIO_PCT SEED` makes one run.
use kmm::ffi::buffer::*;
use kmm::ffi::manager::*;
use kmm::ffi::types::*;

fn run(suballocator: u32, chunk_mib: u64, ratio_pct: u32, seed: u64) -> KmmMemoryStats {
    let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
    kmm_config_default(&mut c);
    c.backend = KmmBackend::KMM_BACKEND_HOST as u32;
    c.suballocator = suballocator;
    c.chunk_size = chunk_mib << 20;
    c.compaction_ratio_pct = ratio_pct;
    let mut m = 0;
    assert_eq!(kmm_manager_create(&c, &mut m), kmm::KmmStatus::KMM_OK);
    let mut x: u64 = seed | 1;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (lmin, lmax) = ((256f64).ln(), ((4u64 << 20) as f64).ln());
    let mut live: Vec<u64> = Vec::new();
    for _ in 0..100_000 {
        let r = rnd();
        if live.is_empty() || (live.len() < 1000 && r & 1 == 0) {
            let u = (rnd() >> 11) as f64 / (1u64 << 53) as f64;
            let mut b = 0;
            assert_eq!(kmm_buffer_alloc(m, (lmin + u * (lmax - lmin)).exp() as u64, 0, &mut b), kmm::KmmStatus::KMM_OK);
            live.push(b);
        } else {
            let i = (rnd() % live.len() as u64) as usize;
            kmm_buffer_free(m, live.swap_remove(i), 0);
        }
    }
    let mut s = KmmMemoryStats::default();
    kmm_manager_stats(m, 0, &mut s);
    kmm_manager_destroy(m, 0);
    s
}

fn main() {
    // `frag_sweep SUBALLOCATOR CHUNK_MIB RATIO_PCT SEED`: that one run.
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    if let [sub, chunk_mib, ratio, seed] = args[..] {
        let s = run(sub as u32, chunk_mib, ratio as u32, seed);
        println!("{:.3} {} compactions", s.peak_reserved as f64 / s.peak_in_use as f64, s.compactions);
        return;
    }
    println!("| suballocator | chunk | compaction ratio | seed | peak reserved / peak in use | compactions | MiB moved |");
    println!("|---|---|---|---|---|---|---|");
    for (sub, name) in [(0u32, "binned"), (1, "heap")] {
        for chunk_mib in [4u64, 8, 16, 32] {
            for ratio in [0u32, 105, 108] {
                for seed in [42u64, 7, 99] {
                    let s = run(sub, chunk_mib, ratio, seed);
                    println!(
                        "| {name} | {chunk_mib} MiB | {} | {seed} | {:.3} ({} / {}) | {} | {:.1} |",
                        if ratio == 0 { "off".to_string() } else { format!("{ratio}%") },
                        s.peak_reserved as f64 / s.peak_in_use as f64,
                        s.peak_reserved,
                        s.peak_in_use,
                        s.compactions,
                        s.relocated_bytes as f64 / (1u64 << 20) as f64
                    );
                }
            }
        }
    }
}
