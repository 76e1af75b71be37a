//! Spill to host on a GPU: a live set three times the hard limit, touched in random order,
//! against the same workload with spill off and against the pinned-copy rate of the same run.
//!
//! Then MRF matching of a dictionary twice a hard limit (in blocks of 32,768 atoms, each its own
//! buffer; 32 blocks at least), against the same matching on a manager where it fits.
//!
//! `spill [--hard-limit-gib N] [--live-gib N] [--buffer-mib N] [--mrf-limit-gib N] [--voxels N]
//! [--host]` (defaults 8, 24, 256, 4, 16384; `--host` runs the host backend with sizes in MiB
//! instead of GiB, for a quick look). Prints the rows of bench/results/spill.md.

#[path = "../shared.rs"]
#[allow(dead_code)]
mod shared;
use kmm::ffi::buffer::*;
use kmm::ffi::copy::*;
use kmm::ffi::manager::*;
use kmm::ffi::qmri::*;
use kmm::ffi::types::*;
use kmm::KmmStatus;
use shared::{atoms, fisp_seq, ok, DEVICE};
use std::time::Instant;

const PINNED: u32 = KmmMemoryKind::KMM_MEMORY_PINNED as u32;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn manager(backend: u32, hard_limit: u64, spill_limit: u64) -> KmmManager {
    let mut c = unsafe { std::mem::zeroed::<KmmConfig>() };
    ok(kmm_config_default(&mut c));
    c.backend = backend;
    c.hard_limit = hard_limit;
    c.spill_limit = spill_limit;
    let mut m = 0;
    ok(kmm_manager_create(&c, &mut m));
    m
}

fn device_stats(m: KmmManager) -> KmmMemoryStats {
    let mut s = KmmMemoryStats::default();
    ok(kmm_manager_stats(m, DEVICE, &mut s));
    s
}

/// Fills buffer `b` (of `bytes`) with the 4-byte word `v`.
fn fill(m: KmmManager, b: u64, bytes: u64, v: u32) -> KmmStatus {
    kmm_fill(m, b, 0, bytes, (&v as *const u32).cast(), 4)
}

fn main() {
    let host = std::env::args().any(|a| a == "--host");
    let unit: u64 = if host { 1 << 20 } else { 1 << 30 };
    let backend = if host { KmmBackend::KMM_BACKEND_HOST } else { KmmBackend::KMM_BACKEND_CUDA } as u32;
    let hard_limit = arg("--hard-limit-gib", 8) * unit;
    let live = arg("--live-gib", 24) * unit;
    let buffer = arg("--buffer-mib", 256) << 20 >> if host { 10 } else { 0 };
    let n = (live / buffer) as usize;
    println!("| measure | figure | target |\n|---|---|---|");

    // The pinned-copy rate of this machine, through Kmm's own pinned buffers.
    let m = manager(backend, 0, 0);
    let (mut d, mut p, mut pp) = (0, 0, 0);
    ok(kmm_buffer_alloc(m, buffer, DEVICE, &mut d));
    ok(kmm_buffer_alloc(m, buffer, PINNED, &mut p));
    ok(kmm_buffer_map(m, p, &mut pp));
    let best = |f: &dyn Fn()| (0..4).map(|_| { let t = Instant::now(); f(); t.elapsed().as_secs_f64() }).skip(1).fold(f64::MAX, f64::min);
    let d2h = best(&|| ok(kmm_copy_to_host(m, pp as *mut _, d, 0, buffer)));
    let h2d = best(&|| ok(kmm_copy_to_device(m, d, 0, pp as *const _, buffer)));
    // Spill moves a buffer out and another in: the pinned rate over one copy each way.
    let pinned_gbps = 2.0 * buffer as f64 / (d2h + h2d) / 1e9;
    ok(kmm_buffer_unmap(m, p));
    ok(kmm_manager_destroy(m, 0));
    println!("| pinned copies (one each way, {} MiB, best of 3) | {pinned_gbps:.2} GB/s | reference |", buffer >> 20);

    // Spill off: the live set cannot be allocated.
    let m = manager(backend, hard_limit, 0);
    let mut held = Vec::new();
    let mut failure = None;
    for _ in 0..n {
        let mut b = 0;
        let s = kmm_buffer_alloc(m, buffer, DEVICE, &mut b);
        if s != KmmStatus::KMM_OK {
            failure = Some(s);
            break;
        }
        held.push(b);
    }
    let off = match failure {
        Some(s) => format!("{s:?} after {} of {n} buffers ({:.1} GiB)", held.len(), (held.len() as u64 * buffer) as f64 / (1u64 << 30) as f64),
        None => format!("all {n} buffers allocated: NOT out of memory"),
    };
    ok(kmm_manager_destroy(m, 0));
    println!("| spill off (spill_limit = 0): allocating the live set | {off} | out of memory |");

    // Spill on: allocate and fill the live set, then touch it in random order.
    let m = manager(backend, hard_limit, live + unit);
    let t = Instant::now();
    let bufs: Vec<u64> = (0..n)
        .map(|i| {
            let mut b = 0;
            ok(kmm_buffer_alloc(m, buffer, DEVICE, &mut b));
            ok(fill(m, b, buffer, i as u32));
            b
        })
        .collect();
    ok(kmm_manager_synchronize(m));
    let fill_secs = t.elapsed().as_secs_f64();
    let before = device_stats(m);
    let mut rng = shared::Rng(12345);
    let touches = 2 * n;
    let mut last = vec![None; n];
    let t = Instant::now();
    for k in 0..touches {
        let i = ((rng.unit() as f64 * n as f64) as usize).min(n - 1);
        // A use on the device: a fill of its first 4 KiB (restores it if spilled).
        let v = 0x8000_0000 | k as u32;
        ok(kmm_fill(m, bufs[i], 0, 4096, (&v as *const u32).cast(), 4));
        last[i] = Some(v);
    }
    ok(kmm_manager_synchronize(m));
    let touch_secs = t.elapsed().as_secs_f64();
    let after = device_stats(m);
    // Every buffer holds its fill and its last touch.
    let mut bad = 0;
    for (i, &b) in bufs.iter().enumerate() {
        let (mut head, mut tail) = ([0u32; 1024], [0u32; 1024]);
        ok(kmm_copy_to_host(m, head.as_mut_ptr().cast(), b, 0, 4096));
        ok(kmm_copy_to_host(m, tail.as_mut_ptr().cast(), b, buffer - 4096, 4096));
        let want = last[i].unwrap_or(i as u32);
        bad += usize::from(head.iter().any(|&w| w != want) || tail.iter().any(|&w| w != i as u32));
    }
    let moved = (after.spilled_out_bytes - before.spilled_out_bytes) + (after.restored_in_bytes - before.restored_in_bytes);
    let rate = moved as f64 / touch_secs / 1e9;
    println!(
        "| spill on: {n} buffers of {} MiB ({:.0} GiB) under a {:.0} GiB hard limit, filled | {fill_secs:.2} s; {} spills, peak on host {:.1} GiB | completes |",
        buffer >> 20,
        live as f64 / unit as f64,
        hard_limit as f64 / unit as f64,
        before.spills,
        before.peak_spilled_bytes as f64 / (1u64 << 30) as f64
    );
    println!(
        "| spill on: {touches} touches in random order | {touch_secs:.2} s; {} spills, {} restores, {:.1} GiB moved; {bad} buffers wrong | completes, 0 wrong |",
        after.spills - before.spills,
        after.restores - before.restores,
        moved as f64 / (1u64 << 30) as f64
    );
    println!(
        "| spilled traffic rate (bytes moved / touch time) | {rate:.2} GB/s = {:.2}x the pinned-copy rate | >= 0.8x |",
        rate / pinned_gbps
    );
    println!("| spill time the manager counted | {:.2} s of {touch_secs:.2} s | |", (after.spill_time_ns - before.spill_time_ns) as f64 * 1e-9);
    for b in bufs {
        ok(kmm_buffer_free(m, b, 0));
    }
    ok(kmm_manager_destroy(m, 0));

    mrf(backend, arg("--mrf-limit-gib", if host { 32 } else { 4 }) * unit, arg("--voxels", if host { 256 } else { 16384 }) as usize, host);
}

/// One blocked dictionary on one manager: its blocks, parameters, signals and outputs.
struct Blocked {
    m: KmmManager,
    blocks: Vec<(u64, u64, u64)>, // (buffer, first atom, atoms)
    params: u64,
    signals: u64,
    outs: KmmMatchOutputs,
}

const NTR: u64 = 1000;
/// Atoms per block: at most this, and at least 32 blocks.
const BLOCK_ATOMS: u64 = 32_768;

impl Blocked {
    fn new(backend: u32, hard_limit: u64, spill_limit: u64, natoms: u64, nvox: usize) -> Blocked {
        let m = manager(backend, hard_limit, spill_limit);
        let alloc = |bytes: u64| {
            let mut b = 0;
            ok(kmm_buffer_alloc(m, bytes, DEVICE, &mut b));
            b
        };
        let seq = fisp_seq(NTR as usize, 16);
        let raw = KmmFispSequence::view(&seq);
        let at = atoms(natoms as usize, 5);
        let params = alloc(natoms * 16);
        ok(kmm_copy_to_device(m, params, 0, at.as_ptr().cast(), natoms * 16));
        // Signals: noiseless atoms spread over the dictionary.
        let sig_atoms: Vec<_> = (0..nvox).map(|i| at[(i as u64 * 7919 % natoms) as usize]).collect();
        let sp = alloc(nvox as u64 * 16);
        ok(kmm_copy_to_device(m, sp, 0, sig_atoms.as_ptr().cast(), nvox as u64 * 16));
        let signals = alloc(nvox as u64 * NTR * 8);
        ok(kmm_qmri_simulate_fisp(m, &raw, sp, 0, nvox as u64, signals, KMM_QMRI_SKIP_CHECKS));
        ok(kmm_buffer_free(m, sp, 0));
        let per = BLOCK_ATOMS.min(natoms / 32).max(1);
        let blocks = (0..natoms.div_ceil(per))
            .map(|k| {
                let (first, n) = (k * per, per.min(natoms - k * per));
                let b = alloc(n * NTR * 8);
                ok(kmm_qmri_simulate_fisp(m, &raw, params, first, n, b, KMM_QMRI_SKIP_CHECKS));
                (b, first, n)
            })
            .collect();
        let outs = KmmMatchOutputs { index: alloc(nvox as u64 * 4), score: alloc(nvox as u64 * 4), pd: 0, params: 0 };
        ok(kmm_manager_synchronize(m));
        Blocked { m, blocks, params, signals, outs }
    }

    /// One match of every block (keeping the best atom per voxel); seconds, waited for.
    fn match_all(&self, nvox: usize) -> f64 {
        ok(kmm_manager_synchronize(self.m));
        let t = Instant::now();
        for (k, &(b, first, n)) in self.blocks.iter().enumerate() {
            let flags = if k > 0 { KMM_MATCH_ACCUMULATE } else { 0 };
            ok(kmm_qmri_match(self.m, b, NTR, n, first, self.signals, nvox as u64, 0, self.params, &self.outs, flags));
        }
        ok(kmm_manager_synchronize(self.m));
        t.elapsed().as_secs_f64()
    }

    fn index(&self, nvox: usize) -> Vec<i32> {
        let mut v = vec![0i32; nvox];
        ok(kmm_copy_to_host(self.m, v.as_mut_ptr().cast(), self.outs.index, 0, nvox as u64 * 4));
        v
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        ok(kmm_manager_destroy(self.m, 0));
    }
}

/// MRF matching of a dictionary twice `hard_limit` through spill, and the same where it fits.
fn mrf(backend: u32, hard_limit: u64, nvox: usize, host: bool) {
    let natoms = 2 * hard_limit / (NTR * 8);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let (fits_t, fits_index) = {
        let fits = Blocked::new(backend, 0, 0, natoms, nvox);
        fits.match_all(nvox);
        let t = (0..2).map(|_| fits.match_all(nvox)).fold(f64::MAX, f64::min);
        (t, fits.index(nvox))
    };
    let spilled = Blocked::new(backend, hard_limit, 2 * hard_limit + (1 << 30), natoms, nvox);
    spilled.match_all(nvox);
    let before = device_stats(spilled.m);
    let t = (0..2).map(|_| spilled.match_all(nvox)).fold(f64::MAX, f64::min);
    let after = device_stats(spilled.m);
    let same = spilled.index(nvox) == fits_index;
    let unit = if host { "MiB-scaled" } else { "GiB" };
    println!(
        "| MRF match, {natoms} atoms x {NTR} TRs ({:.1} {unit} dictionary in {} blocks) vs {nvox} voxels: fits (no limit) | {fits_t:.3} s | reference |",
        gib(natoms * NTR * 8) * if host { 1024.0 } else { 1.0 },
        spilled.blocks.len()
    );
    println!(
        "| the same under a hard limit of half the dictionary, through spill | {t:.3} s = {:.2}x; {} restores, {:.1} GiB moved in 2 matches; maps {} | <= 1.5x, same maps |",
        t / fits_t,
        after.restores - before.restores,
        gib((after.restored_in_bytes - before.restored_in_bytes) + (after.spilled_out_bytes - before.spilled_out_bytes)),
        if same { "identical" } else { "DIFFER" }
    );
}
